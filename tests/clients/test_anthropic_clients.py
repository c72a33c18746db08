"""Real Anthropic-API clients through a real mitmdump with toolshim, against an upstream that
leaks its tool call as markup (tests/clients/anthropic_backend.py).

Each client runs a two-turn loop on `POST /v1/messages`, streamed: the upstream's first answer
holds a call of the client's own shell tool (`echo toolshim-ok-<random>`) leaked as markup, in
one of two ways:

    kimi      Kimi's special tokens at the end of a THINKING block (model `kimi-k2-…`)
    minimax   MiniMax's `<minimax:tool_call><invoke …>` inside a TEXT block (model `MiniMax-M2-…`)

Through toolshim the markup becomes a `tool_use` block, the client runs the command, sends its
tool_result, and gets the final answer, which quotes what the command printed. The same run with
mitmdump but without the toolshim script must not run anything: the client gets the markup as
thinking or text, ends quietly with it as its answer, and no tool_result ever reaches the
upstream.

The clients (versions pinned in node/package.json and requirements.txt):
    claude-code   Claude Code itself (`claude -p`, stream-json), its own Bash tool, offline
    anthropic-ts  the TypeScript SDK, `client.messages.stream(...)` and `finalMessage()` in a loop
    anthropic-py  the Python SDK, `client.messages.stream(...)` and `get_final_message()` in a
                  loop, in the clients' venv (the newest SDK; the project's venv holds 0.x)
"""

from __future__ import annotations

import json
import re
import secrets
from pathlib import Path

import pytest
from anthropic_backend import DONE, AnthropicBackend, block_text
from client_runner import Client, ClientRun, run_client
from harness import ADDON_SCRIPT, Mitmdump, ScriptedUpstream
from kimi import MARKERS as KIMI_MARKERS

CLAUDE_CODE = Client("claude-code", "claude")
ANTHROPIC_TS = Client("anthropic-ts", "node", "anthropic_sdk_loop.mjs")
ANTHROPIC_PY = Client("anthropic-py", "python", "anthropic_sdk_loop.py")
CLIENTS = [CLAUDE_CODE, ANTHROPIC_TS, ANTHROPIC_PY]
# The shell tool each client declares.
SHELL_TOOL = {CLAUDE_CODE: "Bash", ANTHROPIC_TS: "run_shell", ANTHROPIC_PY: "run_shell"}

LEAKS = ["kimi", "minimax"]
MODEL_PREFIX = {"kimi": "kimi-k2", "minimax": "MiniMax-M2"}  # toolshim reads the dialect from it
MARKUP_START = {"kimi": KIMI_MARKERS[0], "minimax": "<minimax:tool_call>"}
MARKUP = (*KIMI_MARKERS, "<minimax:tool_call>", "</minimax:tool_call>", "<invoke", "<parameter")
ADDON_ERROR = re.compile(r"Traceback|addon error", re.IGNORECASE)


@pytest.fixture
def installs(request: pytest.FixtureRequest) -> Path | None:
    """Installs what the client needs: node/'s modules (Claude Code is one of them), or the
    clients' venv, whose interpreter it returns."""
    client: Client = request.node.callspec.params["client"]
    if client.kind == "python":
        return request.getfixturevalue("client_python")
    request.getfixturevalue("node_clients")
    return None


def run_case(
    client: Client,
    leak: str,
    toolshim: bool,
    upstream: ScriptedUpstream,
    client_env: dict[str, str],
    python: Path | None,
    tmp_path: Path,
) -> tuple[ClientRun, AnthropicBackend, Mitmdump]:
    token = secrets.token_hex(4)
    model = f"{MODEL_PREFIX[leak]}-{client}-{'on' if toolshim else 'off'}-{token}"
    backend = AnthropicBackend(model, f"toolshim-ok-{token}").register(upstream)
    try:
        with Mitmdump(upstream.url, script=ADDON_SCRIPT if toolshim else None) as proxy:
            run = run_client(
                client, base_url=proxy.url, model=model, env=client_env, workdir=tmp_path / "work", python=python
            )
    finally:
        upstream.remove(model)
    return run, backend, proxy


