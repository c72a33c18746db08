"""`toolshim-demo`, the installed console script, run the way a newcomer runs it.

The environment has no API key, base URLs (OpenAI's and Anthropic's) and proxy variables that
point at a dead local port, and no NO_PROXY: were the demo to reach for a backend or the network, or let the environment
reroute the SDK, it would fail.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness import PROJECT_ROOT
from toolshim.demo import DEFAULT_FLOWS

DEMO_SCRIPT = Path(sys.executable).parent / "toolshim-demo"
DEAD_ADDRESS = "http://127.0.0.1:9"
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
PATTERN_PREFIX = "re:"  # as in flows/*.expected.json: a minted id, given as a regular expression
SDK_GOT = re.compile(r"the (?:OpenAI|Anthropic) SDK got, through toolshim:")


def run_demo(*arguments: str) -> subprocess.CompletedProcess[str]:
    assert DEMO_SCRIPT.is_file(), f"{DEMO_SCRIPT} is not installed: pip install -e '.[test]'"
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OPENAI_", "ANTHROPIC_")) and key.upper() not in {*PROXY_VARIABLES, "NO_PROXY"}
    }
    environment["OPENAI_BASE_URL"] = f"{DEAD_ADDRESS}/v1"
    environment["ANTHROPIC_BASE_URL"] = DEAD_ADDRESS
    for name in PROXY_VARIABLES:
        environment[name] = environment[name.lower()] = DEAD_ADDRESS
    return subprocess.run(
        [str(DEMO_SCRIPT), *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
        stdin=subprocess.DEVNULL,
    )


def sections(output: str) -> list[str]:
    """The demo's output per flow: from its `[n/N]` heading to the next."""
    return re.split(r"^\[\d+/\d+\] ", output, flags=re.MULTILINE)[1:]


def squeezed(text: str) -> str:
    """Whitespace runs as one space: the demo wraps long lines."""
    return " ".join(text.split())


def expected_call_lines(name: str) -> list[str]:
    """Patterns of the lines that show the calls `flows/<name>.expected.json` expects."""
    expected: dict[str, Any] = json.loads((PROJECT_ROOT / "flows" / f"{name}.expected.json").read_text())
    if "calls" in expected:  # Responses API: calls are function_call items among the output items
        item_indexes = [index for index, kind in enumerate(expected["items"]) if kind == "function_call"]
        shown = [(f"output[{index}] function_call", "call_id", call["call_id"], call) for index, call in zip(item_indexes, expected["calls"])]
    elif isinstance(expected["content"], list):  # Messages API: calls are tool_use blocks among the content blocks
        shown = [
            (f"content[{index}] tool_use", "id", block["id"], {"name": block["name"], "input": json.dumps(block["input"], separators=(",", ":"), ensure_ascii=False)})
            for index, block in enumerate(expected["content"])
            if block["type"] == "tool_use"
        ]
    else:
        shown = [(f"tool_calls[{index}]", "id", call["id"], call) for index, call in enumerate(expected["tool_calls"])]
    patterns = []
    for label, id_key, call_id, call in shown:
        id_pattern = call_id.removeprefix(PATTERN_PREFIX) if call_id.startswith(PATTERN_PREFIX) else re.escape(call_id)
        key = "input" if "input" in call else "arguments"
        patterns.append(f"{re.escape(label)}: {re.escape(call['name'])}, {id_key} {id_pattern} {key} {re.escape(squeezed(call[key]))}")
    assert patterns, f"{name}.expected.json expects no call"
    return patterns


def test_demo_shows_the_leaked_markup_and_the_calls_the_sdk_got():
    result = run_demo()

    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    flows = sections(result.stdout)
    assert len(flows) == len(DEFAULT_FLOWS)
    for name, section in zip(DEFAULT_FLOWS, flows):
        upstream_sent, sdk_got = SDK_GOT.split(section)
        assert name in upstream_sent
        for pattern in expected_call_lines(name):
            assert re.search(pattern, squeezed(sdk_got)), f"{name}: no {pattern!r} in\n{sdk_got}"
        assert "=> repaired" in sdk_got
    kimi_sent, kimi_got = flows[0].split("the OpenAI SDK got, through toolshim:")
    assert "<|tool_calls_section_begin|>" in kimi_sent and "functions.bash:15" in kimi_sent
    assert "<|tool" not in kimi_got and "finish_reason: tool_calls" in kimi_got
    messages = [section for name, section in zip(DEFAULT_FLOWS, flows) if name.startswith("messages_")]
    assert len(messages) == 1, "one Anthropic Messages flow in the tour"
    minimax_sent, minimax_got = messages[0].split("the Anthropic SDK got, through toolshim:")
    assert "Anthropic Messages API, streamed" in minimax_sent
    assert "<minimax:tool_call>" in minimax_sent and "stop_reason: end_turn" in minimax_sent
    assert "content[0] text: \"I'll get the weekend forecast for Tokyo.\\n\"" in minimax_got
    assert "content[2] text: '\\nThen I will tell you whether to take an umbrella.'" in minimax_got
    assert "<minimax" not in minimax_got and "<invoke" not in minimax_got and "stop_reason: tool_use" in minimax_got
    assert "the Anthropic Python SDK" in result.stdout.split("\n[1/")[0]
    assert f"All {len(DEFAULT_FLOWS)} flows repaired" in result.stdout


def test_an_unknown_flow_name_is_a_clear_error():
    result = run_demo("kimi_seed_000_reasonin")

    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "no flow named 'kimi_seed_000_reasonin'" in result.stderr
    assert "did you mean kimi_seed_000_reasoning?" in result.stderr
    assert result.stdout == ""


class NoProxy:
    """Stands in for the demo's mitmdump: nothing is started."""

    def __init__(self, *arguments: Any) -> None:
        pass

    def __enter__(self) -> NoProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass


def test_without_the_anthropic_sdk_the_tour_leaves_its_messages_flow_out(monkeypatch, capsys):
    """`.[demo]` installs the OpenAI SDK only: the tour goes on without the Messages flow, and
    naming a Messages flow is a clear error."""
    from toolshim import demo

    find_spec = demo.importlib.util.find_spec
    monkeypatch.setattr(demo.importlib.util, "find_spec", lambda name, *rest: None if name == "anthropic" else find_spec(name, *rest))
    monkeypatch.setattr(demo, "ReplayProxy", NoProxy)
    monkeypatch.setattr(demo, "find_mitmdump", lambda: "mitmdump")
    shown: list[str] = []
    monkeypatch.setattr(demo, "run_demo", lambda flows, proxy: shown.extend(flow.name for flow in flows) or 0)

    assert demo.main([]) == 0
    assert shown == [name for name in DEFAULT_FLOWS if not name.startswith("messages_")] and len(shown) == len(DEFAULT_FLOWS) - 1
    assert "leaves out its Messages API flow (pip install anthropic)" in capsys.readouterr().err

    shown.clear()
    assert demo.main(["messages_minimax_invoke_in_text"]) == 2
    assert shown == []
    assert "needs the Anthropic Python SDK for Messages API flows" in capsys.readouterr().err
