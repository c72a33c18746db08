"""Builders of upstream OpenAI Responses API (`/v1/responses`) streams and bodies.

A scripted upstream (vLLM, the Codex app-server, LM Studio ...) answers `/v1/responses` with a
stream of typed events, not Chat chunks. These helpers produce the canonical stream the
research found to satisfy every known client (openai-python, openai-node, Codex, the Agents SDK):
`response.created` first, items opened and closed one at a time with `output_index` 0..n-1,
`sequence_number` 0..n-1, and every copy of the text agreeing (the deltas, `*.done`,
`output_item.done` and `response.completed.response.output`). No `data: [DONE]`: the Responses
API ends with its terminal event.

Text pieces are sent verbatim as deltas, so tests can leak tool-call markup into them exactly as a
misconfigured server would. The builders emit only what an upstream emits for *text*; function
call items are what the addon produces, so tests that need them write them out explicitly.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

CREATED_AT = 1_700_000_000
RESP_ID = "resp_test"
MSG_ID = "msg_test"
RS_ID = "rs_test"


# --------------------------------------------------------------------------
# Objects
# --------------------------------------------------------------------------


def usage_object(
    input_tokens: int = 1,
    output_tokens: int = 1,
    *,
    cached_tokens: int = 0,
    reasoning_tokens: int = 0,
    cache_write_tokens: int | None = 0,
) -> dict[str, Any]:
    """A `ResponseUsage`. openai-python 2.54 made `input_tokens_details.cache_write_tokens`
    required, so it is sent by default (older SDKs keep it as an extra field); pass None to omit
    it, as servers built against older schemas (vLLM, LM Studio) do."""
    input_details: dict[str, Any] = {"cached_tokens": cached_tokens}
    if cache_write_tokens is not None:
        input_details["cache_write_tokens"] = cache_write_tokens
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": input_details,
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }


def response_object(
    model: str,
    *,
    status: str = "in_progress",
    output: Sequence[Mapping[str, Any]] | None = None,
    usage: Mapping[str, Any] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    resp_id: str = RESP_ID,
    created_at: int = CREATED_AT,
    tool_choice: Any = "auto",
    parallel_tool_calls: bool = True,
    reasoning: Mapping[str, Any] | None = None,
    error: Mapping[str, Any] | None = None,
    incomplete_details: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The full `Response` object of lifecycle events and non-streaming bodies.

    Carries the fields the Python model requires (id, object, created_at, model, output,
    tool_choice, tools, parallel_tool_calls) plus the ones openai-node's `interface Response`
    requires as nullable (error, incomplete_details, instructions, metadata, temperature, top_p),
    and status/usage, which the SDKs and Codex read although the schema makes them optional.
    """
    return {
        "id": resp_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "model": model,
        "output": [copy.deepcopy(dict(item)) for item in output or ()],
        "tool_choice": copy.deepcopy(tool_choice),
        "tools": [copy.deepcopy(dict(tool)) for tool in tools or ()],
        "parallel_tool_calls": parallel_tool_calls,
        "error": copy.deepcopy(dict(error)) if error is not None else None,
        "incomplete_details": (
            copy.deepcopy(dict(incomplete_details)) if incomplete_details is not None else None
        ),
        "instructions": None,
        "metadata": {},
        "temperature": None,
        "top_p": None,
        "max_output_tokens": None,
        "previous_response_id": None,
        "reasoning": copy.deepcopy(dict(reasoning)) if reasoning is not None else None,
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "usage": copy.deepcopy(dict(usage)) if usage is not None else None,
    }


