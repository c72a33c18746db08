"""Other dialects through a real mitmdump with the addon, consumed by the OpenAI SDK: Qwen3-Coder
XML, DeepSeek V3.1, a pre-opened `<think>` stream, and a broken native tool_calls stream."""

from __future__ import annotations

import json

from harness import ScriptedUpstream, sse_body

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}
MESSAGES = [{"role": "user", "content": "Weather in Paris for 3 days?"}]


def chunk(model: str, delta: dict, finish: str | None = None) -> dict:
    return {"id": "chatcmpl-e2e", "object": "chat.completion.chunk", "created": 1, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def content_stream(model: str, text: str, size: int = 7) -> bytes:
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    return sse_body([chunk(model, {"role": "assistant", "content": ""}), *(chunk(model, {"content": p}) for p in pieces), chunk(model, {}, "stop")])


def token_events(model: str, text: str) -> list[bytes]:
    """A Chat stream of `text` in 1-3 character tokens (as a model's tokens run), one event each."""
    pieces, at = [], 0
    while at < len(text):
        pieces.append(text[at : at + 1 + at % 3])
        at += 1 + at % 3
    events = [sse_body([chunk(model, {"role": "assistant", "content": ""})], done=False)]
    events += [sse_body([chunk(model, {"content": p})], done=False) for p in pieces]
    events += [sse_body([chunk(model, {}, "stop")])]
    return events


def final(client, model: str):
    with client.chat.completions.stream(model=model, messages=MESSAGES, tools=[WEATHER]) as stream:
        return stream.get_final_completion().choices[0]


def test_qwen3_coder_xml_becomes_a_typed_call(upstream: ScriptedUpstream, openai_client, unique_model):
    model = "Qwen3-Coder-30B-" + unique_model
    text = "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    upstream.add(model, chunks=[content_stream(model, text)])
    choice = final(openai_client, model)
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}  # typed by the schema
    assert choice.message.content.strip() == "Let me check."
    assert choice.finish_reason == "tool_calls"


