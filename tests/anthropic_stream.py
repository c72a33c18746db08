"""Builders of upstream Anthropic Messages API streams and bodies, for the tests.

Every event goes as `event: TYPE` + `data: JSON` (the Anthropic SDK dispatches on the event
line); text and thinking pieces are sent verbatim, so tests can leak markup into them exactly as
a misconfigured server (MiniMax's /anthropic, vLLM, llama.cpp) does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

MESSAGE_ID = "msg_test"


def sse(events: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(
        f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'), ensure_ascii=False)}\n\n".encode()
        for event in events
    )


def message_start(model: str) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": MESSAGE_ID, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 12, "output_tokens": 1},
        },
    }


def block_events(index: int, kind: str, pieces: Sequence[str], signature: str | None = None) -> list[dict[str, Any]]:
    """A text or thinking block streamed one piece per delta."""
    start = {"type": "text", "text": ""} if kind == "text" else {"type": "thinking", "thinking": "", "signature": ""}
    delta_type = "text_delta" if kind == "text" else "thinking_delta"
    events = [{"type": "content_block_start", "index": index, "content_block": start}]
    events += [{"type": "content_block_delta", "index": index, "delta": {"type": delta_type, kind: piece}} for piece in pieces]
    if signature is not None:
        events.append({"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": signature}})
    events.append({"type": "content_block_stop", "index": index})
    return events


def tool_use_events(index: int, call_id: str, name: str, pieces: Sequence[str], start_input: Any = None) -> list[dict[str, Any]]:
    events = [{"type": "content_block_start", "index": index, "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": start_input if start_input is not None else {}}}]
    events += [{"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}} for piece in pieces]
    events.append({"type": "content_block_stop", "index": index})
    return events


def message_end(stop_reason: str = "end_turn", output_tokens: int = 30) -> list[dict[str, Any]]:
    return [
        {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": None}, "usage": {"output_tokens": output_tokens}},
        {"type": "message_stop"},
    ]


def stream(model: str, *blocks: list[dict[str, Any]], stop_reason: str = "end_turn", ping: bool = True) -> bytes:
    events = [message_start(model)]
    if ping:
        events.append({"type": "ping"})
    for block in blocks:
        events += block
    return sse([*events, *message_end(stop_reason)])


def message_body(model: str, content: list[dict[str, Any]], stop_reason: str = "end_turn") -> dict[str, Any]:
    return {
        "id": MESSAGE_ID, "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": stop_reason, "stop_sequence": None, "usage": {"input_tokens": 12, "output_tokens": 30},
    }


BASH_TOOL = {
    "name": "Bash",
    "description": "Run a shell command.",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}


# -- our own check of the Messages wire rules -------------------------------------------------------


class MessagesWireError(AssertionError):
    pass


def check_messages_stream(body: bytes) -> dict[str, Any]:
    """Validate an Anthropic SSE body against the rules the SDKs enforce, and accumulate it with
    the `anthropic` SDK's own accumulator. Returns {"content": [blocks as dicts], "stop_reason"}.

    Rules: every event has an `event:` line naming its type; message_start first; blocks
    numbered 0, 1, 2… in order, each started once and stopped once, deltas only inside an open
    block, of the block's kind; a tool_use starts with `input: {}` and its `input_json_delta`
    pieces are non-empty and each running concatenation a JSON prefix the TypeScript SDK's
    partial parser accepts; stop_reason is tool_use when a tool_use block was sent."""
    from anthropic.lib.streaming._messages import accumulate_event
    from toolshim.messages import JsonPrefix

    snapshot = None
    open_blocks: dict[int, str] = {}
    closed: set[int] = set()
    prefixes: dict[int, JsonPrefix] = {}
    started = False
    stop_reason = None
    saw_tool_use = False
    for block in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        if not block.strip():
            continue
        lines = block.decode().split("\n")
        names = [line[6:].strip() for line in lines if line.startswith("event:")]
        data = "\n".join(line[5:].lstrip() for line in lines if line.startswith("data:"))
        if not data:
            continue
        try:
            event = json.loads(data)
        except ValueError:  # unreadable: toolshim passes it as it came; not ours to judge
            continue
        kind = event.get("type")
        if names != [kind]:
            raise MessagesWireError(f"event line {names} does not name the type {kind!r}")
        if not started and kind != "message_start":
            if kind in ("ping", "error"):
                continue
            raise MessagesWireError(f"{kind} before message_start")
        started = True
        index = event.get("index")
        if kind == "content_block_start":
            if index != len(open_blocks) + len(closed) or index in closed or index in open_blocks:
                raise MessagesWireError(f"block {index} started out of order (open {sorted(open_blocks)}, closed {len(closed)})")
            block_kind = event["content_block"]["type"]
            open_blocks[index] = block_kind
            if block_kind == "tool_use":
                saw_tool_use = True
                if event["content_block"].get("input") != {}:
                    raise MessagesWireError(f"tool_use {index} starts with input {event['content_block'].get('input')!r}")
                prefixes[index] = JsonPrefix()
        elif kind == "content_block_delta":
            if index not in open_blocks:
                raise MessagesWireError(f"delta for block {index}, which is not open")
            delta = event["delta"]
            allowed = {"text": {"text_delta", "citations_delta"}, "thinking": {"thinking_delta", "signature_delta"}, "tool_use": {"input_json_delta"}}.get(open_blocks[index])
            if allowed is not None and delta["type"] not in allowed:
                raise MessagesWireError(f"{delta['type']} in a {open_blocks[index]} block")
            if delta["type"] == "input_json_delta":
                piece = delta["partial_json"]
                if not piece:
                    raise MessagesWireError(f"empty partial_json in block {index}")
                if not prefixes[index].feed(piece):
                    raise MessagesWireError(f"partial_json {piece!r} breaks the arguments of block {index}")
        elif kind == "content_block_stop":
            if index not in open_blocks:
                raise MessagesWireError(f"stop for block {index}, which is not open")
            closed.add(index)
            del open_blocks[index]
        elif kind == "message_delta":
            if open_blocks:
                raise MessagesWireError(f"message_delta with blocks open: {sorted(open_blocks)}")
            stop_reason = event["delta"].get("stop_reason")
        if kind in ("message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta"):
            snapshot = accumulate_event(event=event, current_snapshot=snapshot)
    if saw_tool_use and stop_reason not in ("tool_use", "max_tokens", None):
        raise MessagesWireError(f"tool_use sent but stop_reason {stop_reason!r}")
    content = [b.model_dump(exclude_none=True) for b in snapshot.content] if snapshot is not None else []
    return {"content": content, "stop_reason": stop_reason}