def output_text_part(text: str = "") -> dict[str, Any]:
    """An `output_text` content part; `logprobs: []` because openai-node types require it."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_text_part(text: str = "") -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def message_item(
    text: str | None, *, msg_id: str = MSG_ID, status: str = "completed"
) -> dict[str, Any]:
    """An assistant `message` output item with one output_text part (none if `text` is None)."""
    content = [] if text is None else [output_text_part(text)]
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def reasoning_item(
    text: str | None, *, rs_id: str = RS_ID, status: str = "completed"
) -> dict[str, Any]:
    """A `reasoning` item carrying raw CoT as a `reasoning_text` content part (vLLM's shape);
    `summary: []` is required by the schema even when no summary is produced."""
    item: dict[str, Any] = {"id": rs_id, "type": "reasoning", "summary": [], "status": status}
    item["content"] = [] if text is None else [reasoning_text_part(text)]
    return item


def function_tool(
    name: str,
    parameters: Mapping[str, Any] | None = None,
    *,
    description: str | None = None,
    strict: bool | None = None,
) -> dict[str, Any]:
    """A Responses function tool: flat, unlike Chat's nested `{"function": {...}}`."""
    tool: dict[str, Any] = {
        "type": "function",
        "name": name,
        "parameters": copy.deepcopy(dict(parameters)) if parameters is not None else None,
        "strict": strict,
    }
    if description is not None:
        tool["description"] = description
    return tool


def responses_request(
    model: str,
    input: str | Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    stream: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    """A `/v1/responses` request body, as a client posts it."""
    body: dict[str, Any] = {"model": model, "input": copy.deepcopy(input), "stream": stream}
    if tools is not None:
        body["tools"] = [copy.deepcopy(dict(tool)) for tool in tools]
    body.update(extra)
    return body


# --------------------------------------------------------------------------
# Streams
# --------------------------------------------------------------------------


def responses_events(
    model: str,
    text_pieces: Iterable[str],
    *,
    reasoning_pieces: Iterable[str] | None = None,
    msg_id: str = MSG_ID,
    rs_id: str = RS_ID,
    resp_id: str = RESP_ID,
    tools: Sequence[Mapping[str, Any]] | None = None,
    usage: Mapping[str, Any] | None = None,
    created_at: int = CREATED_AT,
    in_progress: bool = True,
) -> list[dict[str, Any]]:
    """The events of a canonical stream, without `sequence_number` (see `number_events`).

    response.created, response.in_progress, then an optional reasoning item (output_index 0,
    `reasoning_text.delta` events inside a `reasoning_text` content part), then the message item
    with one output_text delta per piece, then response.completed holding the done items.

    `reasoning_pieces=None` means no reasoning item; `text_pieces` empty means no message item
    (a message without content is itself a wire error). Pieces may be "": servers do send empty
    deltas. `usage=None` sends the default `usage_object()` on response.completed.
    """
    texts = list(text_pieces)
    common = {"model": model, "resp_id": resp_id, "tools": tools, "created_at": created_at}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response_object(**common)}
    ]
    if in_progress:
        events.append({"type": "response.in_progress", "response": response_object(**common)})
    done_items: list[dict[str, Any]] = []

    if reasoning_pieces is not None:
        pieces = list(reasoning_pieces)
        full = "".join(pieces)
        index = len(done_items)
        ref = {"item_id": rs_id, "output_index": index}
        part_ref = {**ref, "content_index": 0}
        events.append(
            {
                "type": "response.output_item.added",
                "output_index": index,
                "item": reasoning_item(None, rs_id=rs_id, status="in_progress"),
            }
        )
        events.append(
            {"type": "response.content_part.added", **part_ref, "part": reasoning_text_part()}
        )
        events += [
            {"type": "response.reasoning_text.delta", **part_ref, "delta": piece}
            for piece in pieces
        ]
        events.append({"type": "response.reasoning_text.done", **part_ref, "text": full})
        events.append(
            {"type": "response.content_part.done", **part_ref, "part": reasoning_text_part(full)}
        )
        done = reasoning_item(full, rs_id=rs_id)
        events.append({"type": "response.output_item.done", "output_index": index, "item": done})
        done_items.append(done)

    if texts:
        full = "".join(texts)
        index = len(done_items)
        part_ref = {"item_id": msg_id, "output_index": index, "content_index": 0}
        events.append(
            {
                "type": "response.output_item.added",
                "output_index": index,
                "item": message_item(None, msg_id=msg_id, status="in_progress"),
            }
        )
        events.append(
            {"type": "response.content_part.added", **part_ref, "part": output_text_part()}
        )
        # `logprobs: []` on every delta and on .done: required by the types of both SDKs.
        events += [
            {"type": "response.output_text.delta", **part_ref, "delta": piece, "logprobs": []}
            for piece in texts
        ]
        events.append(
            {"type": "response.output_text.done", **part_ref, "text": full, "logprobs": []}
        )
        events.append(
            {"type": "response.content_part.done", **part_ref, "part": output_text_part(full)}
        )
        done = message_item(full, msg_id=msg_id)
        events.append({"type": "response.output_item.done", "output_index": index, "item": done})
        done_items.append(done)

    events.append(
        {
            "type": "response.completed",
            "response": response_object(
                **common,
                status="completed",
                output=done_items,
                usage=usage if usage is not None else usage_object(),
            ),
        }
    )
    return events


def number_events(events: Iterable[Mapping[str, Any]], start: int = 0) -> list[dict[str, Any]]:
    """Copies of `events` with `sequence_number` start, start+1, ... (existing ones overwritten).

    `type` and `sequence_number` come first, as servers serialise them, for readable bodies.
    """
    out = []
    for n, event in enumerate(events, start):
        rest = {k: v for k, v in event.items() if k not in ("type", "sequence_number")}
        out.append({"type": event["type"], "sequence_number": n, **copy.deepcopy(rest)})
    return out


def responses_sse(events: Iterable[Mapping[str, Any]]) -> bytes:
    """An SSE body: `event: <type>` + `data: <compact JSON>` + blank line per event.

    A missing `sequence_number` becomes the event's position (0..n-1); present ones are kept,
    so tests can send deliberately wrong numbering. Non-ASCII is kept verbatim, as real servers
    send it. No `[DONE]`: the Responses API sends none.
    """
    out: list[str] = []
    for position, event in enumerate(events):
        if "sequence_number" not in event:
            event = number_events([event], start=position)[0]
        payload = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
        out.append(f"event: {event['type']}\ndata: {payload}\n\n")
    return "".join(out).encode("utf-8")


def response_json(
    model: str,
    text: str | None,
    *,
    reasoning: str | None = None,
    msg_id: str = MSG_ID,
    rs_id: str = RS_ID,
    resp_id: str = RESP_ID,
    tools: Sequence[Mapping[str, Any]] | None = None,
    usage: Mapping[str, Any] | None = None,
    status: str = "completed",
    created_at: int = CREATED_AT,
) -> dict[str, Any]:
    """A non-streaming `/v1/responses` body: [reasoning item], one message item holding `text`.

    `text=None` leaves the message item out; `usage=None` sends the default `usage_object()`.
    """
    output: list[dict[str, Any]] = []
    if reasoning is not None:
        output.append(reasoning_item(reasoning, rs_id=rs_id))
    if text is not None:
        output.append(message_item(text, msg_id=msg_id))
    return response_object(
        model,
        status=status,
        output=output,
        usage=usage if usage is not None else usage_object(),
        tools=tools,
        resp_id=resp_id,
        created_at=created_at,
    )
