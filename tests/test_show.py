"""`python -m toolshim.show`: the README's first command ends with it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mitmproxy import io as mio
from mitmproxy.test import tflow

from harness import PROJECT_ROOT, read_flows, run_offline
from responses import responses_events, responses_sse

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]


def show(path: Path) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "toolshim.show", str(path)], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_show_prints_a_repaired_chat_flow_before_and_after(tmp_path):
    fixed = tmp_path / "fixed.flow"
    assert run_offline(PROJECT_ROOT / "flows" / "kimi_seed_000_reasoning.flow", fixed).returncode == 0
    out = show(fixed)
    before, after = out.split("client got:")
    assert "<|tool_calls_section_begin|>" in before and "finish_reason: stop" in before
    assert "tool_calls[0]: bash(" in after and "id=functions.bash:15" in after
    assert "tool_calls[1]: read_file(" in after and "finish_reason: tool_calls" in after
    assert "<|tool" not in after


def test_show_prints_the_output_items_of_a_responses_flow(tmp_path):
    flow = tflow.tflow(resp=True)
    flow.request.path = "/v1/responses"
    flow.request.method = "POST"
    flow.request.content = json.dumps({"model": "m", "input": "hi", "tools": TOOLS}).encode()
    flow.response.headers["content-type"] = "text/event-stream"
    flow.response.content = responses_sse(responses_events("m", ["Checking.", CALL], tools=TOOLS))
    src, fixed = tmp_path / "in.flow", tmp_path / "fixed.flow"
    with open(src, "wb") as f:
        mio.FlowWriter(f).add(flow)
    assert run_offline(src, fixed).returncode == 0
    before, after = show(fixed).split("client got:")
    assert "[0] message: 'Checking.<tool_call>" in before
    assert "[0] message: 'Checking.'" in after
    assert '[1] function_call: get_weather({"city":"Paris"})  call_id=call_' in after


def test_show_prints_the_content_blocks_of_a_messages_flow(tmp_path):
    fixed = tmp_path / "fixed.flow"
    assert run_offline(PROJECT_ROOT / "flows" / "messages_kimi_in_thinking_stream.flow", fixed).returncode == 0
    out = show(fixed)
    assert out.startswith("POST ") and "/anthropic/v1/messages -> 200" in out.splitlines()[0]
    before, after = out.split("client got:")
    assert before.split("\n")[2:5] == [
        "    [0] thinking: 'The user wants the files in src. I should run ls.<|tool_calls_section_begin|><|tool_call_begin|>"
        "functions.bash:0<|tool_call_argument_begin|>{\"command\": \"ls -la src\"}<|tool_call_end|><|tool_calls_section_end|>'"
        "  signature=''",  # upstream's block start carries an empty one
        "    [1] text: \"I'll list the files in src.\"",
        "    stop_reason: end_turn",
    ]
    assert after.split("\n")[1:] == [
        "    [0] thinking: 'The user wants the files in src. I should run ls.'  signature=''",
        '    [1] tool_use: bash({"command": "ls -la src"})  id=functions.bash:0',
        "    [2] text: \"I'll list the files in src.\"",
        "    stop_reason: tool_use",
        "",
    ]


def test_show_prints_a_messages_json_body_and_an_error_body(tmp_path):
    src, fixed = tmp_path / "in.flow", tmp_path / "fixed.flow"
    with open(src, "wb") as f:
        writer = mio.FlowWriter(f)
        for name in ("messages_kimi_non_streaming", "messages_error_response_529"):
            writer.add(read_flows(PROJECT_ROOT / "flows" / f"{name}.flow")[0])
    assert run_offline(src, fixed).returncode == 0
    kimi, error = show(fixed).split("POST ")[1:]
    before, after = kimi.split("client got:")
    assert "[0] text: 'I\\'ll check the disk usage. <|tool_calls_section_begin|>" in before and "stop_reason: end_turn" in before
    assert after.split("\n")[1:4] == [
        "    [0] text: \"I'll check the disk usage.\"",
        '    [1] tool_use: bash({"command":"df -h"})  id=functions.bash:0',
        "    stop_reason: tool_use",
    ]
    assert error.split("\n")[1:] == [
        "  body:",
        '    error: {"type":"overloaded_error","message":"Overloaded: <|tool_calls_section_begin|> was not expected here."}',
        "",
    ]
