"""The scripted Anthropic upstream on its own (no proxy, no agent): read by the `anthropic` SDK
of the project's venv, its streams are well-formed, the markup is where each leak puts it, the
turn follows the tool results, and the requests an agent makes besides its turns are answered."""

from __future__ import annotations

import anthropic
import httpx
import pytest
from anthropic_backend import (
    DONE,
    SIDE_TEXT,
    AnthropicBackend,
    ToolChoice,
    block_text,
    leak_of,
    minimax_markup_pieces,
    pick_tool,
)
from harness import ScriptedUpstream
from kimi import MARKERS as KIMI_MARKERS

BASH = {"name": "Bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}}, "required": ["command"]}}
READ = {"name": "Read", "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}}
SHELL = {"name": "run_shell", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}
MARKER = "toolshim-ok-0123abcd"


@pytest.fixture
def backend(request, upstream: ScriptedUpstream):
    model = request.param if hasattr(request, "param") else "kimi-k2-backend-test"
    backend = AnthropicBackend(model, MARKER).register(upstream)
    yield backend
    upstream.remove(model)


@pytest.fixture
def client(upstream):
    with anthropic.Anthropic(base_url=upstream.url, api_key="test-key", max_retries=0, timeout=10) as client:
        yield client


def ask(client, backend, messages, tools=(BASH,)):
    with client.messages.stream(model=backend.model, max_tokens=100, messages=messages, tools=list(tools)) as stream:
        return stream.get_final_message()


def test_leak_by_model_name():
    assert leak_of("kimi-k2-x") == "kimi" and leak_of("MiniMax-M2-x") == "minimax"
    with pytest.raises(ValueError):
        leak_of("claude-sonnet-4")


def test_pick_tool_prefers_a_shell_tool_and_its_command():
    assert pick_tool([READ, BASH]) == ToolChoice("Bash", "command")
    assert pick_tool([READ, SHELL]) == ToolChoice("run_shell", "command")
    assert pick_tool([READ]) is None and pick_tool(None) is None


def test_minimax_markup_pieces_join_to_the_markup():
    markup = "".join(minimax_markup_pieces("Bash", {"command": "echo hi"}))
    assert markup == '<minimax:tool_call>\n<invoke name="Bash">\n<parameter name="command">echo hi</parameter>\n</invoke>\n</minimax:tool_call>'


@pytest.mark.parametrize("backend", ["kimi-k2-backend-test"], indirect=True)
def test_kimi_turn_one_leaks_into_thinking(client, backend):
    message = ask(client, backend, [{"role": "user", "content": "Run the check."}])
    assert [b.type for b in message.content] == ["thinking"] and message.stop_reason == "end_turn"
    thinking = message.content[0].thinking
    assert all(m in thinking for m in KIMI_MARKERS)
    assert "functions.Bash:0" in thinking and f'{{"command": "echo {MARKER}"}}' in thinking
    (exchange,) = backend.exchanges
    assert (exchange.kind, exchange.turn, exchange.stream) == ("agent", 1, True)


@pytest.mark.parametrize("backend", ["MiniMax-M2-backend-test"], indirect=True)
def test_minimax_turn_one_leaks_into_text(client, backend):
    message = ask(client, backend, [{"role": "user", "content": "Run the check."}])
    assert [b.type for b in message.content] == ["thinking", "text"]
    text = message.content[1].text
    assert f'<invoke name="Bash">\n<parameter name="command">echo {MARKER}</parameter>' in text
    assert "<|" not in message.content[0].thinking


@pytest.mark.parametrize("backend", ["kimi-k2-backend-test"], indirect=True)
@pytest.mark.parametrize("content", [f"{MARKER}\n", [{"type": "text", "text": f"{MARKER}\n"}]])
def test_a_tool_result_makes_turn_two_the_answer(client, backend, content):
    history = [
        {"role": "user", "content": "Run the check."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "functions.Bash:0", "name": "Bash", "input": {"command": f"echo {MARKER}"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "functions.Bash:0", "content": content}]},
    ]
    message = ask(client, backend, history)
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].signature  # a signed thinking block, as a real final turn has
    assert message.content[1].text == backend.final_text(MARKER) and DONE in message.content[1].text
    (exchange,) = backend.exchanges
    assert exchange.turn == 2 and [block_text(r) for r in exchange.tool_results] == [f"{MARKER}\n"]
    assert exchange.tool_uses[0]["id"] == "functions.Bash:0"


@pytest.mark.parametrize("backend", ["kimi-k2-backend-test"], indirect=True)
def test_side_requests_get_a_short_answer(client, backend, upstream):
    message = client.messages.create(model=backend.model, max_tokens=50, messages=[{"role": "user", "content": "Title?"}])
    assert [(b.type, b.text) for b in message.content] == [("text", SIDE_TEXT)]
    streamed = ask(client, backend, [{"role": "user", "content": "Title?"}], tools=[READ])
    assert [(b.type, b.text) for b in streamed.content] == [("text", SIDE_TEXT)]
    count = client.messages.count_tokens(model=backend.model, messages=[{"role": "user", "content": "hi"}])
    assert count.input_tokens > 0
    other = httpx.post(f"{upstream.url}/v1/complete", json={"model": backend.model, "prompt": "hi"}, timeout=10)
    assert other.status_code == 404 and other.json()["error"]["type"] == "not_found_error"
    assert [e.kind for e in backend.exchanges] == ["side", "side", "count_tokens", "other"]
