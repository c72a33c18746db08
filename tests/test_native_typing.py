"""Upstream's own calls typed by the declared schema (native.py `ArgumentTyping`), through the
Chat stream rewriter: stringified values where the schema says otherwise, null and empty
arguments; holding only a value until it closes, and the same result however the stream is cut."""

from __future__ import annotations

import json

import pytest
from harness import chat_chunk, sse_body
from hypothesis import given
from hypothesis import strategies as st
from toolshim.chat import ChatStreamRewriter
from toolshim.tools import RequestContext
from wire import check_chat_stream

SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
    "query": {"type": "string"}, "limit": {"type": "integer"}, "exact": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string"}}, "when": {"anyOf": [{"type": "number"}, {"type": "null"}]},
}}}}


def native_stream(pieces: list[str], name: str = "search") -> bytes:
    chunks = [chat_chunk("qwen3", role="assistant", tool_calls=[{"index": 0, "id": "call_1", "type": "function", "function": {"name": name, "arguments": ""}}])]
    chunks += [chat_chunk("qwen3", tool_calls=[{"index": 0, "function": {"arguments": piece}}]) for piece in pieces]
    chunks.append(chat_chunk("qwen3", finish_reason="tool_calls"))
    return sse_body(chunks)


def rewritten(body: bytes, pieces: list[bytes] | None = None) -> tuple[dict, ChatStreamRewriter]:
    rewriter = ChatStreamRewriter(RequestContext.from_request({"model": "qwen3", "tools": [SEARCH]}))
    out = b"".join(b"".join(rewriter.feed(p)) for p in (pieces or [body])) + b"".join(rewriter.close())
    return check_chat_stream(out), rewriter


ARGUMENTS = '{"query": "42", "limit": "5", "exact": "TRUE", "tags": "[\\"a\\", \\"b\\"]", "when": "1.5"}'


def test_stringified_values_are_sent_as_what_the_schema_types():
    result, rewriter = rewritten(native_stream([ARGUMENTS[i : i + 3] for i in range(0, len(ARGUMENTS), 3)]))
    [call] = result["tool_calls"]
    assert json.loads(call["arguments"]) == {"query": "42", "limit": 5, "exact": True, "tags": ["a", "b"], "when": 1.5}
    assert rewriter.stats.stream_repairs["typed_value"] == 4


@pytest.mark.parametrize("name", ["search", "undeclared_tool"])  # with a schema, and with none
@pytest.mark.parametrize("arguments", [["null"], ["nu", "ll"], [], [""], ["  "]])
def test_null_or_empty_arguments_become_an_empty_object(arguments, name):
    result, rewriter = rewritten(native_stream(arguments, name))
    assert result["tool_calls"][0]["arguments"].strip() == "{}"
    assert rewriter.stats.stream_repairs["empty_arguments"] == 1


def test_values_that_fit_or_say_nothing_typed_pass_as_they_came():
    arguments = '{"query": "x", "limit": 5, "exact": "maybe", "unknown": "7"}'
    body = native_stream([arguments[:9], arguments[9:30], arguments[30:]])
    result, rewriter = rewritten(body)
    assert result["tool_calls"][0]["arguments"] == arguments
    assert not rewriter.stats.stream_repairs


def test_only_the_value_is_held_not_the_call():
    """The pieces before the stringified value go out as they arrive."""
    rewriter = ChatStreamRewriter(RequestContext.from_request({"model": "qwen3", "tools": [SEARCH]}))
    body = native_stream(['{"query": "abc", ', '"limit": "', "5", '"}'])
    events = [e + b"\n\n" for e in body.split(b"\n\n") if e]
    sent = [b"".join(rewriter.feed(event)) for event in events]
    assert b'"query' in sent[1] and b'abc' in sent[1]  # streamed live
    assert b"limit" in sent[2] and b"5" not in sent[3]  # the value is held…
    assert b"5" in sent[4]  # …until its string closes


@given(st.lists(st.integers(1, 400), max_size=8))
def test_the_same_however_the_stream_is_cut(cuts):
    body = native_stream([ARGUMENTS[i : i + 2] for i in range(0, len(ARGUMENTS), 2)])
    points = sorted({c % len(body) for c in cuts} - {0})
    pieces = [body[a:b] for a, b in zip([0, *points], [*points, len(body)])]
    assert rewritten(body, pieces)[0]["tool_calls"] == rewritten(body)[0]["tool_calls"]


def test_a_whole_chat_body_is_typed_as_a_stream_is():
    from toolshim.chat import rewrite_chat_completion

    context = RequestContext.from_request({"model": "qwen3", "tools": [SEARCH]})
    calls = [
        {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"query": "42", "limit": "5"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "undeclared", "arguments": None}},
        {"id": "call_3", "type": "function", "function": {"name": "search", "arguments": {"query": "x"}}},
    ]
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": calls}, "finish_reason": "tool_calls"}]}
    stats = rewrite_chat_completion(body, context)
    got = [c["function"]["arguments"] for c in body["choices"][0]["message"]["tool_calls"]]
    assert [json.loads(a) for a in got] == [{"query": "42", "limit": 5}, {}, {"query": "x"}]
    assert isinstance(got[2], str)
    assert stats.stream_repairs == {"typed_value": 1, "empty_arguments": 1, "object_arguments": 1}
    # a body whose calls fit passes untouched
    fine = {"choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"limit": 5}'}}]}, "finish_reason": "tool_calls"}]}
    assert rewrite_chat_completion(fine, context) is None
