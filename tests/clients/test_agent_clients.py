"""Real agent clients through a real mitmdump with toolshim, against a thinking-mode upstream.

Each client runs a three-turn tool loop (tests/clients/thinking_backend.py): a call leaked as Kimi
markup into the reasoning, a call leaked as a Hermes `<tool_call>` block into the content, then
the answer. Through toolshim both become real tool calls, the client runs them, and toolshim's
request repairs give the upstream what Moonshot and DeepSeek insist on: the reasoning the client
was sent with each call, and (Kimi) history ids in the form `functions.NAME:IDX`.

The same loop with `toolshim_request_repairs=off` must fail on the upstream's 400: that is what
shows the repair works, and which 400 it is tells what the client itself keeps.

The clients (versions pinned in requirements.txt and node/package.json):
    codex        Codex CLI, `codex exec`, Responses API, its own `exec_command` tool
    openai-node  the `openai` npm package, a streamed loop as users write it
    vercel-ai    the Vercel AI SDK (`ai` + `@ai-sdk/openai-compatible`), streamText (streamed)
                 and generateText (JSON bodies), tools with `execute` and a step limit
    agents-sdk   the OpenAI Agents SDK, OpenAIChatCompletionsModel, Runner.run_streamed
    langchain    langchain-openai's ChatOpenAI.bind_tools, a manual invoke loop (JSON bodies)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from client_runner import Client, ClientRun, run_client
from harness import Mitmdump, ScriptedUpstream
from thinking_backend import (
    DEEPSEEK_MISSING,
    FINAL_ANSWER,
    KIMI_ID,
    REASONING,
    STEP_OUTPUTS,
    Exchange,
    ThinkingBackend,
    history_call_ids,
    reasoning_item_text,
)

CODEX = Client("codex", "codex")
OPENAI_NODE = Client("openai-node", "node", "openai_node_loop.mjs")
VERCEL_STREAM = Client("vercel-ai-stream", "node", "vercel_ai_loop.mjs", (("TOOLSHIM_MODE", "stream"),))
VERCEL_GENERATE = Client("vercel-ai-generate", "node", "vercel_ai_loop.mjs", (("TOOLSHIM_MODE", "generate"),), streams=False)
AGENTS_SDK = Client("agents-sdk", "python", "agents_sdk_loop.py")
LANGCHAIN = Client("langchain", "python", "langchain_loop.py", streams=False)

# The leaked markup is Kimi's and Hermes's whatever the model's name, so both dialects are named
# (by model name toolshim would read only Kimi's on kimi-…, only DeepSeek's on deepseek-…).
PROXY_ARGS = ["--set", "toolshim_dialects=kimi,hermes"]
REPAIRS_OFF = ["--set", "toolshim_request_repairs=off"]


@dataclass(frozen=True)
class Case:
    client: Client
    flavour: str  # "moonshot" | "deepseek"
    # Observed: does the client send the reasoning it was given back by itself? (Without
    # toolshim, a client that keeps it fails only on the ids; one that drops it, on the reasoning.)
    keeps_reasoning: bool

    @property
    def id(self) -> str:
        return f"{self.client}-{self.flavour}"

    def model(self, repairs: str) -> str:
        prefix = "kimi-k2-thinking" if self.flavour == "moonshot" else "deepseek-v4"
        return f"{prefix}-{self.client}-{repairs}"


CASES = [
    Case(CODEX, "moonshot", keeps_reasoning=True),
    Case(OPENAI_NODE, "moonshot", keeps_reasoning=False),
    Case(OPENAI_NODE, "deepseek", keeps_reasoning=False),
    Case(VERCEL_STREAM, "moonshot", keeps_reasoning=True),
    Case(VERCEL_STREAM, "deepseek", keeps_reasoning=True),
    Case(VERCEL_GENERATE, "moonshot", keeps_reasoning=True),
    Case(AGENTS_SDK, "moonshot", keeps_reasoning=False),
    Case(AGENTS_SDK, "deepseek", keeps_reasoning=True),  # the SDK replays it for "deepseek" models
    Case(LANGCHAIN, "moonshot", keeps_reasoning=False),
    Case(LANGCHAIN, "deepseek", keeps_reasoning=False),
]
# Without repairs a client that keeps its reasoning passes DeepSeek's check (which has no id
# rule), so the "off" runs that must fail on DeepSeek are those of clients that drop it.
OFF_CASES = [c for c in CASES if c.flavour == "moonshot" or not c.keeps_reasoning]
KEEPS_ON_DEEPSEEK = [c for c in CASES if c.flavour == "deepseek" and c.keeps_reasoning]


@pytest.fixture
def installs(request: pytest.FixtureRequest) -> Path | None:
    """Installs what the case's client needs: node/'s modules (Codex is one of them), or the
    clients' venv, whose interpreter it returns."""
    case: Case = request.node.callspec.params["case"]
    if case.client.kind == "python":
        return request.getfixturevalue("client_python")
    request.getfixturevalue("node_clients")
    return None


def run_case(
    case: Case,
    repairs: str,
    upstream: ScriptedUpstream,
    client_env: dict[str, str],
    python: Path | None,
    tmp_path: Path,
) -> tuple[ClientRun, ThinkingBackend, Mitmdump]:
    model = case.model(repairs)
    backend = ThinkingBackend(model).register(upstream)
    args = PROXY_ARGS + (REPAIRS_OFF if repairs == "off" else [])
    try:
        with Mitmdump(upstream.url, extra_args=args) as proxy:
            run = run_client(
                case.client, base_url=proxy.base_url, model=model, env=client_env, workdir=tmp_path / "work",
                python=python,
            )
    finally:
        upstream.remove(model)
    return run, backend, proxy


