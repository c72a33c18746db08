"""Anthropic Messages API through a real mitmdump, read by the official `anthropic` SDK.

The SDK's stream accumulator is strict (it parses every `input_json_delta` prefix, dispatches on
the `event:` line, raises on an event out of order): what it accepts is the bar.
"""

from __future__ import annotations

import anthropic
import httpx
import pytest
from anthropic_stream import BASH_TOOL, block_events, message_body, sse, stream, tool_use_events
from harness import ScriptedUpstream
from kimi import ARG_BEGIN, CALL_BEGIN, CALL_END, SECTION_BEGIN, SECTION_END

KIMI_CALL = [SECTION_BEGIN, CALL_BEGIN, " functions.Bash:0 ", ARG_BEGIN, '{"command": ', '"echo hi"}', CALL_END, SECTION_END]
MINIMAX_CALL = ['<minimax:tool_call>\n<invoke name="Bash">\n<parameter name="command">echo hi', "</parameter>\n</invoke>\n</minimax:tool_call>"]


@pytest.fixture
def client(proxy):
    with anthropic.Anthropic(base_url=proxy.url, api_key="test-key", max_retries=0, timeout=30) as client:
        yield client


def final_message(client, model: str, **kwargs):
    with client.messages.stream(model=model, max_tokens=1024, messages=[{"role": "user", "content": "Say hi."}], tools=[BASH_TOOL], **kwargs) as events:
        seen = [event.type for event in events]
        return events.get_final_message(), seen


def test_kimi_markup_in_thinking_becomes_a_tool_use_block(upstream: ScriptedUpstream, client, unique_model):
    model = f"kimi-k2-{unique_model}"
    upstream.add(model, chunks=[stream(model, block_events(0, "thinking", ["I will run it.", *KIMI_CALL]))])
    message, _ = final_message(client, model)
    assert [block.type for block in message.content] == ["thinking", "tool_use"]
    thinking, call = message.content
    assert thinking.thinking == "I will run it." and thinking.signature == ""  # unsigned: an empty signature
    assert (call.id, call.name, call.input) == ("functions.Bash:0", "Bash", {"command": "echo hi"})
    assert message.stop_reason == "tool_use"


def test_minimax_markup_in_text_between_sentences(upstream, client, unique_model):
    model = f"MiniMax-M2-{unique_model}"
    upstream.add(model, chunks=[stream(model, block_events(0, "text", ["Let me check. ", *MINIMAX_CALL, " Done."]))])
    message, seen = final_message(client, model)
    assert [block.type for block in message.content] == ["text", "tool_use", "text"]
    assert message.content[0].text == "Let me check." or message.content[0].text == "Let me check. "
    call = message.content[1]
    assert call.name == "Bash" and call.input == {"command": "echo hi"}
    assert call.id.startswith("toolu_") and len(call.id) == len("toolu_") + 24
    assert "Done." in message.content[2].text
    assert message.stop_reason == "tool_use"


def test_prose_after_a_call_token_by_token_one_event_a_read(upstream, client, unique_model):
    """Text after a call goes to a block of ours: the block lane renumbers it (past the idle
    lexer), each delta its own read, and the SDK assembles it whole."""
    model = f"MiniMax-M2-{unique_model}"
    after = " It printed hi, [as expected], and \"nothing\" else."
    pieces = ["Let me check. ", *MINIMAX_CALL, *(after[at : at + 3] for at in range(0, len(after), 3))]
    body = stream(model, block_events(0, "text", pieces))
    upstream.add(model, chunks=[event + b"\n\n" for event in body.split(b"\n\n") if event], delay=0.005)
    message, _ = final_message(client, model)
    assert [block.type for block in message.content] == ["text", "tool_use", "text"]
    assert message.content[1].input == {"command": "echo hi"}
    assert message.content[2].text == after



def test_minimax_blocks_held_whole_in_reads_of_eight_events(upstream, client, unique_model):
    """Two MiniMax calls with long commands, in 1-3 character deltas written eight events to a
    network read: the reads inside the second call's held parameter are taken at once
    (`MessagesStreamRewriter._block_burst`, nothing sent for them); the SDK gets both calls with
    their input exactly."""
    model = f"MiniMax-M2-{unique_model}"
    commands = ["ls -la /usr/lib && echo 'long plain words, spaced   out' " * 4, "grep -n \"quoted\" and more words " * 3]
    call = '<minimax:tool_call>\n<invoke name="Bash">\n<parameter name="command">%s</parameter>\n</invoke>\n</minimax:tool_call>'
    text = "Let me check. " + call % commands[0] + " And again. " + call % commands[1] + " Done."
    pieces, at = [], 0
    while at < len(text):
        pieces.append(text[at : at + 1 + at % 3])
        at += 1 + at % 3
    events = [event + b"\n\n" for event in stream(model, block_events(0, "text", pieces)).split(b"\n\n") if event]
    upstream.add(model, chunks=[b"".join(events[at : at + 8]) for at in range(0, len(events), 8)], delay=0.001)
    message, _ = final_message(client, model)
    calls = [block for block in message.content if block.type == "tool_use"]
    assert [(block.name, block.input) for block in calls] == [("Bash", {"command": command}) for command in commands]
    assert message.stop_reason == "tool_use"