WRITE = {"type": "function", "function": {"name": "write_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]}}}


def test_qwen3_coder_long_value_token_by_token_one_event_a_read(upstream: ScriptedUpstream, openai_client, unique_model):
    """A multi-line value in 1-3 character tokens, each event its own network read: its pieces
    without a `<` are held by the lexer without its steps (`BlockLexer.feed`), those with one
    (`a < b`, `<div>`) by the steps; the SDK gets the value exactly."""
    model = "Qwen3-Coder-30B-" + unique_model
    content = "def f(a, b):\n    return a < b  # \"quoted\" \\ ünï\n" * 6 + "<div>literal</div>\nend"
    text = f"Writing it.\n<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/f.py\n</parameter>\n<parameter=content>\n{content}\n</parameter>\n</function>\n</tool_call>"
    events = token_events(model, text)
    upstream.add(model, chunks=events, delay=0.001)
    with openai_client.chat.completions.stream(model=model, messages=MESSAGES, tools=[WRITE]) as stream:
        choice = stream.get_final_completion().choices[0]
    (call,) = choice.message.tool_calls
    assert call.function.name == "write_file"
    assert json.loads(call.function.arguments) == {"path": "src/f.py", "content": content}
    assert choice.message.content.strip() == "Writing it."
    assert choice.finish_reason == "tool_calls"


def test_deepseek_v31_call_with_fullwidth_markers(upstream, openai_client, unique_model):
    model = "DeepSeek-V3.1-" + unique_model
    text = 'On it.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris", "days": 3}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
    upstream.add(model, chunks=[content_stream(model, text, size=5)])
    choice = final(openai_client, model)
    (call,) = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris", "days": 3})
    assert choice.message.content == "On it."


def test_preopened_think_stream_goes_to_reasoning_content(upstream, openai_client, unique_model):
    model = "DeepSeek-R1-0528-" + unique_model
    text = "The user wants weather. I have no tool result yet.</think>\n\nI cannot know the weather without a lookup."
    upstream.add(model, chunks=[content_stream(model, text)])
    choice = final(openai_client, model)
    assert choice.message.model_extra["reasoning_content"] == "The user wants weather. I have no tool result yet."
    assert choice.message.content == "I cannot know the weather without a lookup."
    assert choice.finish_reason == "stop"


def test_broken_native_tool_calls_are_repaired(upstream, openai_client, unique_model):
    model = "some-server-" + unique_model
    head = {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    pieces = ['{"city": ', '"Paris"', "}"]
    body = sse_body([
        chunk(model, {"role": "assistant", "content": None}),
        # no index, and id/type/name repeated on every delta
        *(chunk(model, {"tool_calls": [{**head, "function": {"name": "get_weather", "arguments": p}}]}) for p in pieces),
        # then the whole arguments again, as a snapshot
        chunk(model, {"tool_calls": [{**head, "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}),
        chunk(model, {}, "stop"),
    ])
    upstream.add(model, chunks=[body])
    choice = final(openai_client, model)
    (call,) = choice.message.tool_calls
    assert call.id == "call_a" and call.function.name == "get_weather"
    assert call.function.arguments == '{"city": "Paris"}'
    assert choice.finish_reason == "tool_calls"


def test_a_bare_think_closer_never_reaches_content(upstream, openai_client, unique_model):
    # Qwen3 without a word on thinking in the request: its template may have opened the block,
    # so a bare `</think>` is markup (issue 20); what came before it is already content.
    model = "Qwen3-32B-" + unique_model
    text = "The user wants weather.</think>\n\nI cannot know the weather without a lookup."
    upstream.add(model, chunks=[content_stream(model, text, size=4)])
    choice = final(openai_client, model)
    assert choice.message.content == "The user wants weather.\n\nI cannot know the weather without a lookup."
    assert choice.finish_reason == "stop"


def test_deepseek_v4_call_inside_thinking_then_its_late_closer(upstream, openai_client, unique_model):
    # DeepSeek V4 with thinking on writes its DSML calls inside the reasoning the template
    # opened, then `</think>` (vLLM #46079): reasoning, one call, no `</think>` in content.
    model = "DeepSeek-V4-" + unique_model
    text = ('I will look it up.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
            '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
            '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
            '</｜DSML｜invoke>\n</｜DSML｜tool_calls></think>')  # fmt: skip
    upstream.add(model, chunks=[content_stream(model, text, size=6)])
    with openai_client.chat.completions.stream(model=model, messages=MESSAGES, tools=[WEATHER], extra_body={"chat_template_kwargs": {"thinking": True}}) as stream:
        choice = stream.get_final_completion().choices[0]
    assert choice.message.model_extra["reasoning_content"].strip() == "I will look it up."
    (call,) = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris", "days": 3})
    assert not (choice.message.content or "").strip()
    assert choice.finish_reason == "tool_calls"


def test_blocks_between_prose_one_event_a_read(upstream: ScriptedUpstream, openai_client, unique_model):
    """Prose, a `<tool_call>` block, prose, a second block, prose, in 1-3 character tokens, each
    event its own network read: once the first call is made the prose between passes by its frame,
    the second block's first event is read by that lane's hand-off (`SseRewriter._one_event_framed`)
    and the text after each block goes out in its frame's event rendered around a text; the SDK gets
    both calls and the prose exactly, the whitespace held after a block sent with the text after it."""
    model = "Qwen/Qwen2.5-72B-" + unique_model
    block = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s", "days": %d}}\n</tool_call>\n'
    text = "Looking first. " + block % ("Paris", 3) + "Then again, " + block % ("Oslo", 2) + "Done."
    events = token_events(model, text)
    upstream.add(model, chunks=events, delay=0.001)
    choice = final(openai_client, model)
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {"city": "Oslo", "days": 2})]
    # (The space before the first block went out before its `<` came; after a call, whitespace
    # is held: before the second block it is dropped, after it sent with the text that follows.
    # The same with the lanes off, in process.)
    assert choice.message.content == "Looking first. \nThen again,\nDone."
    assert choice.finish_reason == "tool_calls"


def test_blocks_held_whole_in_reads_of_eight_events(upstream: ScriptedUpstream, openai_client, unique_model):
    """Two `<tool_call>` blocks with long arguments, in 1-3 character tokens, written eight events
    to a network read (a fast model, a busy proxy): the reads inside each block are taken at once
    by the held block's lane (`ChatStreamRewriter._held_burst`), the first block's while the
    echo check is still undecided; the SDK gets both calls with their arguments exactly."""
    model = "Qwen/Qwen2.5-72B-" + unique_model
    cities = ["Paris, " + "the city of light and of long plain words, " * 4 + "France", "Oslo " + "by the fjord, quoted \"here\" and there, " * 3]
    block = '<tool_call>\n{"name": "get_weather", "arguments": {"city": %s, "days": %d}}\n</tool_call>\n'
    text = "Looking first. " + block % (json.dumps(cities[0]), 3) + "Then again, " + block % (json.dumps(cities[1]), 2) + "Done."
    events = token_events(model, text)
    reads = [b"".join(events[at : at + 8]) for at in range(0, len(events), 8)]
    upstream.add(model, chunks=reads, delay=0.001)
    choice = final(openai_client, model)
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("get_weather", {"city": cities[0], "days": 3}), ("get_weather", {"city": cities[1], "days": 2})]
    assert choice.message.content == "Looking first. \nThen again,\nDone."
    assert choice.finish_reason == "tool_calls"
