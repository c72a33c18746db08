"""Kimi markup through a real mitmdump with the addon, consumed by the official OpenAI SDK."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from harness import ScriptedUpstream, chat_chunk, chat_completion, split_bytes, sse_body
from kimi import SEED_000, USAGE, kimi_chunks
from wire import check_chat_stream

MESSAGES = [{"role": "user", "content": "What is in /usr/include/asm?"}]


def accumulate(client: openai.OpenAI, model: str, **kwargs):
    state = ChatCompletionStreamState()
    raw_chunks = []
    for c in client.chat.completions.create(model=model, messages=MESSAGES, stream=True, **kwargs):
        raw_chunks.append(c)
        state.handle_chunk(c)
    return state.get_final_completion(), raw_chunks


def test_seed_stream_becomes_two_tool_calls(upstream: ScriptedUpstream, openai_client, unique_model):
    upstream.add(unique_model, chunks=[sse_body(kimi_chunks(unique_model, SEED_000))])
    final, raw = accumulate(openai_client, unique_model)
    choice = final.choices[0]
    calls = choice.message.tool_calls
    assert [c.id for c in calls] == ["functions.bash:15", "functions.read_file:16"]
    assert [c.function.name for c in calls] == ["bash", "read_file"]
    assert json.loads(calls[0].function.arguments) == {"command": "ls -la /usr/include | grep asm"}
    assert json.loads(calls[1].function.arguments) == {"path": "/usr/include/asm/unistd.h"}
    assert choice.finish_reason == "tool_calls"
    # reasoning keeps its field, mirrored, and loses every marker
    assert choice.message.reasoning == choice.message.reasoning_content == "I will list the headers."
    assert final.usage.total_tokens == USAGE["total_tokens"]
    assert {c.id for c in raw} == {"chatcmpl-8c3707e154df23bb"}
    assert {c.model for c in raw} == {unique_model}
    # the request went upstream asking for an uncompressed body
    assert upstream.requests_for(unique_model)[-1].headers["accept-encoding"] == "identity"


def test_stream_helper_sees_argument_events(upstream: ScriptedUpstream, openai_client, unique_model):
    upstream.add(unique_model, chunks=[sse_body(kimi_chunks(unique_model, SEED_000))])
    done_events = []
    with openai_client.chat.completions.stream(model=unique_model, messages=MESSAGES) as stream:
        for event in stream:
            if event.type == "tool_calls.function.arguments.done":
                done_events.append((event.index, event.name, json.loads(event.arguments)))
        final = stream.get_final_completion()
    assert done_events == [
        (0, "bash", {"command": "ls -la /usr/include | grep asm"}),
        (1, "read_file", {"path": "/usr/include/asm/unistd.h"}),
    ]
    assert final.choices[0].finish_reason == "tool_calls"


def test_calls_in_content_with_text_before_and_after(upstream, openai_client, unique_model):
    pieces = ["Let me look.", " <|tool_calls_section_begin|>", "<|tool_call_begin|>functions.read_file:0",
              "<|tool_call_argument_begin|>", '{"path": "a.txt"}', "<|tool_call_end|>", "<|tool_calls_section_end|>", "\n\nOne moment."]
    upstream.add(unique_model, chunks=[sse_body(kimi_chunks(unique_model, pieces, fields=("content",)))])
    final, _ = accumulate(openai_client, unique_model)
    message = final.choices[0].message
    assert message.content == "Let me look.\n\nOne moment."
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("functions.read_file:0", "read_file", '{"path": "a.txt"}')
    ]


def test_tool_calls_stream_live_not_buffered(upstream, openai_client, unique_model):
    """The call reaches the client while upstream is still sending (0.3 s between events)."""
    chunks = kimi_chunks(unique_model, ["<|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>", '{"command": ', '"ls"}', "<|tool_call_end|>"], fields=("content",))
    upstream.add(unique_model, chunks=[*(sse_body([c], done=False) for c in chunks), b"data: [DONE]\n\n"], delay=0.3)
    arrivals = []
    for c in openai_client.chat.completions.create(model=unique_model, messages=MESSAGES, stream=True):
        arrivals.append((time.monotonic(), c))
    first_call = next(t for t, c in arrivals if c.choices and c.choices[0].delta.tool_calls)
    last = arrivals[-1][0]
    assert last - first_call > 0.5  # the call came at least two upstream events before the end


def test_non_streaming_body_is_rewritten(upstream, openai_client, unique_model):
    content = " <|tool_calls_section_begin|> <|tool_call_begin|> functions.bash:3 <|tool_call_argument_begin|> {\"command\": \"date\"} <|tool_call_end|> <|tool_calls_section_end|>"
    upstream.add_json(unique_model, chat_completion(unique_model, content=content))
    completion = openai_client.chat.completions.create(model=unique_model, messages=MESSAGES)
    choice = completion.choices[0]
    assert choice.message.content is None
    assert [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [("functions.bash:3", "bash", '{"command": "date"}')]
    assert choice.finish_reason == "tool_calls"


@pytest.mark.parametrize("status, content_type", [(500, "application/json"), (429, "text/event-stream"), (400, "application/json")])
def test_error_responses_pass_byte_for_byte(upstream, proxy, unique_model, status, content_type):
    body = b'{"error": {"message": "<|tool_call_begin|>functions.x:0 no"}}'
    if content_type == "text/event-stream":
        body = b"data: " + body + b"\n\n"
    upstream.add(unique_model, status=status, headers={"content-type": content_type}, chunks=[body])
    response = httpx.post(f"{proxy.base_url}/chat/completions", json={"model": unique_model, "messages": MESSAGES, "stream": True})
    assert response.status_code == status
    assert response.content == body


def test_non_llm_requests_pass_untouched(upstream, proxy):
    body = b'{"data": [{"id": "kimi-k2", "note": "<|tool_calls_section_begin|>"}]}'
    upstream.add("/v1/models", headers={"content-type": "application/json"}, chunks=[body])
    response = httpx.get(f"{proxy.base_url}/models")
    assert response.status_code == 200 and response.content == body
    assert "accept-encoding" not in upstream.requests_for("/v1/models")[-1].headers or upstream.requests_for("/v1/models")[-1].headers["accept-encoding"] != "identity"


def raw_stream(proxy, model) -> bytes:
    with httpx.stream("POST", f"{proxy.base_url}/chat/completions", json={"model": model, "messages": MESSAGES, "stream": True}, timeout=30) as response:
        assert response.status_code == 200
        return response.read()


@pytest.mark.parametrize("framing", ["chunked", "content-length", "close"])
@pytest.mark.parametrize("gzip", [False, True])
def test_framings_and_compression_give_the_same_result(upstream, proxy, unique_model, framing, gzip):
    body = sse_body(kimi_chunks(unique_model, SEED_000))
    upstream.add(unique_model, chunks=split_bytes(body, range(0, len(body), 97)), framing=framing, gzip=gzip, delay=0.001)
    result = check_chat_stream(raw_stream(proxy, unique_model))
    assert [c["id"] for c in result["tool_calls"]] == ["functions.bash:15", "functions.read_file:16"]
    assert result["usage"] == USAGE and result["done"]


def test_every_byte_its_own_network_read(upstream, proxy, unique_model):
    body = sse_body(kimi_chunks(unique_model, SEED_000))
    expected = check_chat_stream(raw_stream_once(upstream, proxy, unique_model + "-whole", [body]))
    upstream.add(unique_model, chunks=[body[i : i + 1] for i in range(len(body))], delay=0.0002)
    assert check_chat_stream(raw_stream(proxy, unique_model)) == expected


def raw_stream_once(upstream, proxy, model, chunks, delay=0.0) -> bytes:
    upstream.add(model, chunks=chunks, delay=delay)
    return raw_stream(proxy, model)


def test_every_byte_boundary_through_mitmdump_and_the_sdk(upstream, proxy, unique_model):
    """The seed stream cut at every byte: identical tool calls each time, via the SDK."""
    # Compact chunks keep the sweep short.
    compact = [{"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "k2", "choices": [{"index": 0, "delta": {"reasoning_content": p}}]} for p in SEED_000]
    compact.append({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "k2", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    body = sse_body(compact)
    client = openai.OpenAI(base_url=proxy.base_url, api_key="k", max_retries=0, timeout=30)
    # Each request cuts the body every `stride` bytes, from its own first cut: every byte
    # boundary is a read boundary in exactly one request, at an eighth of the requests that one
    # cut each takes (a request through mitmdump and the SDK is what the sweep's time goes to).
    # Cuts that far apart (more than any marker or event) leave each cut's neighbourhood as a
    # single cut would.
    stride = -(-len(body) // 8)

    def calls_for(first: int):
        model = f"{unique_model}-{first}"
        cuts = range(first, len(body), stride) if first else []
        upstream.add(model, chunks=split_bytes(body, cuts), delay=0.002)
        final, _ = accumulate(client, model)
        message = final.choices[0].message
        return [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls], final.choices[0].finish_reason

    expected = calls_for(0)
    assert [name for _, name, _ in expected[0]] == ["bash", "read_file"]
    assert stride > max(len(event) for event in body.split(b"\n\n"))
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(calls_for, range(1, stride + 1)))
    assert all(r == expected for r in results), [i + 1 for i, r in enumerate(results) if r != expected][:10]


def test_a_flow_saved_live_is_not_rewritten_again_offline(upstream, unique_model, tmp_path):
    """`-w` keeps what the client got and the original; replaying the capture through the addon
    offline changes nothing: not the body, not the annotation, not the comment."""
    from harness import Mitmdump, read_flows, run_offline

    upstream.add(unique_model, chunks=[sse_body(kimi_chunks(unique_model, SEED_000))])
    captured = tmp_path / "live.flow"
    with Mitmdump(upstream.url, extra_args=["-w", str(captured)]) as proc:
        with openai.OpenAI(base_url=proc.base_url, api_key="sk-test", max_retries=0) as client:
            final, _ = accumulate(client, unique_model)
    assert [c.function.name for c in final.choices[0].message.tool_calls] == ["bash", "read_file"]
    (live,) = read_flows(captured)
    assert live.comment == "toolshim: kimi → 2 calls (bash, read_file)" and live.marked == ":wrench:"
    assert b"<|tool_call_begin|>" in live.metadata["toolshim"]["upstream"]
    assert b"<|tool_call_begin|>" not in live.response.content

    result = run_offline(captured, tmp_path / "again.flow")
    assert result.returncode == 0, result.stderr
    (again,) = read_flows(tmp_path / "again.flow")
    assert again.response.content == live.response.content
    assert again.metadata == live.metadata
    assert (again.comment, again.marked) == (live.comment, live.marked)


def test_plain_text_written_eight_events_a_write_passes_byte_for_byte(upstream, proxy, openai_client, unique_model):
    """A stream's first write holds its start and the text after it (a fast upstream): the
    addon reads the start and passes the rest as one piece (`_framed_rest_whole`). Through
    mitmdump the body comes out byte for byte, and the SDK assembles the text."""
    words = [f" word{n}," for n in range(60)]
    events = [sse_body([chat_chunk(unique_model, role="assistant", content="")], done=False)]
    events += [sse_body([chat_chunk(unique_model, content=word)], done=False) for word in words]
    events += [sse_body([chat_chunk(unique_model, finish_reason="stop")], done=False), b"data: [DONE]\n\n"]
    body = b"".join(events)
    writes = [b"".join(events[at : at + 8]) for at in range(0, len(events), 8)]
    assert raw_stream_once(upstream, proxy, unique_model, writes, delay=0.002) == body
    upstream.add(unique_model + "-sdk", chunks=writes, delay=0.002)
    stream = openai_client.chat.completions.create(model=unique_model + "-sdk", messages=MESSAGES, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == "".join(words)


def test_plain_text_written_in_pieces_cut_mid_event_passes_byte_for_byte(upstream, proxy, openai_client, unique_model):
    """Writes of a plain stream cut anywhere (a read ends inside an event, as a client's 4 KB
    reads do): each read's whole events pass as one, the unfinished last one is kept for the next
    (`SseFramer.hold`). Through mitmdump the body comes out byte for byte, and the SDK assembles
    the text."""
    words = [f" word{n}," for n in range(120)]
    events = [sse_body([chat_chunk(unique_model, role="assistant", content="")], done=False)]
    events += [sse_body([chat_chunk(unique_model, content=word)], done=False) for word in words]
    events += [sse_body([chat_chunk(unique_model, finish_reason="stop")], done=False), b"data: [DONE]\n\n"]
    body = b"".join(events)
    writes = [body[at : at + 333] for at in range(0, len(body), 333)]
    assert sum(not write.endswith(b"\n\n") for write in writes) > len(writes) // 2  # (most cut mid-event)
    assert raw_stream_once(upstream, proxy, unique_model, writes, delay=0.002) == body
    upstream.add(unique_model + "-sdk", chunks=writes, delay=0.002)
    stream = openai_client.chat.completions.create(model=unique_model + "-sdk", messages=MESSAGES, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == "".join(words)


SET_TEMP = {
    "type": "function",
    "function": {
        "name": "set_temp", "strict": True,
        "parameters": {"type": "object", "properties": {"celsius": {"type": "number"}}, "required": ["celsius"], "additionalProperties": False},
    },
}  # fmt: skip


@pytest.mark.parametrize(("arguments", "fits"), [('{"celsius": 21.5}', True), ('{"celsius": "warm"}', False), ('{"celsius": 21, "room": "x"}', False)])
def test_a_strict_tool_s_schema_decides_the_call_through_mitmdump(upstream, openai_client, unique_model, arguments, fits):
    """The schema check (the compiled one where it takes the schema, jsonschema for misfits)
    through a real mitmdump: arguments that fit become a call; a strict tool's misfit stays text."""
    model = f"Qwen2.5-{unique_model}"
    pieces = ["Setting it.\n<tool_call>\n", '{"name": "set_temp", "arguments": ', arguments, "}\n</tool_call>"]
    chunks = [chat_chunk(model, role="assistant", content="")] + [chat_chunk(model, content=p) for p in pieces] + [chat_chunk(model, finish_reason="stop")]
    upstream.add(model, chunks=[sse_body(chunks)])
    state = ChatCompletionStreamState()
    for c in openai_client.chat.completions.create(model=model, messages=MESSAGES, stream=True, tools=[SET_TEMP]):
        state.handle_chunk(c)
    message = state.get_final_completion().choices[0].message
    if fits:
        assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [("set_temp", {"celsius": 21.5})]
        assert message.content == "Setting it."
    else:
        assert not message.tool_calls
        assert message.content == "".join(pieces)