def test_think_tags_in_text_become_a_thinking_block(upstream, client, unique_model):
    model = f"MiniMax-M2-{unique_model}"
    upstream.add(model, chunks=[stream(model, block_events(0, "text", ["<think>Plan: ", "greet.</think>", "Hi!"]))])
    message, _ = final_message(client, model)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in message.content] == [("thinking", "Plan: greet."), ("text", "Hi!")]
    assert message.content[0].signature == ""
    assert message.stop_reason == "end_turn"


def test_a_plain_stream_passes_byte_for_byte(upstream, proxy, unique_model):
    body = stream(unique_model, block_events(0, "thinking", ["Hmm."], signature="sig=="), block_events(1, "text", ["Hello", " there."]))
    upstream.add(unique_model, chunks=[body])
    got = httpx.post(f"{proxy.url}/v1/messages", json={"model": unique_model, "max_tokens": 10, "stream": True, "messages": []}, timeout=30)
    assert got.content == body


def test_split_native_tool_use_blocks_and_input_at_start_are_repaired(upstream, client, unique_model):
    """vLLM's converter opening a block per chunk of one call, an input at the start as well as
    in deltas, empty pieces, stop_reason end_turn: the SDK gets one well-formed call."""
    model = f"qwen3-{unique_model}"
    body = stream(
        model,
        block_events(0, "text", ["Running."]),
        tool_use_events(1, "toolu_A", "Bash", ['{"comm', ""], start_input={"command": "ec"}),
        tool_use_events(2, "toolu_A", "Bash", ['and": "echo hi"}']),
    )
    upstream.add(model, chunks=[body])
    message, _ = final_message(client, model)
    assert [block.type for block in message.content] == ["text", "tool_use"]
    assert message.content[1].input == {"command": "echo hi"} and message.content[1].id == "toolu_A"
    assert message.stop_reason == "tool_use"


def test_non_streaming_body_gets_the_same_blocks(upstream, client, unique_model):
    model = f"kimi-k2-{unique_model}"
    upstream.add_json(model, message_body(model, [{"type": "thinking", "thinking": "I will run it." + "".join(KIMI_CALL), "signature": ""}]))
    message = client.messages.create(model=model, max_tokens=1024, messages=[{"role": "user", "content": "Say hi."}], tools=[BASH_TOOL])
    assert [block.type for block in message.content] == ["thinking", "tool_use"]
    assert message.content[1].input == {"command": "echo hi"} and message.stop_reason == "tool_use"


def test_undeclared_tool_stays_text_and_error_answers_pass(upstream, proxy, client, unique_model):
    model = f"MiniMax-M2-{unique_model}"
    leaked = '<minimax:tool_call>\n<invoke name="rm_rf">\n<parameter name="path">/</parameter>\n</invoke>\n</minimax:tool_call>'
    upstream.add(model, chunks=[stream(model, block_events(0, "text", [leaked]))])
    message, _ = final_message(client, model)
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == leaked
    error = sse([{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}])
    upstream.add(model, status=529, chunks=[error])
    got = httpx.post(f"{proxy.url}/v1/messages", json={"model": model, "max_tokens": 10, "stream": True, "messages": []}, timeout=30)
    assert got.status_code == 529 and got.content == error


def test_deepseek_anthropic_gets_its_thinking_back_on_the_next_turn(upstream, client, unique_model):
    """DeepSeek's /anthropic answers 400 "The `content[].thinking` in the thinking mode must be
    passed back"; a client that drops thinking blocks gets them put back as it was sent them."""
    model = f"deepseek-v4-{unique_model}"
    upstream.add(model, chunks=[stream(model, block_events(0, "thinking", ["Need ", "ls."]), tool_use_events(1, "call_00_x", "Bash", ['{"command": "ls"}']), stop_reason="tool_use")])
    message, _ = final_message(client, model)
    thinking, call = message.content
    assert thinking.signature == ""  # unsigned upstream thinking: signed empty for Claude Code
    history, sent = next_turn_without_thinking(upstream, client, model, call)
    assert sent[1]["content"][0] == {"type": "thinking", "thinking": "Need ls.", "signature": ""}
    assert sent[1]["content"][1]["id"] == "call_00_x" and sent[2] == history[2]


