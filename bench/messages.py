"""The Anthropic Messages rewriter against the same targets as the Chat one.

    core     events/s against the orjson floor (loads + dumps of each event's data): plain text
             (the fast path), Kimi markup in thinking blocks, MiniMax markup in text blocks
    scaling  time per byte of a call's arguments, 1 KB vs 1 MB

Run alone with `.venv/bin/python bench/messages.py [--quick]`, or as part of `bench/run.py`.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import best_time, expect_calls, least_pass_row, rewrite_seconds, throughput_rows  # noqa: E402
from streams import kimi_pieces, plain_pieces, tokens  # noqa: E402
from table import Row  # noqa: E402

from toolshim.messages import MessagesStreamRewriter  # noqa: E402
from toolshim.tools import RequestContext  # noqa: E402

BASH = {"name": "bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}
KIMI_MODEL, MINIMAX_MODEL, PLAIN_MODEL = "moonshotai/Kimi-K2.5", "MiniMax-M2", "some-model"


def event(payload: dict) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def messages_events(model: str, kind: str, pieces: list[str]) -> list[bytes]:
    """A message of one `kind` block (text or thinking), one delta per piece."""
    delta_type = "text_delta" if kind == "text" else "thinking_delta"
    start = {"type": "text", "text": ""} if kind == "text" else {"type": "thinking", "thinking": "", "signature": ""}
    message = {"id": "msg_bench", "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1000, "output_tokens": 1}}
    return [
        event({"type": "message_start", "message": message}),
        event({"type": "content_block_start", "index": 0, "content_block": start}),
        *(event({"type": "content_block_delta", "index": 0, "delta": {"type": delta_type, kind: piece}}) for piece in pieces),
        event({"type": "content_block_stop", "index": 0}),
        event({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": len(pieces)}}),
        event({"type": "message_stop"}),
    ]


def minimax_pieces(count: int, seed: int = 4, args_chars: int = 120) -> list[str]:
    """Prose with MiniMax calls, every part (tags too) in 1-4 character pieces, about `count`."""
    rng = random.Random(seed)
    pieces: list[str] = []
    while len(pieces) < count:
        pieces += tokens("Let me look at the files in the project first. ", rng)
        command = "ls -la " + "x" * rng.randint(args_chars // 2, args_chars)
        call = f'<minimax:tool_call>\n<invoke name="bash">\n<parameter name="command">{command}</parameter>\n</invoke>\n</minimax:tool_call>'
        pieces += tokens(call, rng)
    return pieces


def rewriter(model: str) -> Callable[[], MessagesStreamRewriter]:
    request = {"model": model, "tools": [BASH]}
    return lambda: MessagesStreamRewriter(RequestContext.from_request(request))


def throughput(quick: bool) -> list[Row]:
    count = 5_000 if quick else 20_000
    rounds = 3 if quick else 5
    kimi, minimax = kimi_pieces(count), minimax_pieces(count)
    cases = [
        ("Messages API, plain text", messages_events(PLAIN_MODEL, "text", plain_pieces(count)), rewriter(PLAIN_MODEL), None, 3.0),
        ("Messages API, Kimi calls in thinking blocks", messages_events(KIMI_MODEL, "thinking", kimi), rewriter(KIMI_MODEL), "".join(kimi).count("<|tool_call_begin|>"), 0.5),
        ("Messages API, MiniMax calls in text blocks", messages_events(MINIMAX_MODEL, "text", minimax), rewriter(MINIMAX_MODEL), "".join(minimax).count("<invoke "), 0.5),
    ]
    rows = throughput_rows(cases, rounds)
    rows.insert(1, least_pass_row(cases[0][1], rounds, 2, ("text",), "Messages"))  # (events 0 and 1 start the message and its block)
    return rows


def _kimi_call(size: int) -> list[bytes]:
    rng = random.Random(5)
    arguments = '{"command": "' + "y" * size + '"}'
    pieces = ["Running it.", "<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions.bash:0", "<|tool_call_argument_begin|>"]
    pieces += tokens(arguments, rng)
    pieces += ["<|tool_call_end|>", "<|tool_calls_section_end|>"]
    return messages_events(KIMI_MODEL, "thinking", pieces)


def scaling(quick: bool) -> list[Row]:
    small, large = 1_000, (200_000 if quick else 1_000_000)
    per_byte = {}
    for size in (small, large):
        events = _kimi_call(size)
        repeat = max(1, large // size // 20)
        make = rewriter(KIMI_MODEL)
        seconds = best_time(lambda: [rewrite_seconds(make, events, 1, expect_calls(1)) for _ in range(repeat)], 5 if size == small else (1 if quick else 2)) / repeat
        per_byte[size] = seconds / size
    ratio = per_byte[large] / per_byte[small]
    return [Row(
        "scaling", f"Messages API, Kimi call arguments in a thinking block: time per byte, {large // 1000} KB vs 1 KB",
        f"{per_byte[small] * 1e9:.0f} ns vs {per_byte[large] * 1e9:.0f} ns = {ratio:.2f}x", "<= 1.3x", ratio <= 1.3,
    )]  # fmt: skip


def run(quick: bool = False) -> list[Row]:
    return throughput(quick) + scaling(quick)


if __name__ == "__main__":
    from table import markdown

    print(markdown(run("--quick" in sys.argv[1:])))
