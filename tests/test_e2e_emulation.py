"""Tool emulation through a real mitmdump: a text-only backend that refuses `tools`, and an
agent loop with the OpenAI SDK on Chat Completions and on the Responses API."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import openai
import pytest

from harness import Mitmdump, RecordedRequest, Script, ScriptedUpstream, chat_completion, sse_body
from kimi import chunk
from responses import responses_events, responses_sse

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False},
    "strict": True,
}
CHAT_WEATHER = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
CALL_TEXT = 'I will look it up.\n<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>'
ANSWER = "It is sunny in Paris."
REFUSAL = Script(status=400, headers=(("content-type", "application/json"),),
                 chunks=(b'{"error": {"message": "this backend does not support tools"}}',), framing="content-length")


@pytest.fixture(scope="module")
def emulating_proxy(upstream: ScriptedUpstream) -> Iterator[Mitmdump]:
    with Mitmdump(upstream.url, extra_args=["--set", "toolshim_emulate=^emulated-"]) as proc:
        yield proc


@pytest.fixture
def client(emulating_proxy: Mitmdump) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=emulating_proxy.base_url, api_key="test-key", max_retries=0, timeout=30) as c:
        yield c


def text_only_backend(reply_turn_1, reply_turn_2):
    """Refuses any request carrying tools (as text-only servers do); answers turn 1 with a call
    written as text, and the turn holding the tool's result with the final answer."""

    def respond(request: RecordedRequest) -> Script:
        body = request.json or {}
        if "tools" in body or "tool_choice" in body or "parallel_tool_calls" in body:
            return REFUSAL
        # the manifest itself names the result format: look for a real result, with a real id
        return reply_turn_2 if "[function_call_output call_id=call_" in json.dumps(body) else reply_turn_1

    return respond


def sse_script(body: bytes) -> Script:
    return Script(headers=(("content-type", "text/event-stream"),), chunks=(body,))


def test_chat_agent_loop_with_a_text_only_backend(upstream, client):
    model = "emulated-chat-loop"
    turn_1 = sse_script(sse_body([chunk(model, {"role": "assistant", "content": ""}),
                                  *(chunk(model, {"content": CALL_TEXT[i : i + 9]}) for i in range(0, len(CALL_TEXT), 9)),
                                  chunk(model, {}, "stop")]))
    turn_2 = Script(headers=(("content-type", "application/json"),), chunks=(json.dumps(chat_completion(model, content=ANSWER)).encode(),), framing="content-length")
    upstream.add_responder(model, text_only_backend(turn_1, turn_2))
    messages = [{"role": "user", "content": "Weather in Paris?"}]

    with client.chat.completions.stream(model=model, messages=messages, tools=[CHAT_WEATHER]) as stream:
        first = stream.get_final_completion().choices[0]
    assert first.finish_reason == "tool_calls"
    (call,) = first.message.tool_calls
    assert call.function.name == "get_weather" and call.function.parsed_arguments == {"city": "Paris"}
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", call.id)
    assert first.message.content.strip() == "I will look it up."

    sent_1 = upstream.requests_for(model)[-1].json
    assert "tools" not in sent_1 and sent_1["messages"][0]["role"] == "system"
    assert "<tool_call>" in sent_1["messages"][0]["content"] and "get_weather" in sent_1["messages"][0]["content"]

    messages += [
        {"role": "assistant", "content": first.message.content, "tool_calls": [call.model_dump(exclude={"function": {"parsed_arguments"}})]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 24 C"},
    ]
    final = client.chat.completions.create(model=model, messages=messages, tools=[CHAT_WEATHER])
    assert final.choices[0].message.content == ANSWER

    sent_2 = upstream.requests_for(model)[-1]
    transcript = sent_2.json["messages"]
    assert [m["role"] for m in transcript] == ["system", "user", "assistant", "user"]
    assert transcript[2]["content"].endswith('<tool_call>{"name":"get_weather","arguments":"{\\"city\\": \\"Paris\\"}"}</tool_call>')
    assert transcript[3]["content"] == f"[function_call_output call_id={call.id} output=sunny, 24 C]"
    assert "tool_calls" not in transcript[2] and "tools" not in sent_2.json
    assert int(sent_2.headers["content-length"]) == len(sent_2.body)


def test_responses_agent_loop_with_a_text_only_backend(upstream, client):
    model = "emulated-responses-loop"
    turn_1 = sse_script(responses_sse(responses_events(model, [CALL_TEXT[:20], CALL_TEXT[20:]])))
    turn_2 = sse_script(responses_sse(responses_events(model, ["It is sunny ", "in Paris."])))
    upstream.add_responder(model, text_only_backend(turn_1, turn_2))

    with client.responses.stream(model=model, input="Weather in Paris?", tools=[WEATHER], instructions="Be brief.") as stream:
        first = stream.get_final_response()
    assert [item.type for item in first.output] == ["message", "function_call"]
    call = first.output[1]
    assert call.name == "get_weather" and call.parsed_arguments == {"city": "Paris"}

    sent_1 = upstream.requests_for(model)[-1].json
    assert "tools" not in sent_1
    assert sent_1["instructions"].startswith("Be brief.\n\n# Tools")

    follow_up = [
        {"role": "user", "content": "Weather in Paris?"},
        *[item.model_dump(exclude_none=True, exclude={"parsed_arguments"}) for item in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny <tool_call>{}</tool_call>"},
    ]
    with client.responses.stream(model=model, input=follow_up, tools=[WEATHER]) as stream:
        final = stream.get_final_response()
    assert final.output_text == ANSWER

    transcript = upstream.requests_for(model)[-1].json["input"]
    assert transcript[0] == {"role": "user", "content": "Weather in Paris?"}
    assert transcript[1]["role"] == "assistant" and transcript[1]["content"].startswith("I will look it up.")
    assert transcript[1]["content"].endswith("</tool_call>")
    assert transcript[2] == {"role": "user", "content": f"[function_call_output call_id={call.call_id} output=sunny <tool-call>{{}}</tool-call>]"}


def test_required_tool_choice_answered_in_text_reaches_the_client(upstream, client):
    model = "emulated-required-unmet"
    reply = Script(headers=(("content-type", "application/json"),), chunks=(json.dumps(chat_completion(model, content="No tool needed.")).encode(),), framing="content-length")
    upstream.add_responder(model, text_only_backend(reply, reply))
    completion = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], tools=[CHAT_WEATHER], tool_choice="required"
    )
    assert completion.choices[0].message.content == "No tool needed."
    assert "You MUST call at least one tool" in upstream.requests_for(model)[-1].json["messages"][0]["content"]


def test_other_models_are_not_emulated(upstream, client):
    model = "native-tools-model"
    upstream.add_json(model, chat_completion(model, content="plain"))
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], tools=[CHAT_WEATHER])
    assert upstream.requests_for(model)[-1].json["tools"] == [CHAT_WEATHER]
