"""Core throughput and scaling of the sans-IO rewrite (no mitmproxy, no network).

Throughput: a stream's events are fed one event per `feed()` call, as mitmproxy hands the
stream callable one network read and a streaming server writes one event per read. Events per
second of the rewrite, beside the floor: `orjson.loads` + `orjson.dumps` of the same events'
data, the least any rewriter that reads each event must do. Best of several rounds, the
rewrite's and the floor's timed in turn (the figures least disturbed by the machine). Context
rows time the least any fast path must do (Chat's; the Responses API's, which also checks each
event's number and keeps its text; the Messages API's, in bench/messages.py), which bounds that
API's fast path row on this machine.

Scaling: time per byte of one tool call whose arguments grow from 1 KB to 1 MB, 1-4 characters
per event (Kimi, which streams arguments live, and Hermes, which holds the block until it
closes), of a text stream with a `<` every few characters (each may start a marker, the worst
case for hold-back), of a Responses text (whose parts' text is kept for the `.done` events) and
of a Kimi call's arguments on the Responses API (kept for the call's `.done` events). Linear
means the time per byte at 1 MB is at most 1.3x that at 1 KB.
"""

from __future__ import annotations

import random
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from streams import (  # noqa: E402
    KIMI_MODEL,
    PLAIN_MODEL,
    QWEN_MODEL,
    chat_events,
    kimi_pieces,
    plain_pieces,
    prose,
    request_body,
    responses_events,
    sentinel_pieces,
    tokens,
)
from table import Row  # noqa: E402

from toolshim.chat import ChatStreamRewriter  # noqa: E402
from toolshim.responses import _SEQUENCE_NUMBER, NumberedFrame, ResponsesStreamRewriter, _unusual  # noqa: E402
from toolshim.stream import Frame, string_spans  # noqa: E402
from toolshim.tools import RequestContext  # noqa: E402


