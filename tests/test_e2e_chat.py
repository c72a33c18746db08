"""Kimi markup through a real mitmdump with the addon, consumed by the official OpenAI SDK."""

from __future__ import annotations

import json

import openai
from openai.lib.streaming.chat import ChatCompletionStreamState

from harness import ScriptedUpstream, sse_body
from kimi import SEED_000, USAGE, kimi_chunks

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
