"""Our own check of the Chat Completions wire rules, and accumulation of a stream's result.

`check_chat_stream` fails on any rule the real clients enforce (research: openai-python's
`ChatCompletionStreamState`, openai-node, the AI SDK) and returns the accumulated message, so
tests can compare results across splits, transports and fixtures. `check_responses_stream` does
the same for Responses API (`/v1/responses`) event streams.
"""

from __future__ import annotations

import functools
import json
import typing
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
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
    for name in TEXT_FIELDS:
        if isinstance(delta.get(name), str):
            result[name] += delta[name]
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


# --------------------------------------------------------------------------
# Responses API (`/v1/responses`)
# --------------------------------------------------------------------------
#
# Clients read different copies of the same data: openai-python's `ResponseStreamState` indexes
# `snapshot.output[output_index]` for deltas and returns `response.completed.response`; openai-node
# checks indices, item ids and types and lets `*.done` events overwrite what the deltas built;
# Codex takes tool calls only from `output_item.done`; UIs render the deltas. So the checker
# requires every copy to agree, and enforces the union of the clients' structural rules.

RESPONSE_LIFECYCLE = frozenset(
    {
        "response.created",
        "response.queued",
        "response.in_progress",
        "response.completed",
        "response.incomplete",
        "response.failed",
    }
)
RESPONSE_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
# Which item type each content/argument event may aim at, and which part types it needs.
_PART_EVENTS: dict[str, tuple[str, str]] = {
    "response.output_text.delta": ("message", "output_text"),
    "response.output_text.done": ("message", "output_text"),
    "response.refusal.delta": ("message", "refusal"),
    "response.refusal.done": ("message", "refusal"),
    "response.reasoning_text.delta": ("reasoning", "reasoning_text"),
    "response.reasoning_text.done": ("reasoning", "reasoning_text"),
}
_PART_TYPES_OF_ITEM = {"message": ("output_text", "refusal"), "reasoning": ("reasoning_text",)}
_ITEM_KIND_OF_EVENT: dict[str, str] = {
    **{etype: kind for etype, (kind, _) in _PART_EVENTS.items()},
    "response.function_call_arguments.delta": "function_call",
    "response.function_call_arguments.done": "function_call",
    "response.reasoning_summary_part.added": "reasoning",
    "response.reasoning_summary_part.done": "reasoning",
    "response.reasoning_summary_text.delta": "reasoning",
    "response.reasoning_summary_text.done": "reasoning",
}


@functools.cache
def _response_event_models() -> dict[str, type[Any]]:
    """`type` literal -> model class, for every member of the SDK's `ResponseStreamEvent` union."""
    from openai.types.responses import ResponseStreamEvent

    union = typing.get_args(ResponseStreamEvent)[0]  # Annotated[Union[...], PropertyInfo]
    models: dict[str, type[Any]] = {}
    for model in typing.get_args(union):
        (literal,) = typing.get_args(model.model_fields["type"].annotation)
        models[literal] = model
    return models


@functools.cache
def _response_event_adapter() -> Any:
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    return TypeAdapter(ResponseStreamEvent)


def _validate_response_event(event: dict[str, Any]) -> None:
    """Validate against the SDK union in pydantic strict mode.

    strict=True works for everything a correct server sends: JSON has no types it would coerce
    (ints are accepted for floats even in strict mode). It is stricter than any real client -
    openai-python validates (non-strict) only with `_strict_response_validation=True`, otherwise
    it `construct`s - which is what we want from our own output. Missing required fields fail in
    both modes; note openai-python 2.54 requires `usage.input_tokens_details.cache_write_tokens`.
    """
    import pydantic

    try:
        _response_event_adapter().validate_python(event, strict=True)
    except pydantic.ValidationError:
        # The union is not discriminated for pydantic (the SDK's discriminator is its own
        # PropertyInfo), so the union error lists all 53 members; report the one that matters.
        model = _response_event_models()[event["type"]]
        try:
            model.model_validate(event, strict=True)
        except pydantic.ValidationError as err:
            raise WireError(f"{event['type']} does not validate: {err}") from None
        raise WireError(f"{event['type']} does not validate against the union") from None


