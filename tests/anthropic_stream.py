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
