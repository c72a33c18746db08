"""Sentinel and Kimi markup on the Responses API and on Chat, through a real mitmdump with the
addon, consumed by the official OpenAI SDK."""

from __future__ import annotations

import json

import httpx
import pydantic
import pytest
from openai.types.responses import ResponseStreamEvent

from harness import ScriptedUpstream, chat_completion, sse_body
from kimi import kimi_chunks
from responses import number_events, response_json, responses_events, responses_sse
from wire import check_responses_stream

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
CHAT_WEATHER = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)


def test_responses_stream_gets_function_call_items(upstream: ScriptedUpstream, proxy, openai_client, unique_model):
    pieces = ["Let me check ", "the weather.\n\n", CALL[:9], CALL[9:40], CALL[40:], " Done."]
    upstream.add(unique_model, headers={"content-type": "text/event-stream"},
                 chunks=[responses_sse(responses_events(unique_model, pieces, tools=[WEATHER]))])
    seen = []
    with openai_client.responses.stream(model=unique_model, input="Weather in Paris?", tools=[WEATHER]) as stream:
        for event in stream:
            # every event the client got is one of the SDK's own event types, fully valid
            EVENTS.validate_python(event.model_dump(mode="json", exclude_unset=True, warnings=False), strict=True)
            seen.append(event.type)
        final = stream.get_final_response()
    assert [item.type for item in final.output] == ["message", "function_call", "message"]
    call = final.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert call.parsed_arguments == {"city": "Paris"}  # strict tool: the SDK parses it
    # "\n\n" arrived in its own delta before the block began: it was sent, and stays
    assert final.output_text == "Let me check the weather.\n\n Done."
    assert "<tool_call>" not in json.dumps(final.model_dump(mode="json", warnings=False))
    sequence = [t for t in seen if "function_call" in t or "output_item" in t]
    assert sequence[2:6] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    # the bytes on the wire: every event valid in the SDK's strict models, every copy agreeing
    raw = httpx.post(f"{proxy.base_url}/responses", json={"model": unique_model, "input": "Weather?", "tools": [WEATHER], "stream": True}, timeout=30)
    result = check_responses_stream(raw.content)
    assert result["items"] == ["message", "function_call", "message"]



def test_prose_after_a_call_token_by_token_one_event_a_read(upstream: ScriptedUpstream, openai_client, unique_model):
    """Text after a call goes to an item of ours: the held lane renumbers it (past the idle
    lexer), each delta its own read; every event is one of the SDK's, the text whole."""
    after = " It is sunny in Paris, [really] sunny, and \"warm\"."
    pieces = ["Let me check.", CALL[:9], CALL[9:40], CALL[40:], *(after[at : at + 3] for at in range(0, len(after), 3))]
    events = number_events(responses_events(unique_model, pieces, tools=[WEATHER]))
    upstream.add(unique_model, headers={"content-type": "text/event-stream"}, chunks=[responses_sse([event]) for event in events], delay=0.005)
    with openai_client.responses.stream(model=unique_model, input="Weather in Paris?", tools=[WEATHER]) as stream:
        for event in stream:
            EVENTS.validate_python(event.model_dump(mode="json", exclude_unset=True, warnings=False), strict=True)
        final = stream.get_final_response()
    assert [item.type for item in final.output] == ["message", "function_call", "message"]
    assert final.output[2].content[0].text == after

def test_responses_json_body_is_rewritten(upstream, openai_client, unique_model):
    upstream.add_json(unique_model, response_json(unique_model, "On it." + CALL, tools=[WEATHER]))
    response = openai_client.responses.create(model=unique_model, input="Weather?", tools=[WEATHER])
    assert [item.type for item in response.output] == ["message", "function_call"]
    assert response.output_text == "On it."
    assert json.loads(response.output[1].arguments) == {"city": "Paris"}


def test_follow_up_request_passes_upstream_unchanged(upstream, openai_client, unique_model):
    upstream.add(unique_model, headers={"content-type": "text/event-stream"},
                 chunks=[responses_sse(responses_events(unique_model, ["It is sunny."], tools=[WEATHER]))])
    history = [
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": "call_abc", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "call_abc", "output": "sunny <tool_call>"},
    ]
    with openai_client.responses.stream(model=unique_model, input=history, tools=[WEATHER]) as stream:
        final = stream.get_final_response()
    assert final.output_text == "It is sunny."
    sent = json.loads(upstream.requests_for(unique_model)[-1].body)
    assert sent["input"] == history and sent["tools"] == [WEATHER]