def _iter_sse_events(body: bytes) -> Iterator[tuple[str | None, str]]:
    """(`event:` name or None, joined `data:`) per SSE event; comments and blank events skipped."""
    text = body.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    if text.strip() and not text.endswith("\n\n"):
        # Spec-compliant SSE parsers (Codex's eventsource-stream) drop an unterminated event.
        raise WireError(f"body does not end with a blank line: {text[-80:]!r}")
    for block in text.split("\n\n"):
        name: str | None = None
        data: list[str] = []
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if key == "event":
                name = value
            elif key == "data":
                data.append(value)
        if data:
            yield name, "\n".join(data)


@dataclass
class _Part:
    """One content part (or reasoning summary part) as the deltas built it."""

    type: str
    text: str  # the initial part text plus every delta
    text_done: str | None = None  # from output_text.done / reasoning_text.done / ...
    part_done: dict[str, Any] | None = None  # from content_part.done / summary_part.done

    @property
    def closed(self) -> bool:
        return self.text_done is not None or self.part_done is not None


@dataclass
class _Item:
    index: int
    added: dict[str, Any]
    parts: list[_Part] = field(default_factory=list)  # message / reasoning `content`
    summary: list[_Part] = field(default_factory=list)  # reasoning `summary`
    arguments: str = ""
    arguments_done: str | None = None
    done: dict[str, Any] | None = None

    @property
    def type(self) -> str:
        return self.added["type"]


def _part_text(part: dict[str, Any]) -> str:
    return part["refusal"] if part.get("type") == "refusal" else part.get("text", "")


def check_responses_stream(
    body: bytes,
    *,
    consecutive: bool = True,
    allow_extra_types: Collection[str] = frozenset(),
) -> dict[str, Any]:
    """Validate an SSE body of Responses API events; return the final result.

    `consecutive` requires `sequence_number` to step by exactly 1 (what we emit); otherwise it
    need only increase. `allow_extra_types` lists event types outside the SDK union (such as
    the invented `response.required_action`) to let through unchecked, bar their numbering.
    """
    items: list[_Item] = []
    ids: set[str] = set()
    call_ids: set[str] = set()
    response_id: str | None = None
    last_seq: int | None = None
    terminal: dict[str, Any] | None = None
    error_seen = False
    count = 0
    for name, data in _iter_sse_events(body):
        if data.startswith("[DONE]"):
            raise WireError("data: [DONE] in a Responses stream (the API ends on its terminal event)")
        if terminal is not None:
            raise WireError(f"event after {terminal['type']}: {data[:80]}")
        try:
            event = json.loads(data)
        except ValueError:
            raise WireError(f"event data is not JSON: {data[:120]}") from None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise WireError(f"event without a string type: {data[:120]}")
        etype = event["type"]
        if name is not None and name != etype:
            raise WireError(f"`event: {name}` line disagrees with the data's type {etype!r}")

        # Numbering is checked for every event, allowed extras included.
        seq = event.get("sequence_number")
        if type(seq) is not int:
            raise WireError(f"{etype} without an integer sequence_number: {data[:120]}")
        if last_seq is not None and (seq != last_seq + 1 if consecutive else seq <= last_seq):
            raise WireError(f"sequence_number {seq} follows {last_seq} ({etype})")
        last_seq = seq

        if count == 0 and etype != "response.created":
            # openai-python and openai-node both throw: the snapshot starts from created.response.
            raise WireError(f"first event is {etype}, not response.created")
        count += 1
        if etype in allow_extra_types:
            continue
        if etype not in _response_event_models():
            # openai-node >=7.5 throws "Unhandled response stream event"; strict Python fails.
            raise WireError(f"event type {etype!r} is not in the Responses event union")
        _validate_response_event(event)
        if etype != "error" and event.get("error"):
            # openai-python's Stream raises APIError for any event with a truthy top-level "error".
            raise WireError(f"{etype} carries a top-level 'error' key: {data[:120]}")
        if error_seen and etype != "response.failed":
            raise WireError(f"{etype} after an error event (only response.failed may follow)")

        if etype in RESPONSE_LIFECYCLE:
            response = event["response"]
            if response_id is None:
                response_id = response["id"]
            elif response["id"] != response_id:
                raise WireError(f"{etype} has response.id {response['id']!r}, not {response_id!r}")
            expected_status = {
                "response.created": ("in_progress", "queued"),
                "response.queued": ("queued",),
                "response.in_progress": ("in_progress",),
                "response.completed": ("completed",),
                "response.incomplete": ("incomplete",),
                "response.failed": ("failed",),
            }[etype]
            if response.get("status") not in expected_status:
                raise WireError(f"{etype} with response.status {response.get('status')!r}")
            if etype in RESPONSE_TERMINAL:
                _check_terminal(event, items)
                terminal = event
            elif len(response["output"]) != len(items):
                # openai-node replaces its snapshot with every lifecycle event's response, so
                # later events' output_index would point past (or at the wrong) item.
                raise WireError(
                    f"{etype} lists {len(response['output'])} output items after {len(items)} were added"
                )
        elif etype == "error":
            error_seen = True
        elif etype == "response.output_item.added":
            items.append(_add_item(event, len(items), ids, call_ids))
        else:
            _apply_item_event(event, items)

    if count == 0:
        raise WireError("empty Responses stream")
    if terminal is None and not error_seen:
        # openai-python: "Didn't receive a response.completed event"; Codex: "stream closed
        # before response.completed".
        raise WireError("stream ended without response.completed/incomplete/failed")
    return _responses_result(items, terminal, error_seen)


