"""Is a flow rewritten? Only when what its client assembles differs from what upstream sent.

A rewriter that holds a `<` at the end of one event (it may begin a marker) and sends it with
the next re-cuts the text: the bytes differ, the text a client assembles does not. Such a flow
is neither marked nor annotated ("no call from markup"); a call made, text moved to another
field, text dropped or a finish reason changed is a change (stream.py, `EchoCheck`).
"""

from __future__ import annotations

import json

import pytest
from mitmproxy.test import taddons

from anthropic_stream import block_events, stream
from harness import sse_body
from responses import number_events, responses_events, responses_sse
from test_addon import chat_flow, run_stream
from toolshim.addon import ToolShim
from toolshim.chat import ChatStreamRewriter
from toolshim.messages import MessagesStreamRewriter
from toolshim.responses import ResponsesStreamRewriter
from toolshim.tools import RequestContext

QWEN = b'{"model": "Qwen/Qwen2.5-72B-Instruct", "tools": [{"type": "function", "function": {"name": "bash"}}]}'
NATIVE = [
    {"index": 0, "id": "call_upstream", "type": "function", "function": {"name": "bash", "arguments": ""}},
    {"index": 0, "function": {"arguments": '{"command": "ls"}'}},
]


def chat(*deltas: dict, finish: str = "stop") -> bytes:
    chunks = [{"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    return sse_body(chunks)


def rewrite(rewriter, body: bytes, cut: int | None = None) -> bytes:
    pieces = [body] if cut is None else [body[at : at + cut] for at in range(0, len(body), cut)]
    out = []
    for piece in pieces:
        out += rewriter.feed(piece)
    return b"".join(out + rewriter.close())


RECHUNKED = [
    pytest.param(ChatStreamRewriter, QWEN, chat({"role": "assistant", "content": ""}, {"content": "if a <"}, {"content": " b then"}, {"content": " go"}), id="chat"),
    pytest.param(
        ChatStreamRewriter, QWEN, chat({"role": "assistant", "content": "x <"}, {"content": "= y"}, {"tool_calls": NATIVE[:1]}, {"tool_calls": NATIVE[1:]}, finish="tool_calls"),
        id="chat, with upstream's own call",
    ),
    pytest.param(ChatStreamRewriter, QWEN, chat({"content": "a <"}, {"content": "tool"}, {"content": "box> b"}), id="chat, a look-alike held over three events"),
    pytest.param(ResponsesStreamRewriter, QWEN, responses_sse(number_events(responses_events("Qwen/Qwen2.5-72B-Instruct", ["if a <", " b then", " go"]))), id="responses"),
    pytest.param(
        MessagesStreamRewriter, b'{"model": "Qwen/Qwen2.5-72B-Instruct", "tools": [{"name": "bash", "input_schema": {}}]}',
        stream("Qwen/Qwen2.5-72B-Instruct", block_events(0, "text", ["if a <", " b then", " go"])), id="messages",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("make", "request_body", "body"), RECHUNKED)
@pytest.mark.parametrize("cut", [None, 1, 7])
def test_text_only_recut_is_not_a_change(make, request_body, body, cut):
    rewriter = make(RequestContext.from_body(request_body))
    out = rewrite(rewriter, body, cut)
    assert out != body  # the `<` went out with the next event
    assert not rewriter.changed and rewriter.failure is None


CHANGED = [
    pytest.param(ChatStreamRewriter, QWEN, chat({"content": "Run <tool_call>"}, {"content": '{"name": "bash", "arguments": {}}'}, {"content": "</tool_call>"}), id="a call"),
    pytest.param(ChatStreamRewriter, b'{"model": "Qwen/QwQ-32B"}', chat({"content": "<think>why"}, {"content": "</think>so"}), id="reasoning moved"),
    pytest.param(ChatStreamRewriter, b'{"model": "moonshotai/Kimi-K2.5"}', chat({"content": "a <|tool_calls_section_begin|>"}, {"content": "<|tool_calls_section_end|> b"}), id="markup dropped"),
    pytest.param(
        ResponsesStreamRewriter, QWEN,
        responses_sse(number_events(responses_events("Qwen/Qwen2.5-72B-Instruct", ["Run <tool_call>", '{"name": "bash", "arguments": {}}', "</tool_call>"]))),
        id="responses: a call",
    ),  # fmt: skip
    pytest.param(
        MessagesStreamRewriter, b'{"model": "moonshotai/Kimi-K2.5", "tools": [{"name": "bash", "input_schema": {}}]}',
        stream("moonshotai/Kimi-K2.5", block_events(0, "text", ["a <|tool_calls_section_begin|>", "<|tool_calls_section_end|> b"])), id="messages: markup dropped",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("make", "request_body", "body"), CHANGED)
@pytest.mark.parametrize("cut", [None, 1, 7])
def test_what_a_client_assembles_differently_is_a_change(make, request_body, body, cut):
    rewriter = make(RequestContext.from_body(request_body))
    rewrite(rewriter, body, cut)
    assert rewriter.changed


@pytest.mark.parametrize(("make", "request_body", "body"), [CHANGED[0], CHANGED[3]])
def test_a_call_made_of_markup_is_a_change_told_without_reading_the_events(make, request_body, body, monkeypatch):
    """Once the rewriter made a call, no side's events are read into what a client assembles:
    the call is a difference (a call upstream never sent). (Before it, the text re-cut by the
    `<` held is read.)"""
    calls_when_read = []
    real = make._assembled
    monkeypatch.setattr(make, "_assembled", staticmethod(lambda raw: calls_when_read.append(rewriter.stats.calls) or real(raw)))
    rewriter = make(RequestContext.from_body(request_body))
    rewrite(rewriter, body, 7)
    assert rewriter.changed and rewriter.stats.calls == 1
    assert calls_when_read and set(calls_when_read) == {0}


def test_a_held_look_alike_past_the_byte_limit_is_compared_by_its_text():
    """Held over more than `EchoCheck.MAX_UNSENT` bytes of events, then released as it came:
    still not a change (the comparison keeps the held text, not the events)."""
    from toolshim.stream import EchoCheck

    pieces = ["<tool_call>"] + ["x" * 40] * (EchoCheck.MAX_UNSENT // 100) + [" never closed", "</tool_box> done"]
    body = chat({"content": "Start "}, *({"content": piece} for piece in pieces))
    rewriter = ChatStreamRewriter(RequestContext.from_body(QWEN))
    rewrite(rewriter, body)
    assert not rewriter.changed


def test_a_recut_flow_is_neither_marked_nor_annotated():
    addon = ToolShim()
    body = chat({"role": "assistant", "content": ""}, {"content": "if a <"}, {"content": " b then"}, {"content": " go"})
    with taddons.context(addon):
        flow = chat_flow()
        flow.request.content = QWEN
        out = run_stream(addon, flow, [body])
        assert out != body
        assert not flow.marked and not flow.comment
        assert "toolshim" not in flow.metadata or not flow.metadata["toolshim"].get("rewritten")


def test_a_recut_body_replayed_whole_is_left_as_it_came():
    """An offline flow (read whole in `response`): its body stays upstream's, unmarked."""
    addon = ToolShim()
    body = chat({"role": "assistant", "content": ""}, {"content": "if a <"}, {"content": " b then"}, {"content": " go"})
    with taddons.context(addon):
        flow = chat_flow(live=False)
        flow.request.content = QWEN
        flow.response.content = body
        addon.requestheaders(flow)
        addon.request(flow)
        addon.responseheaders(flow)
        addon.response(flow)
        assert flow.response.content == body
        assert not flow.marked and not flow.comment
    assert json.loads(QWEN)  # (the request as sent)