def test_chat_stream_gets_sentinel_tool_calls(upstream, openai_client, unique_model):
    pieces = ["Checking.", CALL[:15], CALL[15:]]
    upstream.add(unique_model, chunks=[sse_body(kimi_chunks(unique_model, pieces, fields=("content",)))])
    with openai_client.chat.completions.stream(
        model=unique_model, messages=[{"role": "user", "content": "Weather?"}], tools=[CHAT_WEATHER]
    ) as stream:
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.message.content == "Checking."
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.function.parsed_arguments == {"city": "Paris"}
    assert call.id.startswith("call_") and len(call.id) == len("call_") + 24
    assert choice.finish_reason == "tool_calls"


def test_chat_json_gets_sentinel_tool_calls(upstream, openai_client, unique_model):
    upstream.add_json(unique_model, chat_completion(unique_model, content=CALL))
    completion = openai_client.chat.completions.create(
        model=unique_model, messages=[{"role": "user", "content": "Weather?"}], tools=[CHAT_WEATHER]
    )
    message = completion.choices[0].message
    assert message.content is None
    assert [c.function.name for c in message.tool_calls] == ["get_weather"]
    assert completion.choices[0].finish_reason == "tool_calls"


def token_pieces(text: str) -> list[str]:
    """`text` in 1-4 character tokens (the same cut every run)."""
    pieces, at = [], 0
    while at < len(text):
        size = 1 + (at * 7 + 3) % 4
        pieces.append(text[at : at + size])
        at += size
    return pieces


CITIES = ('Paris "Ville Lumière" \\ 75001, a long name to stream', "São Paulo <br> and more text after the tag in the value")


def two_blocks_text(coder: bool) -> str:
    if coder:
        blocks = [f"<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n</parameter>\n</function>\n</tool_call>" for city in CITIES]
    else:
        blocks = [f"<tool_call>\n{json.dumps({'name': 'get_weather', 'arguments': {'city': city}}, ensure_ascii=False)}\n</tool_call>" for city in CITIES]
    return f"Let me check both.\n{blocks[0]}\nAnd the second one.\n{blocks[1]}"


def in_writes_of_eight(events: list[bytes]) -> list[bytes]:
    return [b"".join(events[at : at + 8]) for at in range(0, len(events), 8)]


@pytest.mark.parametrize("coder", [False, True], ids=["hermes", "qwen3-coder xml"])
def test_blocks_held_whole_eight_events_a_read_chat(coder, upstream: ScriptedUpstream, openai_client, unique_model):
    """Two blocks in 1-4 character tokens, eight events a network write (a fast upstream): each
    block's events in a read go to its lexer as one text (the held lane's runs; a piece with a
    `<` in the value read alone); the SDK assembles both calls exactly and the prose around them."""
    model = ("Qwen3-Coder-30B-" if coder else "") + unique_model
    chunks = [chat_chunk_dict(model, {"role": "assistant", "content": ""})]
    chunks += [chat_chunk_dict(model, {"content": piece}) for piece in token_pieces(two_blocks_text(coder))]
    events = [sse_body([chunk], done=False) for chunk in chunks] + [sse_body([chat_chunk_dict(model, {}, "stop")])]
    upstream.add(model, chunks=in_writes_of_eight(events), delay=0.002)
    with openai_client.chat.completions.stream(model=model, messages=[{"role": "user", "content": "Weather?"}], tools=[CHAT_WEATHER]) as stream:
        choice = stream.get_final_completion().choices[0]
    assert [json.loads(call.function.arguments) for call in choice.message.tool_calls] == [{"city": city} for city in CITIES]
    assert [call.function.name for call in choice.message.tool_calls] == ["get_weather", "get_weather"]
    assert choice.message.content.split() == "Let me check both. And the second one.".split()
    assert choice.finish_reason == "tool_calls"


def test_blocks_held_whole_eight_events_a_read_responses(upstream: ScriptedUpstream, openai_client, unique_model):
    """The same on the Responses API (a Qwen model: `<tool_call>` is its first dialect, whose
    lexer holds the block; an unknown model's chain of dialects is read event by event): every
    event one of the SDK's, both calls' arguments exact."""
    model = "Qwen2.5-72B-Instruct-" + unique_model
    events = number_events(responses_events(model, token_pieces(two_blocks_text(False)), tools=[WEATHER]))
    upstream.add(model, headers={"content-type": "text/event-stream"}, chunks=in_writes_of_eight([responses_sse([event]) for event in events]), delay=0.002)
    with openai_client.responses.stream(model=model, input="Weather?", tools=[WEATHER]) as stream:
        for event in stream:
            EVENTS.validate_python(event.model_dump(mode="json", exclude_unset=True, warnings=False), strict=True)
        final = stream.get_final_response()
    calls = [item for item in final.output if item.type == "function_call"]
    assert [json.loads(call.arguments) for call in calls] == [{"city": city} for city in CITIES]
    assert [item.type for item in final.output] == ["message", "function_call", "message", "function_call"]


def chat_chunk_dict(model: str, delta: dict, finish: str | None = None) -> dict:
    return {"id": "chatcmpl-e2e", "object": "chat.completion.chunk", "created": 1, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