def _add_item(event: dict[str, Any], count: int, ids: set[str], call_ids: set[str]) -> _Item:
    index, item = event["output_index"], event["item"]
    if index != count:
        # openai-node: "missing output at index"; openai-python appends regardless and then
        # indexes the wrong item (or raises IndexError).
        raise WireError(f"output_item.added at output_index {index}, but {count} items were added")
    if item["type"] == "function_call" and not item.get("id"):
        raise WireError(f"function_call item without an id: {item}")
    if "id" in item:
        if not isinstance(item["id"], str) or not item["id"]:
            raise WireError(f"item with an empty id: {item}")
        if item["id"] in ids:
            raise WireError(f"duplicate item id {item['id']!r}")
        ids.add(item["id"])
    if item.get("status", "in_progress") != "in_progress":
        raise WireError(f"item added with status {item.get('status')!r}: {item}")
    new = _Item(index=index, added=item)
    if item["type"] == "function_call":
        if not item["call_id"]:
            raise WireError(f"function_call item with an empty call_id: {item}")
        if item["call_id"] in call_ids:
            raise WireError(f"duplicate call_id {item['call_id']!r}")
        call_ids.add(item["call_id"])
        if item.get("status") != "in_progress":
            raise WireError(f"function_call added without status in_progress: {item}")
        if item["arguments"] != "":
            # The deltas are appended to it; a non-empty start would be sent twice by some servers.
            raise WireError(f"function_call added with arguments {item['arguments']!r}, not ''")
    elif item["type"] == "message":
        new.parts = [_Part(p["type"], _part_text(p)) for p in item["content"]]
    elif item["type"] == "reasoning":
        new.parts = [_Part(p["type"], p["text"]) for p in item.get("content") or []]
        new.summary = [_Part(p["type"], p["text"]) for p in item["summary"]]
    return new


def _target(event: dict[str, Any], items: list[_Item]) -> _Item:
    """The open item an event aims at, by output_index, of the right type, with its item_id."""
    etype, index = event["type"], event["output_index"]
    if not 0 <= index < len(items):
        # openai-python: IndexError; openai-node: "missing output at index".
        raise WireError(f"{etype} aims at output_index {index}; {len(items)} items exist")
    item = items[index]
    kind = _ITEM_KIND_OF_EVENT.get(etype)
    if kind is not None and item.type != kind:
        # openai-python asserts the type (AssertionError); openai-node main throws.
        raise WireError(f"{etype} aims at a {item.type} item (output_index {index})")
    if item.done is not None:
        raise WireError(f"{etype} for item {index} after its output_item.done")
    if "item_id" in event and event["item_id"] != item.added.get("id"):
        # openai-node main: "expected item_id 'x', got 'y'".
        raise WireError(
            f"{etype} has item_id {event['item_id']!r}, item {index} is {item.added.get('id')!r}"
        )
    return item


