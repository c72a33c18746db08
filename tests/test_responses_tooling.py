"""The Responses API test tooling: builders in `responses.py`, `check_responses_stream` in `wire.py`.

The checker is only worth something if it rejects what real clients choke on, so each rule is
proven with a mutation of a canonical stream, and the builder's stream is fed to the real SDK.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from openai import omit
from openai._models import construct_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from harness import iter_sse_data
from responses import (
    MSG_ID,
    function_tool,
    message_item,
    number_events,
    response_json,
    responses_events,
    responses_request,
    responses_sse,
    usage_object,
)
from wire import WireError, check_responses_stream

MODEL = "toolshim-responses-test"
TOOL = function_tool(
    "get_weather",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
LEAKED = ["Let me check. ", "<tool_call>{\"name\": \"get_weather\", ", "\"arguments\": {}}</tool_call>"]
ARG_PIECES = ['{"city":', ' "Paris"}']


def function_call_events(
    output_index: int, *, fc_id: str = "fc_1", call_id: str = "call_1"
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A function_call item's events, written out as research §2.4 shows, and its done item."""
    arguments = "".join(ARG_PIECES)
    ref = {"item_id": fc_id, "output_index": output_index}
    done = {
        "id": fc_id,
        "type": "function_call",
        "call_id": call_id,
        "name": "get_weather",
        "arguments": arguments,
        "status": "completed",
    }
    events = [
        {
            "type": "response.output_item.added",
            "output_index": output_index,
            "item": {**done, "arguments": "", "status": "in_progress"},
        },
        *(
            {"type": "response.function_call_arguments.delta", **ref, "delta": piece}
            for piece in ARG_PIECES
        ),
        {
            "type": "response.function_call_arguments.done",
            **ref,
            "name": "get_weather",
            "arguments": arguments,
        },
        {"type": "response.output_item.done", "output_index": output_index, "item": done},
    ]
    return events, done


def with_calls(events: list[dict[str, Any]], *calls: tuple[str, str]) -> list[dict[str, Any]]:
    """`events` with function_call items (fc_id, call_id) appended before response.completed."""
    events = copy.deepcopy(events)
    completed = events.pop()
    assert completed["type"] == "response.completed"
    for fc_id, call_id in calls:
        index = len(completed["response"]["output"])
        fc_events, done = function_call_events(index, fc_id=fc_id, call_id=call_id)
        events += fc_events
        completed["response"]["output"].append(done)
    return [*events, completed]


def canonical() -> list[dict[str, Any]]:
    """One message item (output_index 0) and one function_call item (1), unnumbered."""
    return with_calls(responses_events(MODEL, LEAKED, tools=[TOOL]), ("fc_1", "call_1"))


def find(events: list[dict[str, Any]], etype: str, nth: int = 0) -> int:
    return [i for i, e in enumerate(events) if e["type"] == etype][nth]


# --------------------------------------------------------------------------
# Accepted streams
# --------------------------------------------------------------------------


def test_canonical_stream_passes() -> None:
    result = check_responses_stream(responses_sse(canonical()))
    assert result["text"] == "".join(LEAKED)
    assert result["items"] == ["message", "function_call"]
    assert result["calls"] == [
        {"name": "get_weather", "arguments": '{"city": "Paris"}', "call_id": "call_1", "id": "fc_1"}
    ]
    assert result["status"] == "completed"
    assert result["usage"] == usage_object()
    assert result["response_id"] == "resp_test"


def test_builder_stream_with_reasoning_passes() -> None:
    body = responses_sse(responses_events(MODEL, LEAKED, reasoning_pieces=["Hmm, ", "weather."]))
    result = check_responses_stream(body)
    assert result["items"] == ["reasoning", "message"]
    assert result["reasoning"] == "Hmm, weather."
    assert result["text"] == "".join(LEAKED)


def test_sse_framing_and_numbering() -> None:
    body = responses_sse(responses_events(MODEL, ["a"]))
    text = body.decode()
    assert "[DONE]" not in text and text.endswith("\n\n")
    blocks = text.split("\n\n")[:-1]
    assert all(b.startswith("event: ") and "\ndata: " in b for b in blocks)
    events = [json.loads(d) for d in iter_sse_data(body)]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    # Existing numbers are kept, so tests can send deliberately wrong ones.
    kept = [json.loads(d) for d in iter_sse_data(responses_sse(number_events(events, start=7)))]
    assert kept[0]["sequence_number"] == 7


