"""What a flow leaves behind once its `response` hook ran: nothing of toolshim's for the garbage
collector to find. mitmproxy keeps each response in a reference cycle of its own (its dataclasses'
type checks catch TypeErrors whose tracebacks hold the frames that made it), freed only when the
collector runs; the stream callable it holds lets go of its rewriter then (`StreamRewrite.finished`),
and the rewriter's objects hold no cycle among themselves: they go by their reference counts,
at once, where a hundred objects a flow would otherwise fill the collector's youngest generation
and wait for a full collection (bench/HISTORY.md)."""

from __future__ import annotations

import gc
import json
import types
import weakref

import pytest
from mitmproxy.test import taddons, tflow, tutils

from anthropic_stream import block_events, stream
from harness import sse_body
from kimi import SEED_000, kimi_chunks
from responses import number_events, responses_events, responses_sse
from toolshim.addon import ToolShim

BASH = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}
QWEN3 = "Qwen/Qwen3-32B"  # (a `<think>` chain in front of its `<tool_call>` lexer)
CALL = ["Let me look.\n<tool", '_call>\n{"name": "bash", ', '"arguments": {"command": "ls"}}\n</tool_call>\n', "Done."]


def chat_chunks(model: str, pieces: list[str]) -> list[dict]:
    chunks = [{"id": "c", "object": "chat.completion.chunk", "model": model, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces]
    return [*chunks, {"id": "c", "object": "chat.completion.chunk", "model": model, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]


FLOWS = [
    pytest.param("/v1/chat/completions", {"model": "moonshotai/Kimi-K2.5", "tools": [BASH]}, sse_body(kimi_chunks("k2", SEED_000)), id="chat, Kimi"),
    pytest.param("/v1/chat/completions", {"model": QWEN3, "tools": [BASH]}, sse_body(chat_chunks(QWEN3, CALL)), id="chat, <tool_call>"),
    pytest.param(
        "/v1/responses", {"model": QWEN3, "tools": [{"type": "function", "name": "bash", "parameters": BASH["function"]["parameters"]}], "stream": True},
        responses_sse(number_events(responses_events(QWEN3, CALL))), id="responses, <tool_call>",
    ),  # fmt: skip
    pytest.param(
        "/v1/messages", {"model": "moonshotai/Kimi-K2.5", "tools": [{"name": "bash", "input_schema": BASH["function"]["parameters"]}], "stream": True},
        stream(
            "moonshotai/Kimi-K2.5",
            block_events(0, "text", ["a <|tool_calls_section_begin|><|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>", '{"command": "ls"}', "<|tool_call_end|><|tool_calls_section_end|>"]),
        ),
        id="messages, Kimi",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("path", "request_body", "body"), FLOWS)
def test_a_finished_flow_s_rewriter_goes_without_the_garbage_collector(path, request_body, body):
    addon = ToolShim()
    with taddons.context(addon):
        _run(addon, _flow(path, request_body), body)  # (the process's caches filled: compiled schemas, patterns)
        flow = _flow(path, request_body)
        gc.collect()
        gc.disable()
        try:
            shared = {id(o) for o in gc.get_objects()}  # (what was there before the flow: the addon's, the modules')
            addon.requestheaders(flow)
            addon.request(flow)
            addon.responseheaders(flow)
            callable_ = flow.response.stream
            for at in range(0, len(body), 97):
                callable_(body[at : at + 97])
            callable_(b"")
            assert callable_.stats.calls >= 1  # (a call was made: lanes, lexers, calls all in play)
            kept = {id(o) for o in _reached(callable_.stats, shared)}  # (the counts stay with the flow)
            watched = [weakref.ref(o) for o in _reached(callable_.rewriter, shared | kept) if _weakly_referable(o)]
            assert len(watched) >= 5, len(watched)
            addon.response(flow)
            alive = [ref() for ref in watched if ref() is not None]
            assert not alive, sorted({type(o).__qualname__ for o in alive})
            assert flow.response.stream is callable_ and callable_.stats.calls >= 1  # (the flow and its counts stay)
        finally:
            gc.enable()


def _flow(path: str, request_body: dict):
    flow = tflow.tflow(req=tutils.treq(method=b"POST", path=path.encode(), content=json.dumps(request_body).encode()), resp=tutils.tresp(content=None))
    flow.response.headers["content-type"] = "text/event-stream"
    return flow


def _run(addon: ToolShim, flow, body: bytes) -> None:
    addon.requestheaders(flow)
    addon.request(flow)
    addon.responseheaders(flow)
    for at in range(0, len(body), 97):
        flow.response.stream(body[at : at + 97])
    flow.response.stream(b"")
    addon.response(flow)


def _reached(root: object, shared: set[int]) -> list[object]:
    """The objects `root` reaches that the flow made (not `shared`; no classes, modules, code)."""
    found, seen, todo = [], set(), [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or id(obj) in shared or isinstance(obj, (type, types.ModuleType, types.CodeType)):
            continue
        seen.add(id(obj))
        found.append(obj)
        todo.extend(gc.get_referents(obj))
    return found


def _weakly_referable(obj: object) -> bool:
    """Instances and closures (dicts, lists, tuples and strings go with what holds them)."""
    try:
        weakref.ref(obj)
    except TypeError:
        return False
    return True
