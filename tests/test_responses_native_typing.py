"""Upstream's own `function_call` items on the Responses API, typed by the declared schema
(native.py `ArgumentTyping`, as on Chat and Messages: tests/test_native_typing.py): stringified
values where the schema says otherwise, null and empty arguments, arguments sent as an object;
only a value is held until it closes, and every copy the client sees agrees (the deltas, `.done`,
`output_item.done`, `response.completed`'s output). Sans-IO at every one- and two-piece split of
the stream, then through a real mitmdump with the official OpenAI SDK as client.

The event shapes follow OpenAI's Responses streaming events (the API reference, "Streaming
events": `response.output_item.added` with a `function_call` item whose `arguments` is "",
`response.function_call_arguments.delta` {item_id, output_index, delta},
`response.function_call_arguments.done` {item_id, name, output_index, arguments},
`response.output_item.done` with the finished item, `response.completed` listing it).
"""

from __future__ import annotations

import copy
import json

import pytest
from harness import ScriptedUpstream, split_bytes
from responses import message_item, output_text_part, response_json, response_object, responses_sse, usage_object
from toolshim.report import BROKEN_STREAM_SHAPE, NATIVE, FlowOutcome, tally
from toolshim.responses import ResponsesStreamRewriter, rewrite_response_body
from toolshim.tools import RequestContext
from wire import check_responses_stream

SEARCH = {"type": "function", "name": "search", "parameters": {"type": "object", "properties": {
    "query": {"type": "string"}, "limit": {"type": "integer"}, "exact": {"type": "boolean"},
    "tags": {"type": "array", "items": {"type": "string"}}, "when": {"anyOf": [{"type": "number"}, {"type": "null"}]},
}}}
TOOLS = [SEARCH]
ARGUMENTS = '{"query": "42", "limit": "5", "exact": "TRUE", "tags": "[\\"a\\", \\"b\\"]", "when": "1.5"}'
TYPED = {"query": "42", "limit": 5, "exact": True, "tags": ["a", "b"], "when": 1.5}
_MISSING = object()


def context(tools=TOOLS) -> RequestContext:
    return RequestContext.from_request({"model": "m", "input": "hi", "tools": tools})


def native_events(
    pieces: list, *, done_arguments=_MISSING, item_arguments=_MISSING, text_before: str | None = None, name: str = "search"
) -> list[dict]:
    """A stream whose only call is upstream's own: its arguments in `pieces` (one delta each),
    `.done` and `output_item.done` carrying their join unless told otherwise."""
    joined = "".join(p for p in pieces if isinstance(p, str))
    done_arguments = joined if done_arguments is _MISSING else done_arguments
    item_arguments = joined if item_arguments is _MISSING else item_arguments
    events: list[dict] = [{"type": "response.created", "response": response_object("m")}]
    output: list[dict] = []
    if text_before is not None:
        ref = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
        done = message_item(text_before, msg_id="msg_1")
        events += [
            {"type": "response.output_item.added", "output_index": 0, "item": message_item(None, msg_id="msg_1", status="in_progress")},
            {"type": "response.content_part.added", **ref, "part": output_text_part()},
            {"type": "response.output_text.delta", **ref, "delta": text_before, "logprobs": []},
            {"type": "response.output_text.done", **ref, "text": text_before, "logprobs": []},
            {"type": "response.content_part.done", **ref, "part": output_text_part(text_before)},
            {"type": "response.output_item.done", "output_index": 0, "item": done},
        ]
        output.append(done)
    index = len(output)
    item = {"id": "fc_1", "type": "function_call", "status": "in_progress", "call_id": "call_1", "name": name, "arguments": ""}
    done_item = {**item, "status": "completed", "arguments": item_arguments}
    events.append({"type": "response.output_item.added", "output_index": index, "item": item})
    events += [{"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": index, "delta": p} for p in pieces]
    events.append({"type": "response.function_call_arguments.done", "item_id": "fc_1", "output_index": index, "name": name, "arguments": done_arguments})
    events.append({"type": "response.output_item.done", "output_index": index, "item": done_item})
    output.append(copy.deepcopy(done_item))
    events.append({"type": "response.completed", "response": response_object("m", status="completed", output=output, usage=usage_object())})
    return events


def rewrite(body: bytes, pieces: list[bytes] | None = None, tools=TOOLS) -> tuple[bytes, ResponsesStreamRewriter]:
    rewriter = ResponsesStreamRewriter(context(tools))
    out: list[bytes] = []
    for piece in pieces or [body]:
        out += rewriter.feed(piece)
    out += rewriter.close()
    assert rewriter.failure is None, rewriter.failure
    return b"".join(out), rewriter


