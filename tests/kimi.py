"""Kimi K2 streams as real upstreams send them, for the tests.

`SEED_000` is the sequence from the project's seed specification (a Kimi-K2.5 upstream putting
two tool calls into `reasoning` and `reasoning_content`), completed with the second call the
seed elides.
"""

from __future__ import annotations

from typing import Any

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
MARKERS = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END)

SEED_000 = [
    "I will list the headers.",
    " " + SECTION_BEGIN,
    " " + CALL_BEGIN,
    " functions",
    ".b",
    "ash",
    ":",
    "15",
    " " + ARG_BEGIN,
    ' {"',
    "command",
    '": ',
    ' "',
    "ls",
    ' -la /usr/include | grep asm"',
    "}",
    " " + CALL_END,
    " " + CALL_BEGIN,
    " functions.read_file:16",
    " " + ARG_BEGIN,
    ' {"path": "/usr/include/asm/unistd.h"}',
    " " + CALL_END,
    " " + SECTION_END,
]

USAGE = {"prompt_tokens": 43206, "completion_tokens": 133, "total_tokens": 43339}


def chunk(model: str, delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-8c3707e154df23bb",
        "object": "chat.completion.chunk",
        "created": 1772234856,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        **extra,
    }


def kimi_chunks(
    model: str,
    pieces: list[str],
    *,
    fields: tuple[str, ...] = ("reasoning", "reasoning_content"),
    finish_reason: str = "stop",
    usage: dict[str, int] | None = USAGE,
    role_chunk: bool = True,
) -> list[dict[str, Any]]:
    """One chunk per piece, each piece written to every field in `fields` (mirrored)."""
    chunks = []
    if role_chunk:
        chunks.append(chunk(model, {"role": "assistant", "content": ""}))
    for piece in pieces:
        chunks.append(chunk(model, {name: piece for name in fields}))
    chunks.append(chunk(model, {name: "" for name in fields}, finish_reason))
    if usage is not None:
        chunks.append({**chunk(model, {}), "choices": [], "usage": usage})
    return chunks