def next_turn_without_thinking(upstream, client, model: str, call) -> tuple[list[dict], list[dict]]:
    """The next turn after `call`, as a client that drops thinking blocks sends it: the history
    it sent, and the messages upstream got."""
    upstream.add(model, chunks=[stream(model, block_events(0, "text", ["Two files."]))])
    history = [
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "a b"}]},
    ]
    with client.messages.stream(model=model, max_tokens=1024, messages=history, tools=[BASH_TOOL]) as events:
        events.get_final_message()
    return history, upstream.requests_for(model)[-1].json["messages"]


@pytest.mark.parametrize("events_a_write", [1, 3, 8])
@pytest.mark.parametrize("backend", ["deepseek-v4", "kimi-k2"])
def test_thinking_streamed_token_by_token_comes_back_whole(upstream, client, unique_model, backend, events_a_write):
    """Thinking in token-sized pieces, written one event at a time, three at a time (no burst:
    `stream.BURST_MIN_EVENTS`) and eight at a time: the lanes send it (a quiet lane, or the block
    lane of Kimi's thinking, which holds its call's markup) and note what they sent
    (`NotedEvents`), and remembering takes those notes instead of reading the events again. The
    next turn gets the thinking back whole, with the call it led to."""
    model = f"{backend}-{unique_model}"
    thought = "Let me look at the files in this directory before I change any of them."
    pieces = [thought[at : at + 3] for at in range(0, len(thought), 3)]
    if backend == "kimi-k2":
        blocks = [block_events(0, "thinking", [*pieces, *KIMI_CALL])]
    else:
        blocks = [block_events(0, "thinking", pieces), tool_use_events(1, "functions.Bash:0", "Bash", ['{"command": ', '"echo hi"}'])]
    events = [event + b"\n\n" for event in stream(model, *blocks, stop_reason="tool_use").split(b"\n\n") if event]
    upstream.add(model, chunks=[b"".join(events[at : at + events_a_write]) for at in range(0, len(events), events_a_write)], delay=0.002)
    message, _ = final_message(client, model)
    thinking, call = message.content
    assert thinking.thinking == thought and (call.id, call.input) == ("functions.Bash:0", {"command": "echo hi"})
    _, sent = next_turn_without_thinking(upstream, client, model, call)
    assert sent[1]["content"][0] == {"type": "thinking", "thinking": thought, "signature": ""}, sent[1]


def test_tool_emulation_for_a_text_only_anthropic_backend(upstream, unique_model):
    """`toolshim_emulate`: the request goes without tools, the manifest in `system`, the
    history flattened; the `<tool_call>` the model writes comes back as a tool_use block, and
    the next turn's tool_result reaches the backend as text."""
    import json

    from harness import Mitmdump, RecordedRequest, Script

    model = f"emulated-{unique_model}"
    call_text = 'Checking.\n<tool_call>{"name": "Bash", "arguments": "{\\"command\\": \\"ls\\"}"}</tool_call>'

    def respond(request: RecordedRequest) -> Script:
        body = request.json or {}
        if "tools" in body or "tool_choice" in body:
            return Script(status=400, headers=(("content-type", "application/json"),), chunks=(b'{"type":"error","error":{"type":"invalid_request_error","message":"no tools here"}}',), framing="content-length")
        text = "Two files." if "[function_call_output call_id=toolu_" in json.dumps(body) else call_text
        return Script(headers=(("content-type", "text/event-stream"),), chunks=(stream(model, block_events(0, "text", [text])),))

    upstream.add_responder(model, respond)
    with Mitmdump(upstream.url, extra_args=["--set", "toolshim_emulate=^emulated-"]) as proxy:
        with anthropic.Anthropic(base_url=proxy.url, api_key="test-key", max_retries=0, timeout=30) as client:
            history = [{"role": "user", "content": "List the files."}]
            with client.messages.stream(model=model, max_tokens=100, system="Be brief.", messages=history, tools=[BASH_TOOL], tool_choice={"type": "any"}) as events:
                first = events.get_final_message()
            assert [b.type for b in first.content] == ["text", "tool_use"] and first.stop_reason == "tool_use"
            call = first.content[1]
            assert call.input == {"command": "ls"} and call.id.startswith("toolu_")
            history += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "a b"}]}]
            with client.messages.stream(model=model, max_tokens=100, messages=history, tools=[BASH_TOOL]) as events:
                second = events.get_final_message()
    assert second.content[0].text == "Two files."
    sent = upstream.requests_for(model)
    assert "tools" not in sent[0].json and "You MUST call at least one tool" in sent[0].json["system"] and sent[0].json["system"].startswith("Be brief.")
    assert sent[-1].json["messages"][-1] == {"role": "user", "content": f"[function_call_output call_id={call.id} output=a b]"}
    assert '<tool_call>{"name":"Bash"' in sent[-1].json["messages"][1]["content"]
