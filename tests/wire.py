"""Our own check of the Chat Completions wire rules, and accumulation of a stream's result.

`check_chat_stream` fails on any rule the real clients enforce (research: openai-python's
`ChatCompletionStreamState`, openai-node, the AI SDK) and returns the accumulated message, so
tests can compare results across splits, transports and fixtures.
"""

from __future__ import annotations

import json
from typing import Any

from harness import iter_sse_data

TEXT_FIELDS = ("content", "reasoning", "reasoning_content")


class WireError(AssertionError):
    pass


def check_chat_stream(body: bytes) -> dict[str, Any]:
    """Validate an SSE body of `chat.completion.chunk` events; return choice 0's result."""
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    metadata: set[tuple[Any, Any, Any]] = set()
    done = False
    for data in iter_sse_data(body):
        if done:
            raise WireError(f"event after [DONE]: {data[:80]}")
        if data.startswith("[DONE]"):
            done = True
            continue
        chunk = json.loads(data)
        if chunk.get("object") != "chat.completion.chunk":
            raise WireError(f"not a chat.completion.chunk: {data[:120]}")
        metadata.add((chunk.get("id"), chunk.get("model"), chunk.get("created")))
        if chunk.get("usage") is not None:
            usage = chunk["usage"]
        for choice in chunk["choices"]:
            _check_choice(choices.setdefault(choice["index"], _new_result()), choice)
    if len(metadata) > 1:
        raise WireError(f"id/model/created changed within the stream: {metadata}")
    result = choices.get(0, _new_result())
    result["usage"] = usage
    result["done"] = done
    for call in result["tool_calls"]:
        call.pop("_closed", None)
    return result


def _new_result() -> dict[str, Any]:
    return {field: "" for field in TEXT_FIELDS} | {"tool_calls": [], "finish_reason": None}


def _check_choice(result: dict[str, Any], choice: dict[str, Any]) -> None:
    delta = choice.get("delta") or {}
    finish = choice.get("finish_reason")
    if result["finish_reason"] is not None:
        raise WireError(f"choice continues after finish_reason {result['finish_reason']!r}: {choice}")
    if not delta and finish is None:
        raise WireError("empty delta without finish_reason")
    for field in TEXT_FIELDS:
        if isinstance(delta.get(field), str):
            result[field] += delta[field]
    seen_in_chunk: set[int] = set()
    calls = result["tool_calls"]
    for entry in delta.get("tool_calls") or []:
        index = entry.get("index")
        if not isinstance(index, int):
            raise WireError(f"tool_calls entry without an integer index: {entry}")
        if index in seen_in_chunk:
            raise WireError(f"two entries for index {index} in one chunk")
        seen_in_chunk.add(index)
        function = entry.get("function")
        if not isinstance(function, dict):
            raise WireError(f"tool_calls entry without a function object: {entry}")
        if index == len(calls):  # a new call: its first delta must identify it completely
            if not entry.get("id") or entry.get("type") != "function" or not function.get("name"):
                raise WireError(f"first delta of call {index} lacks id, type or name: {entry}")
            if calls:
                calls[-1]["_closed"] = True
            calls.append({"id": entry["id"], "name": function["name"], "arguments": function.get("arguments") or ""})
        elif index < len(calls):
            if "id" in entry or "type" in entry or "name" in function:
                raise WireError(f"id/type/name repeated on a continuation of call {index}: {entry}")
            if calls[index].get("_closed"):
                raise WireError(f"call {index} continues after call {index + 1} began")
            if not isinstance(function.get("arguments"), str):
                raise WireError(f"continuation without string arguments: {entry}")
            calls[index]["arguments"] += function["arguments"]
        else:
            raise WireError(f"index {index} skips ahead of {len(calls)}")
    if finish is not None:
        if calls and finish == "stop":
            raise WireError("tool calls were sent but finish_reason is 'stop'")
        result["finish_reason"] = finish


def text_result(result: dict[str, Any]) -> dict[str, Any]:
    """The parts of a result that two equivalent streams must agree on."""
    return {
        "content": result["content"],
        "reasoning": result["reasoning"],
        "reasoning_content": result["reasoning_content"],
        "tool_calls": result["tool_calls"],
        "finish_reason": result["finish_reason"],
    }