def events_of(body: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: ")]


def every_copy(body: bytes) -> list:
    """The call's arguments as the client sees them: joined deltas, `.done`, `output_item.done`,
    `response.completed` (the wire check has made sure the four agree)."""
    result = check_responses_stream(body)
    events = events_of(body)
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    (done,) = [e["arguments"] for e in events if e["type"] == "response.function_call_arguments.done"]
    (item,) = [e["item"]["arguments"] for e in events if e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call"]
    (listed,) = [i["arguments"] for i in events[-1]["response"]["output"] if i["type"] == "function_call"]
    assert deltas == done == item == listed == result["calls"][0]["arguments"]
    return [json.loads(done)]


# -- the repairs --------------------------------------------------------------------------------


def test_stringified_values_are_typed_in_every_copy():
    body = responses_sse(native_events([ARGUMENTS[i : i + 3] for i in range(0, len(ARGUMENTS), 3)]))
    out, rewriter = rewrite(body)
    assert every_copy(out) == [TYPED]
    assert rewriter.stats.stream_repairs["typed_value"] == 4
    assert rewriter.changed


@pytest.mark.parametrize("pieces", [["null"], ["nu", "ll"], [], [""], ["  "]])
def test_null_or_empty_arguments_become_an_empty_object(pieces):
    out, rewriter = rewrite(responses_sse(native_events(pieces)))
    assert every_copy(out) == [{}]
    assert rewriter.stats.stream_repairs["empty_arguments"] == 1


def test_a_call_to_a_tool_without_parameters_gets_an_empty_object_for_null():
    tools = [{"type": "function", "name": "now"}]
    out, rewriter = rewrite(responses_sse(native_events(["null"], name="now")), tools=tools)
    assert every_copy(out) == [{}]


def test_arguments_sent_as_an_object_become_its_text_everywhere():
    """`.done` and the done item carry the arguments as a JSON object: the client gets a string
    (typed), the same as the deltas; without deltas, one delta carries it."""
    for pieces in (['{"limit": "5"}'], []):
        events = native_events(pieces, done_arguments={"limit": "5"}, item_arguments={"limit": "5"})
        out, rewriter = rewrite(responses_sse(events))
        assert every_copy(out) == [{"limit": 5}], pieces
        assert rewriter.stats.stream_repairs["object_arguments"] == 1
        assert rewriter.stats.stream_repairs["typed_value"] == 1


def test_values_that_fit_pass_byte_for_byte():
    arguments = '{"query": "x", "limit": 5, "exact": "maybe", "unknown": "7"}'
    body = responses_sse(native_events([arguments[:9], arguments[9:30], arguments[30:]], text_before="Searching."))
    out, rewriter = rewrite(body)
    assert out == body
    assert not rewriter.stats.stream_repairs and not rewriter.changed


def test_a_copy_without_deltas_is_typed_and_gets_one_delta():
    """An upstream that streams no deltas, only `.done`: the copies are typed and one delta is
    added before `.done`, so that the deltas agree with it."""
    out, rewriter = rewrite(responses_sse(native_events([], done_arguments=ARGUMENTS, item_arguments=ARGUMENTS)))
    assert every_copy(out) == [TYPED]
    assert rewriter.stats.stream_repairs["typed_value"] == 4


def test_only_the_value_is_held_and_later_events_keep_their_bytes():
    pieces = ['{"query": "abc", ', '"limit": "', "5", '"}']
    body = responses_sse(native_events(pieces, text_before="Let me look."))
    raw_events = [e + b"\n\n" for e in body.split(b"\n\n") if e]
    rewriter = ResponsesStreamRewriter(context())
    sent = [b"".join(rewriter.feed(raw)) for raw in raw_events]
    deltas = [events_of(s)[0]["delta"] for s in sent if b"function_call_arguments.delta" in s]
    assert deltas == ['{"query": "abc", ', '"limit": ', "", "5}"]  # the value is held until its string closes
    call_added = next(i for i, raw in enumerate(raw_events) if b'"type":"function_call"' in raw)
    changed = [i for i, (a, b) in enumerate(zip(raw_events, sent)) if a != b and i >= call_added]  # (a message's added events wait for its text)
    named = [events_of(raw_events[i])[0]["type"] for i in changed]
    assert named == ["response.function_call_arguments.delta"] * 3 + [
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert every_copy(b"".join(sent)) == [{"query": "abc", "limit": 5}]


def test_a_held_value_cut_off_by_the_end_goes_as_it_came():
    events = native_events(['{"limit": "', "5"])[:-3]  # no .done, no done item, no completed
    out, rewriter = rewrite(responses_sse(events))
    deltas = "".join(e["delta"] for e in events_of(out) if e["type"] == "response.function_call_arguments.delta")
    assert deltas == '{"limit": "5'  # nothing lost
    assert not rewriter.stats.stream_repairs


def test_a_native_call_after_a_call_from_markup_is_typed_and_every_copy_agrees():
    markup = '<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>'
    events = native_events(['{"limit": "', '7"}'], text_before=markup)
    out, rewriter = rewrite(responses_sse(events))
    result = check_responses_stream(out)
    assert [(c["name"], json.loads(c["arguments"])) for c in result["calls"]] == [("search", {"query": "q"}), ("search", {"limit": 7})]
    assert rewriter.stats.calls == 1 and rewriter.stats.stream_repairs["typed_value"] == 1


# -- bad input: as it came, one note, nothing raised ---------------------------------------------


def test_a_delta_that_is_no_text_passes_unchanged_with_one_note():
    events = native_events(['{"limit": "5"', 5, 6, "}"])
    out, rewriter = rewrite(responses_sse(events))
    sent = [e for e in events_of(out) if e["type"] == "response.function_call_arguments.delta"]
    assert [e["delta"] for e in sent] == ['{"limit": 5', 5, 6, "}"]
    assert len(rewriter.stats.notes) == 1 and "fc_1" in rewriter.stats.notes[0]


def test_a_copy_that_disagrees_with_the_deltas_passes_unchanged_with_one_note():
    events = native_events(['{"limit": "5"}'], done_arguments='{"limit": "6"}', item_arguments='{"limit": "6"}')
    out, rewriter = rewrite(responses_sse(events))
    sent = events_of(out)
    assert [e["arguments"] for e in sent if e["type"] == "response.function_call_arguments.done"] == ['{"limit": "6"}']
    assert "".join(e["delta"] for e in sent if e["type"] == "response.function_call_arguments.delta") == '{"limit": 5}'
    assert len(rewriter.stats.notes) == 1


def odd(events: list[dict], etype: str, change) -> list[dict]:
    for e in events:
        if e["type"] == etype:
            change(e)
    return events


@pytest.mark.parametrize("change", [
    lambda es: odd(es, "response.function_call_arguments.delta", lambda e: e.pop("delta")),
    lambda es: odd(es, "response.function_call_arguments.delta", lambda e: e.update(delta={"limit": "5"})),
    lambda es: odd(es, "response.function_call_arguments.done", lambda e: e.update(arguments=7)),
    lambda es: odd(es, "response.function_call_arguments.done", lambda e: e.pop("arguments")),
    lambda es: odd(es, "response.output_item.done", lambda e: e["item"].update(arguments=None)),
    lambda es: odd(es, "response.output_item.added", lambda e: e["item"].update(name=None, id=None, arguments={"limit": "5"})),
    lambda es: odd(es, "response.function_call_arguments.delta", lambda e: e.pop("item_id")),
    lambda es: odd(es, "response.function_call_arguments.delta", lambda e: e.update(item_id="fc_other")),
    lambda es: [e for e in es if e["type"] != "response.function_call_arguments.done"],
    lambda es: [e for e in es if e["type"] != "response.output_item.done"],
    lambda es: odd(es, "response.completed", lambda e: e["response"].update(output="x")),
])
def test_odd_shapes_raise_nothing(change):
    events = change(native_events(['{"limit": "', '5"}'], text_before="Hi."))
    rewrite(b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events))  # (asserts no failure)


# -- counted and annotated like Chat's -----------------------------------------------------------


def test_repairs_are_counted_as_the_native_broken_stream_shape():
    out, rewriter = rewrite(responses_sse(native_events(['{"limit": "5", "exact": "true"}'])))
    assert tally(rewriter.stats) == {NATIVE: {BROKEN_STREAM_SHAPE: 2}}
    comment = FlowOutcome(rewriter.stats, changed=rewriter.changed).comment()
    assert "upstream's own calls (typed_value ×2)" in comment


# -- at every split -----------------------------------------------------------------------------


def test_every_one_and_two_piece_split_gives_the_same_bytes():
    """Nothing in a native call is minted at random: the bytes themselves must not depend on
    how the stream was cut. A message comes first (the call is renumbered after it); the cuts
    run from the call's first event on (the message's are the text path's, cut everywhere in
    test_core_responses)."""
    pieces = [ARGUMENTS[i : i + 9] for i in range(0, len(ARGUMENTS), 9)]
    body = responses_sse(native_events(pieces, text_before="Looking that up."))
    whole, _ = rewrite(body)
    assert every_copy(whole) == [TYPED]
    first = body.rfind(b"event: ", 0, body.index(b'"type":"function_call"'))
    for cut in range(first, len(body)):
        out, rewriter = rewrite(body, split_bytes(body, [cut]))
        assert out == whole, cut
        assert rewriter.stats.stream_repairs["typed_value"] == 4, cut


@pytest.mark.parametrize("pieces", [["nu", "ll"], [" ", ""]])
def test_every_split_of_null_or_empty_arguments_gives_the_same_bytes(pieces):
    body = responses_sse(native_events(pieces))
    whole, _ = rewrite(body)
    assert every_copy(whole) == [{}]
    for cut in range(1, len(body)):
        assert rewrite(body, split_bytes(body, [cut]))[0] == whole, cut


# -- whole bodies and lists -----------------------------------------------------------------------


def native_body(arguments) -> dict:
    body = response_json("m", None, tools=TOOLS)
    body["output"] = [{"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_1", "name": "search", "arguments": arguments}]
    return body


def test_a_non_streaming_body_gets_typed_arguments():
    for arguments, expected in ((ARGUMENTS, TYPED), ("null", {}), ("", {}), ({"limit": "5"}, {"limit": 5})):
        body = native_body(arguments)
        stats = rewrite_response_body(body, context())
        assert stats is not None and sum(stats.stream_repairs.values()) >= 1, arguments
        assert json.loads(body["output"][0]["arguments"]) == expected, arguments


def test_a_non_streaming_body_whose_arguments_fit_is_untouched():
    body = native_body('{"query": "x", "limit": 5}')
    assert rewrite_response_body(body, context()) is None


def test_a_terminal_event_listing_items_never_streamed_gets_typed_arguments():
    events = native_events([ARGUMENTS])
    body = responses_sse([events[0], events[-1]])  # created, completed: nothing streamed item by item
    listed = events_of(rewrite(body)[0])[-1]["response"]["output"]
    assert json.loads(listed[0]["arguments"]) == TYPED


# -- through mitmdump, with the OpenAI SDK -------------------------------------------------------


def test_the_openai_sdk_gets_typed_arguments_from_a_stream(upstream: ScriptedUpstream, openai_client, unique_model):
    pieces = [ARGUMENTS[i : i + 5] for i in range(0, len(ARGUMENTS), 5)]
    body = responses_sse(native_events(pieces, text_before="Searching."))
    upstream.add(unique_model, headers={"content-type": "text/event-stream"}, chunks=[e + b"\n\n" for e in body.split(b"\n\n") if e])

    # responses.create(stream=True): the events as they come, accumulated here
    deltas, copies = "", []
    for event in openai_client.responses.create(model=unique_model, input="Find 42", tools=TOOLS, stream=True):
        if event.type == "response.function_call_arguments.delta":
            deltas += event.delta
        elif event.type == "response.function_call_arguments.done":
            copies.append(event.arguments)
        elif event.type == "response.output_item.done" and event.item.type == "function_call":
            copies.append(event.item.arguments)
        elif event.type == "response.completed":
            copies += [item.arguments for item in event.response.output if item.type == "function_call"]
    assert copies == [deltas] * 3
    assert json.loads(deltas) == TYPED

    # responses.stream(): the SDK's own accumulation (the snapshot of the deltas, the final response)
    with openai_client.responses.stream(model=unique_model, input="Find 42", tools=TOOLS) as stream:
        snapshots = [event.snapshot for event in stream if event.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    (call,) = [item for item in final.output if item.type == "function_call"]
    assert json.loads(snapshots[-1]) == json.loads(call.arguments) == TYPED
    assert (call.name, call.call_id, final.output_text) == ("search", "call_1", "Searching.")


def test_the_openai_sdk_gets_an_empty_object_for_null_arguments_in_a_body(upstream: ScriptedUpstream, openai_client, unique_model):
    upstream.add_json(unique_model, native_body("null"))
    response = openai_client.responses.create(model=unique_model, input="Find", tools=TOOLS)
    assert json.loads(response.output[0].arguments) == {}
