"""The upstream streams the benchmarks feed: SSE bodies as OpenAI-compatible servers send them,
one event per token-sized delta, cut into the events a network read would carry."""

from __future__ import annotations

import random
from typing import Any

import orjson

KIMI_MODEL = "moonshotai/Kimi-K2.5"
QWEN_MODEL = "Qwen/Qwen2.5-72B-Instruct"
QWEN_CODER_MODEL = "Qwen/Qwen3-Coder-480B-A35B-Instruct"
PLAIN_MODEL = "gpt-4o-compatible"
BASH_TOOL = {
    "type": "function",
    "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}},
}
WORDS = "the model answers with ordinary prose , numbers 12 and 3.5 , quotes \" and ' , a path /usr/lib and code x = f ( y ) ;".split()


def request_body(model: str, tools: bool = True) -> bytes:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    if tools:
        body["tools"] = [BASH_TOOL]
    return orjson.dumps(body)


def tokens(text: str, rng: random.Random, smallest: int = 1, largest: int = 4) -> list[str]:
    """`text` cut into pieces of `smallest`..`largest` characters, as a tokenizer would."""
    out, at = [], 0
    while at < len(text):
        size = rng.randint(smallest, largest)
        out.append(text[at : at + size])
        at += size
    return out


def prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _chunk(model: str, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1772234856,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


def chat_events(model: str, pieces: list[str], field: str = "content") -> list[bytes]:
    """One SSE event per piece, then the finish chunk and [DONE]: each event's bytes."""
    events = [b"data: " + orjson.dumps(_chunk(model, {"role": "assistant", "content": ""})) + b"\n\n"]
    events += [b"data: " + orjson.dumps(_chunk(model, {field: piece})) + b"\n\n" for piece in pieces]
    events.append(b"data: " + orjson.dumps(_chunk(model, {}, "stop")) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def plain_pieces(count: int, seed: int = 1) -> list[str]:
    """Prose without any markup: the fast path."""
    rng = random.Random(seed)
    return [" " + rng.choice(WORDS) for _ in range(count)]


def kimi_pieces(count: int, seed: int = 2, args_chars: int = 120) -> list[str]:
    """A Kimi answer: prose, then sections of bash calls; markers arrive whole (they are single
    tokens), everything else in 1-4 character tokens."""
    rng = random.Random(seed)
    out: list[str] = []
    counter = 0
    while len(out) < count:
        out += tokens(prose(rng, 8) + " ", rng)
        out.append("<|tool_calls_section_begin|>")
        for _ in range(2):
            out.append("<|tool_call_begin|>")
            out += tokens(f"functions.bash:{counter}", rng)
            out.append("<|tool_call_argument_begin|>")
            out += tokens(orjson.dumps({"command": prose(rng, args_chars // 6)[:args_chars]}).decode(), rng)
            out.append("<|tool_call_end|>")
            counter += 1
        out.append("<|tool_calls_section_end|>")
    return out  # whole sections: a few pieces more than `count`


def sentinel_pieces(count: int, seed: int = 3, args_chars: int = 120) -> list[str]:
    """A Hermes answer: prose and `<tool_call>` blocks, all in 1-4 character tokens (the tags
    are several tokens for most tokenizers)."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < count:
        out += tokens(prose(rng, 8) + "\n", rng)
        block = {"name": "bash", "arguments": {"command": prose(rng, args_chars // 6)[:args_chars]}}
        out += tokens("<tool_call>\n" + orjson.dumps(block).decode() + "\n</tool_call>\n", rng)
    return out  # whole blocks: a few pieces more than `count`


def xml_pieces(count: int, seed: int = 4, args_chars: int = 120) -> list[str]:
    """A Qwen3-Coder answer: prose and `<tool_call><function=…><parameter=…>` blocks, the
    wrapper tags whole (single tokens in Qwen3-Coder's vocabulary), everything else in 1-4
    character tokens."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < count:
        out += tokens(prose(rng, 8) + "\n", rng)
        out.append("<tool_call>")
        out += tokens(f"\n<function=bash>\n<parameter=command>\n{prose(rng, args_chars // 6)[:args_chars]}\n</parameter>\n</function>\n", rng)
        out.append("</tool_call>")
        out.append("\n")
    return out  # whole blocks: a few pieces more than `count`


def responses_request(model: str) -> bytes:
    """A Responses API request declaring `bash` (the Responses shape of a tool)."""
    tool = {"type": "function", "name": "bash", "parameters": BASH_TOOL["function"]["parameters"]}
    return orjson.dumps({"model": model, "input": "hi", "tools": [tool], "stream": True})


def responses_events(pieces: list[str], model: str = QWEN_MODEL) -> list[bytes]:
    """A Responses API stream: created, a message item, one output_text delta per piece, done."""
    seq = iter(range(1 << 30))

    def event(payload: dict[str, Any]) -> bytes:
        payload = {**payload, "sequence_number": next(seq)}
        return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    response = {"id": "resp_bench", "object": "response", "created_at": 1772234856, "model": model, "status": "in_progress", "output": []}
    item = {"id": "msg_bench", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    out = [event({"type": "response.created", "response": response})]
    out.append(event({"type": "response.output_item.added", "output_index": 0, "item": item}))
    out.append(event({"type": "response.content_part.added", "item_id": "msg_bench", "output_index": 0, "content_index": 0,
                      "part": {"type": "output_text", "text": "", "annotations": []}}))
    for piece in pieces:
        out.append(event({"type": "response.output_text.delta", "item_id": "msg_bench", "output_index": 0,
                          "content_index": 0, "delta": piece, "logprobs": []}))
    text = "".join(pieces)
    part = {"type": "output_text", "text": text, "annotations": []}
    out.append(event({"type": "response.output_text.done", "item_id": "msg_bench", "output_index": 0, "content_index": 0,
                      "text": text, "logprobs": []}))
    out.append(event({"type": "response.content_part.done", "item_id": "msg_bench", "output_index": 0, "content_index": 0, "part": part}))
    done_item = {**item, "status": "completed", "content": [part]}
    out.append(event({"type": "response.output_item.done", "output_index": 0, "item": done_item}))
    out.append(event({"type": "response.completed", "response": {**response, "status": "completed", "output": [done_item]}}))
    return out