def test_non_ascii_and_markup_sent_verbatim() -> None:
    pieces = ["<|tool_calls_section_begin|>", "héllo → 世界"]
    body = responses_sse(responses_events(MODEL, pieces))
    assert "héllo → 世界".encode() in body
    deltas = [
        json.loads(d)["delta"]
        for d in iter_sse_data(body)
        if json.loads(d)["type"] == "response.output_text.delta"
    ]
    assert deltas == pieces


def test_non_consecutive_numbering_is_optional() -> None:
    events = number_events(canonical())
    for n, event in enumerate(events):
        event["sequence_number"] = 10 + 3 * n
    body = responses_sse(events)
    with pytest.raises(WireError, match="sequence_number"):
        check_responses_stream(body)
    assert check_responses_stream(body, consecutive=False)["text"] == "".join(LEAKED)


def test_response_json_and_request_validate() -> None:
    body = response_json(MODEL, "".join(LEAKED), reasoning="thinking", tools=[TOOL])
    parsed = Response.model_validate(body, strict=True)
    assert parsed.output_text == "".join(LEAKED)
    assert [item.type for item in parsed.output] == ["reasoning", "message"]
    request = responses_request(MODEL, "hi", [TOOL], tool_choice="auto")
    assert request == {
        "model": MODEL,
        "input": "hi",
        "stream": True,
        "tools": [TOOL],
        "tool_choice": "auto",
    }


# --------------------------------------------------------------------------
# Rejected streams: one mutation per rule
# --------------------------------------------------------------------------


def drop_created(events: list[dict[str, Any]]) -> None:
    del events[0]


def args_delta_unknown_index(events: list[dict[str, Any]]) -> None:
    events[find(events, "response.function_call_arguments.delta")]["output_index"] = 7


def args_delta_at_message(events: list[dict[str, Any]]) -> None:
    # item_id moves with it, so the item-type rule (not the item_id rule) must fire.
    delta = events[find(events, "response.function_call_arguments.delta")]
    delta.update(output_index=0, item_id=MSG_ID)


def text_delta_before_part(events: list[dict[str, Any]]) -> None:
    part = events.pop(find(events, "response.content_part.added"))
    events.insert(find(events, "response.output_text.delta") + 1, part)


def args_done_differs(events: list[dict[str, Any]]) -> None:
    events[find(events, "response.function_call_arguments.done")]["arguments"] = '{"city": "Rome"}'


def completed_without_call(events: list[dict[str, Any]]) -> None:
    events[-1]["response"]["output"].pop()


def required_action(events: list[dict[str, Any]]) -> None:
    events.insert(
        len(events) - 1,
        {"type": "response.required_action", "required_action": {"type": "submit_tool_outputs"}},
    )


def wrong_item_id(events: list[dict[str, Any]]) -> None:
    events[find(events, "response.function_call_arguments.delta")]["item_id"] = "fc_other"


def done_changes_call_id(events: list[dict[str, Any]]) -> None:
    events[find(events, "response.output_item.done", 1)]["item"]["call_id"] = "call_x"


def event_after_completed(events: list[dict[str, Any]]) -> None:
    events.append(copy.deepcopy(events[-1]))


def no_terminal(events: list[dict[str, Any]]) -> None:
    events.pop()


def delta_without_logprobs(events: list[dict[str, Any]]) -> None:
    del events[find(events, "response.output_text.delta")]["logprobs"]