def best_time(run: Callable[[], object], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def floor_seconds(events: list[bytes], rounds: int) -> float:
    datas = [line[5:] for event in events for line in event.split(b"\n") if line.startswith(b"data:") and b"[DONE]" not in line]

    def run() -> None:
        for data in datas:
            orjson.dumps(orjson.loads(data))

    return best_time(run, rounds)


def rewrite_seconds(make: Callable[[], object], events: list[bytes], rounds: int, check: Callable[[object, bytes], None]) -> float:
    def run() -> None:
        rewriter = make()
        out = []
        for event in events:
            out += rewriter.feed(event)
        out += rewriter.close()
        check(rewriter, b"".join(out))

    return best_time(run, rounds)


def against_floor(make: Callable[[], object], reads: list[bytes], events: list[bytes], rounds: int, check: Callable[[object, bytes], None]) -> tuple[float, float]:
    """(seconds of the rewrite of `reads`, seconds of the floor of `events`), each the best of
    `rounds`, the two timed in turn: a spell of other work on this shared machine (it lasts
    seconds) then weighs on both, where timing all of one and then all of the other let it
    move the ratio by half."""
    seconds = floor = float("inf")
    for _ in range(rounds):
        seconds = min(seconds, rewrite_seconds(make, reads, 1, check))
        floor = min(floor, floor_seconds(events, 1))
    return seconds, floor


def chat_rewriter(model: str) -> Callable[[], ChatStreamRewriter]:
    body = request_body(model)
    return lambda: ChatStreamRewriter(RequestContext.from_body(body))


def responses_rewriter(model: str) -> Callable[[], ResponsesStreamRewriter]:
    body = request_body(model)
    return lambda: ResponsesStreamRewriter(RequestContext.from_body(body))


def expect_calls(count: int) -> Callable[[object, bytes], None]:
    def check(rewriter, out: bytes) -> None:
        assert rewriter.failure is None, rewriter.failure
        assert rewriter.stats.calls == count, (rewriter.stats.calls, count)

    return check


def expect_unchanged(events: list[bytes]) -> Callable[[object, bytes], None]:
    body = b"".join(events)

    def check(rewriter, out: bytes) -> None:
        assert rewriter.failure is None and out == body, "a stream without markup must pass byte for byte"

    return check


Case = tuple[str, list[bytes], Callable[[], object], int | None, float]  # name, events, rewriter, calls (None: unchanged), target


def throughput_rows(cases: list[Case], rounds: int) -> list[Row]:
    """Events per second of each case against the orjson floor of the same events."""
    rows = []
    for name, events, make, calls, target in cases:
        check = expect_unchanged(events) if calls is None else expect_calls(calls)
        seconds, floor = against_floor(make, events, events, rounds, check)
        ratio = floor / seconds
        rows.append(Row(
            "core", f"{name}: events/s (floor: orjson loads+dumps)",
            f"{len(events) / seconds:,.0f} (floor {len(events) / floor:,.0f}) = {ratio:.2f}x floor",
            f">= {target:g}x floor", ratio >= target,
        ))  # fmt: skip
    return rows


def throughput(quick: bool) -> list[Row]:
    count = 5_000 if quick else 20_000
    rounds = 3 if quick else 5
    kimi = kimi_pieces(count)
    sentinel = sentinel_pieces(count)
    plain = plain_pieces(count)
    cases = [
        ("fast path: plain text, unknown model", chat_events(PLAIN_MODEL, plain), chat_rewriter(PLAIN_MODEL), None, 3.0),
        ("Kimi tool calls, 1-4 char deltas", chat_events(KIMI_MODEL, kimi), chat_rewriter(KIMI_MODEL),
         2 * kimi.count("<|tool_calls_section_begin|>"), 0.5),
        ("Hermes <tool_call>, 1-4 char deltas", chat_events(QWEN_MODEL, sentinel), chat_rewriter(QWEN_MODEL),
         "".join(sentinel).count("<tool_call>"), 0.5),
        ("Responses API, plain text", responses_events(plain), responses_rewriter(QWEN_MODEL), None, 3.0),
        ("Responses API, <tool_call> blocks", responses_events(sentinel), responses_rewriter(QWEN_MODEL),
         "".join(sentinel).count("<tool_call>"), 0.5),
    ]  # fmt: skip
    plain_events = cases[0][1]
    rows = throughput_rows(cases, rounds)
    # The same plain stream in 4 KB network reads (a client far behind, or a fast upstream):
    # whole reads pass unframed when nothing in them needs a look.
    reads = _reads(plain_events, 4096)
    seconds, floor = against_floor(chat_rewriter(PLAIN_MODEL), reads, plain_events, rounds, expect_unchanged(reads))
    rows.insert(1, Row(
        "core", "fast path: plain text in 4 KB reads: events/s (floor: orjson loads+dumps)",
        f"{len(plain_events) / seconds:,.0f} (floor {len(plain_events) / floor:,.0f}) = {floor / seconds:.2f}x floor",
        ">= 3x floor", floor / seconds >= 3,
    ))  # fmt: skip
    rows.insert(2, least_pass_row(plain_events, rounds))
    rows.insert(6, least_responses_row(cases[3][1], rounds))  # (after the Responses plain row)
    return rows


def least_pass_row(events: list[bytes], rounds: int, at: int = 1, keys: tuple[str, ...] = ("content",), api: str = "") -> Row:
    """What the fast path's target asks of Python here: a rewriter whose `feed` does no more
    than any rewriter that passes a plain event must (compare the event's frame around its
    text, scan the text for a byte that may begin markup, hand the event back), timed as the
    fast path row is. The frame (around the string of `keys`) is learned from the stream's
    first text event (`at`) with the addon's own `Frame`. Context, no target: it bounds the
    fast path row of that API (`api`: its name in the row) from above on this machine."""
    raw = events[at]
    frame = Frame.around(raw, string_spans(raw, keys) or [])
    assert frame is not None and frame.mid is None
    head, tail = frame.head, frame.tail
    start, end = len(head), len(tail)

    class Least:
        failure = None  # (read by the check, as a rewriter's)

        def feed(self, data: bytes) -> list[bytes]:
            # An event that fails a check would take the full path: not counted here (the row
            # is a bound), it goes back as it came like the others.
            if data[:start] == head and data[-end:] == tail:
                body = data[start:-end]
                if 60 in body or 91 in body or 92 in body or 34 in body or 10 in body:
                    return [data]
            return [data]

        def close(self) -> list[bytes]:
            return []

    plain = sum(e[:start] == head and e[-end:] == tail and not re.search(rb'[<\[\\"\n]', e[start:-end]) for e in events)
    assert plain >= 0.9 * len(events), (plain, len(events))  # (most events do all the work)
    seconds, floor = against_floor(Least, events, events, rounds, expect_unchanged(events))
    return Row(
        "core", f"context: the least a{' ' + api if api else ''} fast path does (frame compared, text scanned, one Python call an event)",
        f"{len(events) / seconds:,.0f} (floor {len(events) / floor:,.0f}) = {floor / seconds:.2f}x floor",
    )  # fmt: skip


def least_responses_row(events: list[bytes], rounds: int) -> Row:
    """`least_pass_row` for the Responses API, whose fast path does more for each text delta
    than compare and scan it: the event's `sequence_number` is checked against the next one
    (the rewriter numbers the events it sends), and the text is kept for the part's `.done`
    events, so it must be one JSON string body by itself (checked with the addon's own pattern:
    printable ASCII without a quote, a backslash, a `<` or a `[`; anything else would be
    decoded). The frame is the addon's own `NumberedFrame`, learned from the first text delta."""
    raw = next(event for event in events if b"output_text.delta" in event)
    frame = NumberedFrame.of(raw)
    assert frame is not None and not frame.number_first
    head, start = frame.head, len(frame.head)
    numbered = frame.mid.replace(b"%", b"%%") + b"%d" + frame.tail.replace(b"%", b"%%")
    first = int(_SEQUENCE_NUMBER.search(raw)[1])

    class Least:
        failure = None

        def __init__(self) -> None:
            self.number, self.texts = first, bytearray()

        def feed(self, data: bytes) -> list[bytes]:
            # (An event that is no text delta, or fails a check, would take the full path: not
            # counted here, as in `least_pass_row`; only the numbers are kept in step.)
            expected = numbered % self.number
            if data[:start] == head and data[-len(expected) :] == expected:
                body = data[start : -len(expected)]
                if _unusual(body) is None:
                    self.texts += body
            self.number += 1
            return [data]

        def close(self) -> list[bytes]:
            return []

    deltas = events[events.index(raw) :]
    kept = []
    counted = Least()
    for event in deltas:
        size = len(counted.texts)
        counted.feed(event)
        kept.append(len(counted.texts) > size)
    assert sum(kept) >= 0.9 * len(deltas), (sum(kept), len(deltas))  # (most events do all the work)
    seconds, floor = against_floor(Least, deltas, deltas, rounds, expect_unchanged(deltas))
    return Row(
        "core", "context: the least a Responses fast path does (frame and number compared, text checked and kept, one Python call an event)",
        f"{len(deltas) / seconds:,.0f} (floor {len(deltas) / floor:,.0f}) = {floor / seconds:.2f}x floor",
    )  # fmt: skip


def _reads(events: list[bytes], size: int) -> list[bytes]:
    """The events joined and cut into reads of `size` bytes (at any byte, as TCP does)."""
    body = b"".join(events)
    return [body[at : at + size] for at in range(0, len(body), size)]


def scaling(quick: bool) -> list[Row]:
    small, large = 1_000, (200_000 if quick else 1_000_000)
    rows = []
    for name, make_events, make in (
        ("Kimi call arguments", _kimi_call, chat_rewriter(KIMI_MODEL)),
        ("Hermes <tool_call> arguments", _sentinel_call, chat_rewriter(QWEN_MODEL)),
        ("text with a '<' every few characters", _angle_text, chat_rewriter(QWEN_MODEL)),
        ("Responses API text (each part's text is kept for its .done events)", _responses_text, responses_rewriter(QWEN_MODEL)),
        ("Responses API, Kimi call arguments (kept for the call's .done events)", _responses_kimi_call, responses_rewriter(KIMI_MODEL)),
    ):
        per_byte = {}
        for size in (small, large):
            events = make_events(size)
            rounds = 5 if size == small else (1 if quick else 2)
            repeat = max(1, large // size // 20)  # small sizes: time several streams
            seconds = best_time(lambda: [rewrite_seconds(make, events, 1, _no_failure) for _ in range(repeat)], rounds) / repeat
            per_byte[size] = seconds / size
        ratio = per_byte[large] / per_byte[small]
        rows.append(Row(
            "scaling", f"{name}: time per byte, {large // 1000} KB vs 1 KB",
            f"{per_byte[small] * 1e9:.0f} ns vs {per_byte[large] * 1e9:.0f} ns = {ratio:.2f}x",
            "<= 1.3x", ratio <= 1.3,
        ))  # fmt: skip
    return rows


def _no_failure(rewriter, out: bytes) -> None:
    assert rewriter.failure is None, rewriter.failure


def _arguments(size: int) -> str:
    rng = random.Random(size)
    return orjson.dumps({"command": "".join(rng.choice("abcdefgh ij/._-") for _ in range(size - 16))}).decode()


def _kimi_call(size: int) -> list[bytes]:
    rng = random.Random(4)
    pieces = ["<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions.bash:0", "<|tool_call_argument_begin|>"]
    pieces += tokens(_arguments(size), rng)
    pieces += ["<|tool_call_end|>", "<|tool_calls_section_end|>"]
    return chat_events(KIMI_MODEL, pieces)


def _sentinel_call(size: int) -> list[bytes]:
    rng = random.Random(5)
    return chat_events(QWEN_MODEL, tokens('<tool_call>{"name": "bash", "arguments": ' + _arguments(size) + "}</tool_call>", rng))


def _angle_text(size: int) -> list[bytes]:
    rng = random.Random(6)
    text = "".join(rng.choice(("a < b ", "x<y ", "if i <n ", "<3 ", "<< ")) for _ in range(size // 5))[:size]
    return chat_events(QWEN_MODEL, tokens(text, rng))


def _responses_kimi_call(size: int) -> list[bytes]:
    rng = random.Random(8)
    pieces = ["Running it.", "<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions.bash:0", "<|tool_call_argument_begin|>"]
    pieces += tokens(_arguments(size), rng)
    pieces += ["<|tool_call_end|>", "<|tool_calls_section_end|>"]
    return responses_events(pieces, model=KIMI_MODEL)


def _responses_text(size: int) -> list[bytes]:
    rng = random.Random(7)
    return responses_events(tokens(prose(rng, size // 3)[:size], rng))


def run(quick: bool = False) -> list[Row]:
    return throughput(quick) + scaling(quick)


if __name__ == "__main__":
    from table import markdown

    print(markdown(run(quick="--quick" in sys.argv)))