def explain(run: ClientRun, backend: ThinkingBackend, proxy: Mitmdump) -> str:
    seen = [f"turn {e.turn} {e.api} stream={e.stream} -> {e.status} {e.error or ''}" for e in backend.exchanges]
    return (
        f"{run.describe()}\n--- upstream saw\n" + "\n".join(seen) + f"\n--- mitmdump\n{proxy.log_text()[-4000:]}"
    )


def last_request(backend: ThinkingBackend) -> Exchange:
    answered = [e for e in backend.exchanges if e.status == 200 and e.turn == 3]
    assert answered, "the upstream never answered a turn-3 request"
    return answered[-1]


def reasoning_before_calls(exchange: Exchange) -> list[str]:
    """The reasoning the upstream got with each tool-calling assistant turn, in order: Chat's
    `reasoning_content`, or the text of the Responses `reasoning` item before each run of
    `function_call` items."""
    found: list[str] = []
    if exchange.api == "chat":
        for message in exchange.history:
            if message.get("role") == "assistant" and message.get("tool_calls"):
                found.append(str(message.get("reasoning_content") or ""))
        return found
    reasoning, previous = "", None
    for item in exchange.history:
        kind = item.get("type", "message")
        if kind == "reasoning":
            reasoning = reasoning_item_text(item)
        elif kind == "function_call" and previous != "function_call":
            found.append(reasoning)
            reasoning = ""
        elif kind == "function_call_output" or item.get("role") == "user":
            reasoning = ""
        previous = kind
    return found


def tool_results(exchange: Exchange) -> list[str]:
    """The tool outputs of a request's history, Chat or Responses."""
    out = []
    for item in exchange.history:
        if item.get("role") == "tool":
            content = item.get("content")
            out.append(content if isinstance(content, str) else str(content))
        elif item.get("type") == "function_call_output":
            out.append(str(item.get("output")))
    return out


def assert_loop_completed(case: Case, run: ClientRun, backend: ThinkingBackend, why: str) -> None:
    assert run.returncode == 0, why
    assert run.ran_both_steps(), why
    assert run.final is not None and FINAL_ANSWER in run.final, why
    assert backend.errors == [], why
    assert [e.turn for e in backend.exchanges] == [1, 2, 3], why
    assert all(e.stream == case.client.streams for e in backend.exchanges), why

    # What the upstream saw on the last turn: both tool results, the reasoning of both
    # tool-calling turns (what the client was sent, markup removed), and Kimi-form ids.
    final = last_request(backend)
    results = tool_results(final)
    assert len(results) == 2 and all(m in r for m, r in zip(STEP_OUTPUTS, results)), why
    reasoning = reasoning_before_calls(final)
    assert len(reasoning) == 2, why
    assert all(REASONING[i] in reasoning[i] and "<|" not in reasoning[i] for i in range(2)), reasoning
    ids = history_call_ids(final)
    assert len(ids) == 4, ids
    if case.flavour == "moonshot":
        assert all(KIMI_ID.match(i) for i in ids), ids
    else:
        assistants = [m for m in final.history if m.get("role") == "assistant"]
        assert assistants and all(m.get("reasoning_content") for m in assistants), why


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_tool_loop_completes_through_toolshim(case, installs, upstream, client_env, tmp_path):
    run, backend, proxy = run_case(case, "on", upstream, client_env, installs, tmp_path)
    assert_loop_completed(case, run, backend, explain(run, backend, proxy))


@pytest.mark.parametrize("case", KEEPS_ON_DEEPSEEK, ids=lambda c: c.id)
def test_client_that_keeps_reasoning_needs_no_repair_on_deepseek(case, installs, upstream, client_env, tmp_path):
    """The control: DeepSeek's rule has no ids in it, so a client that sends its reasoning back by
    itself completes the loop with the repairs off (the upstream's checks refuse only what they
    should)."""
    run, backend, proxy = run_case(case, "off", upstream, client_env, installs, tmp_path)
    assert_loop_completed(case, run, backend, explain(run, backend, proxy))


@pytest.mark.parametrize("case", OFF_CASES, ids=lambda c: c.id)
def test_tool_loop_fails_without_request_repairs(case, installs, upstream, client_env, tmp_path):
    run, backend, proxy = run_case(case, "off", upstream, client_env, installs, tmp_path)
    why = explain(run, backend, proxy)

    assert run.returncode != 0, why
    assert run.final is None or FINAL_ANSWER not in run.final, why
    refused = [e for e in backend.exchanges if e.status == 400]
    assert len(refused) == 1 and backend.exchanges[-1] is refused[0], why
    error = refused[0].error
    assert error is not None
    if case.keeps_reasoning:
        # The reasoning came back by itself; the Hermes call's minted id did not become Kimi's.
        assert refused[0].turn == 3, why
        assert re.fullmatch(r"tool call id 'call_\w+' at (messages|input)\[\d+\] is not of the form functions\.NAME:IDX", error), why
    elif case.flavour == "moonshot":
        # The client dropped the reasoning of its first tool-calling turn.
        assert refused[0].turn == 2, why
        assert re.fullmatch(r"thinking is enabled but reasoning_content is missing in assistant tool call message at index \d+", error), why
    else:
        assert refused[0].turn == 2, why
        assert error == DEEPSEEK_MISSING, why
    # The client failed on that 400 and said so.
    assert any(error in said for said in run.errors), why
