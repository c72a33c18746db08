"""Seed 002's additions, each behind an option and off by default (not OpenAI wire format)."""

from __future__ import annotations

import json

from harness import chat_completion, iter_sse_data, sse_body
from toolshim.chat import ChatStreamRewriter, rewrite_chat_completion
from toolshim.tools import RequestContext

TOOLS = [
    {"type": "function", "function": {"name": "calculate", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "set_temp", "strict": True, "parameters": {"type": "object", "properties": {"c": {"type": "number"}}, "required": ["c"], "additionalProperties": False}}},
]
CONTENT = '<think>Let me think.</think>The answer.<tool_call>{"name": "calculate", "arguments": {"expression": "6*7"}}</tool_call>'


def context(**flags) -> RequestContext:
    ctx = RequestContext.from_body(json.dumps({"model": "m", "messages": [], "tools": TOOLS}).encode())
    for key, value in flags.items():
        setattr(ctx, key, value)
    return ctx


def test_extensions_are_off_by_default_and_list_reasoning_and_call_events_when_on():
    plain = chat_completion("m", content=CONTENT)
    rewrite_chat_completion(plain, context())
    assert "extensions" not in plain

    body = chat_completion("m", content=CONTENT)
    rewrite_chat_completion(body, context(extensions=True))
    (call,) = body["choices"][0]["message"]["tool_calls"]
    assert body["extensions"] == {
        "reasoning_chunks": ["Let me think."],
        "tool_call_chunks": [
            {"type": "start", "tool_call_id": call["id"], "tool_name": "calculate"},
            {"type": "args", "tool_call_id": call["id"], "delta": '{"expression":"6*7"}'},
            {"type": "end", "tool_call_id": call["id"]},
        ],
    }


def stream(ctx: RequestContext, content: str) -> list[dict]:
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    body = sse_body([
        {**base, "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ])
    rewriter = ChatStreamRewriter(ctx)
    out = b"".join(rewriter.feed(body) + rewriter.close())
    return [json.loads(d) for d in iter_sse_data(out) if not d.startswith("[DONE]")]


def test_parse_error_chunk_is_off_by_default_and_ends_the_choice_when_on():
    broken = 'Setting it.<tool_call>{"name": "set_temp", "arguments": {"c": "warm"}}</tool_call>'
    default = stream(context(), broken)
    assert default[-1]["choices"][0]["finish_reason"] == "stop" and "error" not in default[-1]
    chunks = stream(context(parse_error_chunk=True), broken)
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "error"
    assert last["error"]["type"] == "tool_call_parse_error" and "set_temp" in last["error"]["message"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == broken  # the markup still reaches the client as text
    assert stream(context(parse_error_chunk=True), "fine")[-1]["choices"][0]["finish_reason"] == "stop"