def explain(run: ClientRun, backend: AnthropicBackend, proxy: Mitmdump) -> str:
    seen = [e.describe() for e in backend.exchanges]
    return (
        f"{run.describe()}\n--- blocks the client got\n{json.dumps(run.blocks)[-3000:]}\n--- upstream saw\n"
        + "\n".join(seen)
        + f"\n--- mitmdump\n{proxy.log_text()[-4000:]}"
    )


def block_texts(blocks: list[dict]) -> list[str]:
    return [str(b.get("text") or b.get("thinking") or "") for b in blocks if b.get("type") in ("text", "thinking")]


@pytest.mark.parametrize("leak", LEAKS)
@pytest.mark.parametrize("client", CLIENTS, ids=str)
def test_leaked_call_runs_through_toolshim(client, leak, installs, upstream, client_env, tmp_path):
    run, backend, proxy = run_case(client, leak, True, upstream, client_env, installs, tmp_path)
    why = explain(run, backend, proxy)

    assert run.returncode == 0 and run.errors == [], why
    # The client ran the leaked command, once, and finished with the answer quoting its output.
    assert len(run.tool_outputs) == 1 and backend.marker in run.tool_outputs[0], why
    assert run.final == backend.final_text(backend.marker), why
    # What it got: one tool_use block, and no markup left in its text or thinking.
    uses = [b for b in run.blocks if b.get("type") == "tool_use"]
    assert len(uses) == 1, why
    assert (uses[0]["name"], uses[0]["input"]) == (SHELL_TOOL[client], {"command": backend.command}), why
    assert not any(m in text for text in block_texts(run.blocks) for m in MARKUP), why
    # Every request was one the backend plays (Claude Code's side requests among them).
    assert {e.kind for e in backend.exchanges} <= {"agent", "side", "count_tokens"}, why

    # The upstream: the leaked turn, then the turn with the call and its result, streamed.
    turns = backend.agent_turns
    assert [t.turn for t in turns] == [1, 2] and all(t.stream for t in turns), why
    last = turns[-1]
    (call,) = last.tool_uses
    (result,) = last.tool_results
    assert call["id"] == uses[0]["id"] == result["tool_use_id"], why
    assert call["input"] == {"command": backend.command}, why
    assert block_text(result).strip() == backend.marker, why
    if leak == "kimi":
        assert call["id"] == f"functions.{SHELL_TOOL[client]}:0", why  # Kimi's own id kept
    else:
        assert re.fullmatch(r"toolu_[A-Za-z0-9]{24}", call["id"]), why
    assert not any(m in json.dumps(last.body.get("messages")) for m in MARKUP), why
    assert not [line for line in proxy.log_lines() if ADDON_ERROR.search(line)], why


@pytest.mark.parametrize("leak", LEAKS)
@pytest.mark.parametrize("client", CLIENTS, ids=str)
def test_leaked_call_is_not_run_without_toolshim(client, leak, installs, upstream, client_env, tmp_path):
    """The control: the same upstream through mitmdump without toolshim. The markup reaches the
    client as thinking or text, the client runs nothing and ends quietly (exit 0)."""
    run, backend, proxy = run_case(client, leak, False, upstream, client_env, installs, tmp_path)
    why = explain(run, backend, proxy)

    assert run.returncode == 0, why
    assert run.tool_outputs == [], why
    assert not any(b.get("type") == "tool_use" for b in run.blocks), why
    assert any(MARKUP_START[leak] in text for text in block_texts(run.blocks)), why
    assert run.final is None or DONE not in run.final, why
    turns = backend.agent_turns
    assert turns and all(t.turn == 1 and not t.tool_uses for t in turns), why