def _apply_item_event(event: dict[str, Any], items: list[_Item]) -> None:
    etype = event["type"]
    if "output_index" not in event:
        return  # audio events: no item state
    item = _target(event, items)

    def part_at(parts: list[_Part], index: int, what: str) -> _Part:
        if not 0 <= index < len(parts):
            raise WireError(f"{etype} for {what} {index} of item {item.index}, which has {len(parts)}")
        return parts[index]

    if etype == "response.output_item.done":
        _close_item(event["item"], item)
    elif etype == "response.content_part.added":
        part = event["part"]
        if part["type"] not in _PART_TYPES_OF_ITEM.get(item.type, ()):
            # openai-node silently skips a mismatched part; the next delta then finds nothing.
            raise WireError(f"{part['type']} part added to a {item.type} item")
        if event["content_index"] != len(item.parts):
            raise WireError(
                f"content_part.added at content_index {event['content_index']}, item has {len(item.parts)} parts"
            )
        item.parts.append(_Part(part["type"], _part_text(part)))
    elif etype == "response.content_part.done":
        part = part_at(item.parts, event["content_index"], "content part")
        _close_part(etype, part, event["part"])
    elif etype in _PART_EVENTS:
        part_type = _PART_EVENTS[etype][1]
        part = part_at(item.parts, event["content_index"], "content part")
        if part.type != part_type:
            raise WireError(f"{etype} aims at a {part.type} part")
        if part.closed:
            raise WireError(f"{etype} after the part was done")
        if etype.endswith(".delta"):
            part.text += event["delta"]
        else:
            done_text = event["refusal"] if part_type == "refusal" else event["text"]
            if done_text != part.text:
                raise WireError(f"{etype} text {done_text!r} != concat(deltas) {part.text!r}")
            part.text_done = done_text
    elif etype == "response.function_call_arguments.delta":
        if item.arguments_done is not None:
            raise WireError("function_call_arguments.delta after function_call_arguments.done")
        item.arguments += event["delta"]
    elif etype == "response.function_call_arguments.done":
        if item.arguments_done is not None:
            raise WireError("second function_call_arguments.done")
        if event["arguments"] != item.arguments:
            # openai-node overwrites with .done; openai-python keeps the deltas: they must agree.
            raise WireError(
                f"arguments.done {event['arguments']!r} != concat(deltas) {item.arguments!r}"
            )
        if event["name"] != item.added["name"]:
            raise WireError(f"arguments.done name {event['name']!r} != item name {item.added['name']!r}")
        item.arguments_done = event["arguments"]
    elif etype == "response.reasoning_summary_part.added":
        if event["summary_index"] != len(item.summary):
            raise WireError(
                f"summary_part.added at summary_index {event['summary_index']}, item has {len(item.summary)}"
            )
        item.summary.append(_Part(event["part"]["type"], event["part"]["text"]))
    elif etype == "response.reasoning_summary_part.done":
        _close_part(etype, part_at(item.summary, event["summary_index"], "summary part"), event["part"])
    elif etype in ("response.reasoning_summary_text.delta", "response.reasoning_summary_text.done"):
        part = part_at(item.summary, event["summary_index"], "summary part")
        if part.closed:
            raise WireError(f"{etype} after the summary part was done")
        if etype.endswith(".delta"):
            part.text += event["delta"]
        elif event["text"] != part.text:
            raise WireError(f"{etype} text {event['text']!r} != concat(deltas) {part.text!r}")
        else:
            part.text_done = event["text"]
    # Hosted-tool progress events (web_search_call.*, ...) only need an open target item.


def _close_part(etype: str, part: _Part, done: dict[str, Any]) -> None:
    if part.part_done is not None:
        raise WireError(f"second {etype} for one part")
    if done["type"] != part.type:
        raise WireError(f"{etype} part type {done['type']!r} != added {part.type!r}")
    if _part_text(done) != part.text:
        raise WireError(f"{etype} text {_part_text(done)!r} != concat(deltas) {part.text!r}")
    part.part_done = done