MUTATIONS: dict[str, tuple[Callable[[list[dict[str, Any]]], None], str]] = {
    "missing response.created": (drop_created, "not response.created"),
    "delta at unknown output_index": (args_delta_unknown_index, "output_index 7"),
    "args delta aimed at the message": (args_delta_at_message, "aims at a message item"),
    "text delta before content_part.added": (text_delta_before_part, "content part 0 .* has 0"),
    "arguments.done != concat(deltas)": (args_done_differs, "arguments.done .* != concat"),
    "completed.output lacks the call": (completed_without_call, "differs from the output_item.done"),
    "response.required_action": (required_action, "not in the Responses event union"),
    "wrong item_id": (wrong_item_id, "item_id 'fc_other'"),
    "output_item.done changes call_id": (done_changes_call_id, "changes call_id"),
    "event after response.completed": (event_after_completed, "event after response.completed"),
    "no terminal event": (no_terminal, "without response.completed"),
    "output_text.delta without logprobs": (delta_without_logprobs, "logprobs"),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_mutation_is_rejected(name: str) -> None:
    mutate, message = MUTATIONS[name]
    events = canonical()
    mutate(events)
    with pytest.raises(WireError, match=message):
        check_responses_stream(responses_sse(events))  # renumbered 0..n-1 by responses_sse


def test_non_increasing_sequence_number() -> None:
    events = number_events(canonical())
    events[5]["sequence_number"] = events[4]["sequence_number"]
    with pytest.raises(WireError, match="sequence_number 4 follows 4"):
        check_responses_stream(responses_sse(events), consecutive=False)


def test_repeated_call_id() -> None:
    events = with_calls(responses_events(MODEL, LEAKED), ("fc_1", "call_1"), ("fc_2", "call_1"))
    with pytest.raises(WireError, match="duplicate call_id 'call_1'"):
        check_responses_stream(responses_sse(events))
    # Distinct ids pass, so it was the duplicate that failed.
    ok = with_calls(responses_events(MODEL, LEAKED), ("fc_1", "call_1"), ("fc_2", "call_2"))
    assert len(check_responses_stream(responses_sse(ok))["calls"]) == 2


def test_empty_message_item_with_empty_part() -> None:
    with pytest.raises(WireError, match="empty message item"):
        check_responses_stream(responses_sse(responses_events(MODEL, [""])))


def test_empty_message_item_without_content() -> None:
    events = with_calls(responses_events(MODEL, []), ("fc_1", "call_1"))
    empty = message_item(None, msg_id="msg_empty")
    completed = events.pop()
    events += [
        {
            "type": "response.output_item.added",
            "output_index": 1,
            "item": {**empty, "status": "in_progress"},
        },
        {"type": "response.output_item.done", "output_index": 1, "item": empty},
    ]
    completed["response"]["output"].append(empty)
    events.append(completed)
    with pytest.raises(WireError, match="empty message item 'msg_empty'"):
        check_responses_stream(responses_sse(events))


def test_required_action_allowed_when_listed() -> None:
    events = canonical()
    required_action(events)
    body = responses_sse(events)
    result = check_responses_stream(body, allow_extra_types={"response.required_action"})
    assert result["calls"][0]["call_id"] == "call_1"


def test_usage_without_cache_write_tokens_fails_sdk_validation() -> None:
    # openai-python 2.54 made input_tokens_details.cache_write_tokens required; servers built
    # against older schemas omit it. Strict clients of this SDK reject such a response.completed.
    body = responses_sse(responses_events(MODEL, ["a"], usage=usage_object(cache_write_tokens=None)))
    with pytest.raises(WireError, match="cache_write_tokens"):
        check_responses_stream(body)


# --------------------------------------------------------------------------
# The real SDK accepts what the builder produces
# --------------------------------------------------------------------------


def test_builder_stream_accepted_by_sdk_accumulator() -> None:
    """Feed the events, parsed as the default client does (`construct_type`), to the state
    machine behind `client.responses.stream()`."""
    body = responses_sse(
        with_calls(
            responses_events(MODEL, LEAKED, reasoning_pieces=["Hmm."], tools=[TOOL]),
            ("fc_1", "call_1"),
        )
    )
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=[TOOL], text_format=omit)
    fired = []
    for data in iter_sse_data(body):
        event = construct_type(type_=ResponseStreamEvent, value=json.loads(data))
        fired += state.handle_event(event)  # type: ignore[arg-type]
    final = state._completed_response  # what ResponseStream.get_final_response() returns
    assert final is not None
    assert final.output_text == "".join(LEAKED)
    # The snapshot the deltas built agrees with response.completed.
    text_deltas = [e for e in fired if e.type == "response.output_text.delta"]
    assert text_deltas[-1].snapshot == "".join(LEAKED)
    args_deltas = [e for e in fired if e.type == "response.function_call_arguments.delta"]
    assert args_deltas[-1].snapshot == "".join(ARG_PIECES)
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    # Every event also validates strictly, one by one, against the union.
    adapter = TypeAdapter(ResponseStreamEvent)
    for data in iter_sse_data(body):
        adapter.validate_python(json.loads(data), strict=True)


@pytest.mark.parametrize("strict_client", [False, True], ids=["default", "strict-client"])
def test_builder_stream_accepted_by_sdk_client(strict_client: bool) -> None:
    """The whole client path: SSE decoding, `_strict_response_validation`, get_final_response."""
    body = responses_sse(canonical())

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/responses"
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    client = openai.OpenAI(
        api_key="test",
        base_url="http://upstream.test/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
        _strict_response_validation=strict_client,
    )
    with client.responses.stream(model=MODEL, input="weather?", tools=[TOOL]) as stream:  # type: ignore[list-item]
        final = stream.get_final_response()
    assert final.output_text == "".join(LEAKED)
    call = final.output[1]
    assert call.type == "function_call"
    assert (call.call_id, call.arguments) == ("call_1", '{"city": "Paris"}')