def _close_item(done: dict[str, Any], item: _Item) -> None:
    added = item.added
    for key in ("id", "type", "call_id"):
        if done.get(key) != added.get(key):
            # openai-node main rejects an output_item.done that changes id, type or call_id.
            raise WireError(f"output_item.done changes {key}: {added.get(key)!r} -> {done.get(key)!r}")
    if done.get("status", "completed") not in ("completed", "incomplete"):
        raise WireError(f"output_item.done with status {done.get('status')!r}")
    if item.type == "function_call":
        if done.get("status") != "completed":
            raise WireError(f"function_call done with status {done.get('status')!r}")
        if done["name"] != added["name"]:
            raise WireError(f"output_item.done renames the call: {added['name']!r} -> {done['name']!r}")
        if item.arguments_done is None:
            raise WireError(f"function_call {added['id']!r} done without function_call_arguments.done")
        if done["arguments"] != item.arguments:
            raise WireError(
                f"output_item.done arguments {done['arguments']!r} != streamed {item.arguments!r}"
            )
    elif item.type in ("message", "reasoning"):
        _check_done_parts(item, "content", done.get("content") or [], item.parts)
        if item.type == "reasoning":
            _check_done_parts(item, "summary", done["summary"], item.summary)
        if item.type == "message" and not any(_part_text(p) for p in done["content"]):
            # An empty assistant message renders as a blank bubble and, replayed as input,
            # is rejected by several servers.
            raise WireError(f"empty message item {added['id']!r}: {done['content']}")
    item.done = done


def _check_done_parts(item: _Item, key: str, got: list[dict[str, Any]], parts: list[_Part]) -> None:
    """The done item's parts must be exactly the streamed ones, each closed first."""
    if len(got) != len(parts):
        raise WireError(
            f"output_item.done {key} has {len(got)} parts, {len(parts)} were streamed (item {item.index})"
        )
    for n, (done_part, part) in enumerate(zip(got, parts)):
        if part.part_done is None:
            raise WireError(f"item {item.index} done before its {key} part {n} (no *part.done)")
        if part.type in ("output_text", "refusal", "reasoning_text") and part.text_done is None:
            raise WireError(f"item {item.index} {key} part {n} closed without its *.done text event")
        if done_part != part.part_done:
            raise WireError(f"output_item.done {key}[{n}] {done_part} != part.done {part.part_done}")


def _check_terminal(event: dict[str, Any], items: list[_Item]) -> None:
    if event["type"] == "response.failed":
        return  # a failed response may list whatever it got; clients do not use it
    still_open = [i.index for i in items if i.done is None]
    if still_open:
        raise WireError(f"{event['type']} with items still open: {still_open}")
    output = event["response"]["output"]
    done = [i.done for i in items]
    if output != done:
        # openai-python's get_final_response() and the Agents SDK use only this copy.
        raise WireError(
            f"{event['type']}.response.output differs from the output_item.done items:\n"
            f"  output: {json.dumps(output)[:400]}\n  done:   {json.dumps(done)[:400]}"
        )


def _responses_result(
    items: list[_Item], terminal: dict[str, Any] | None, error_seen: bool
) -> dict[str, Any]:
    final = [i.done if i.done is not None else i.added for i in items]
    text = reasoning = summary = ""
    calls: list[dict[str, Any]] = []
    for item in final:
        if item["type"] == "message":
            text += "".join(p.get("text", "") for p in item["content"] if p["type"] == "output_text")
        elif item["type"] == "reasoning":
            reasoning += "".join(p["text"] for p in item.get("content") or [])
            summary += "".join(p["text"] for p in item["summary"])
        elif item["type"] == "function_call":
            calls.append(
                {k: item[k] for k in ("name", "arguments", "call_id", "id")}
            )
    response = terminal["response"] if terminal is not None else None
    return {
        "text": text,
        "reasoning": reasoning,
        "reasoning_summary": summary,
        "calls": calls,
        "items": [item["type"] for item in final],
        "status": response["status"] if response is not None else "error",
        "usage": response.get("usage") if response is not None else None,
        "response_id": response["id"] if response is not None else None,
        "error": error_seen,
    }
