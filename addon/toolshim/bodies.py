"""JSON string bodies read as bytes: a read of several events of one frame told apart and cut
in C, their bodies sent without decoding (the lanes' bursts: chat.py's `_args_burst`,
messages.py's `_block_burst`, each a burst of a call's arguments).

A plain body holds printable ASCII without `<` (no marker begins in it) and only the escapes
orjson writes alike (backslash-quote, backslash-backslash, b, f, n, r, t): it is its own output
bytes (orjson's encoding of its text).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import repeat
from operator import getitem
from typing import Any

import orjson

# The bytes a plain body may hold outside its escapes: printable ASCII but the quote, the
# backslash and `<`; and the escapes it may hold.
_PLAIN_BYTES = bytes(sorted(set(range(0x20, 0x7F)) - set(b'"\\<')))
_ESCAPES = re.compile(rb'\\["\\bfnrt]')


def plain_bodies(data: bytes, frame: Any) -> list[bytes] | None:
    """A read of whole events of `frame`, back to back, each holding a plain string body: their
    bodies, in order (the first copy of mirrored ones). None for any other read. A few calls into
    C, however many events: a burst of a call's arguments, eight events a read, costs next to no
    Python work per event here."""
    if 60 in data:
        return None  # a `<` (a marker may begin), told first: the commonest refusal
    head, tail, mid = frame.head, frame.tail, frame.mid
    cut = frame.cut
    if cut is None:
        cut = frame.cut = _lines_cut(head, tail, mid)
    step, first, body = cut
    lines = data.split(b"\n")  # (one byte to look for: much faster than the blank line's two)
    count, odd = divmod(len(lines) - 1, step)
    if odd or not count:
        return None
    strings = list(map(getitem, lines[first : count * step : step], repeat(body)))  # (each sliced in C)
    bodies = strings
    if mid is not None:
        # Each a body, `mid` and the body again: cut at every `mid` (joined by one), every second
        # piece is a first copy, each followed by its second. As many pieces as twice the
        # events: no more `mid` than one an event (a plain body holds none: it has a bare quote).
        # (Half of each by its length, and the events made again of both copies, cost twice that.)
        copies = mid.join(strings).split(mid)
        bodies = copies[::2]
        if len(copies) != 2 * len(strings) or copies[1::2] != bodies:
            return None
    # Whatever the lines were, the read is these events exactly when it is made of them again,
    # each body plain by itself (none empty; apart, an escape cut short at a body's end shows).
    if not all(bodies):
        return None
    joined = b"\x00".join(bodies)
    if 92 in joined:
        joined = _ESCAPES.sub(b"", joined)
    if joined.translate(None, _PLAIN_BYTES) != b"\x00" * (len(bodies) - 1):
        return None  # (left: what is no plain byte, and the NULs between the bodies)
    if head + (tail + head).join(strings) + tail != data:
        return None
    return bodies


def plain_text(bodies: list[bytes]) -> str:
    """The text of plain bodies (`plain_bodies`'), one after the other: decoded at once (no
    escape of one is cut short at its end)."""
    joined = b"".join(bodies)
    return joined.decode("ascii") if 92 not in joined else orjson.loads(b'"' + joined + b'"')


def burst_events(
    data: bytes, frame: Any, steady_bodies: Callable[[list[bytes], bool], list[bytes] | None], live: bool, head: bytes, tail: bytes,
    laned: list[bytes] | None,
) -> list[bytes] | None:  # fmt: skip
    """A lane's burst: a read of several events of `frame` whose plain bodies the leaf takes at
    once (`steady_bodies`, `live`: its arguments go out), as the events to send, each `head`, a
    piece of the arguments made, `tail`, and noted in `laned` (remembering's `NotedEvents`). None:
    nothing taken (the lane reads the events one by one)."""
    bodies = plain_bodies(data, frame)
    if bodies is None:
        return None
    made = steady_bodies(bodies, live)
    if made is None:
        return None
    if not made:
        return []
    # One event for each piece made, cut apart in C at a NUL put between them (no event holds
    # one: JSON has none raw, nor have plain bodies).
    sent = (head + (tail + b"\x00" + head).join(made) + tail).split(b"\x00")
    if laned is not None:
        laned.extend(sent)
    return sent


def _lines_cut(head: bytes, tail: bytes, mid: bytes | None) -> tuple[int, int, slice]:
    """How a read of events of a frame of `head` and `tail` splits at its line ends: lines an
    event, which of them holds the body, and that line's bytes around the body."""
    line_start = head.rfind(b"\n") + 1
    line_end = tail.find(b"\n")
    if line_end < 1 or (mid is not None and b"\n" in mid):  # (never a frame a lane learns)
        return 1, 0, slice(0, 0)
    before = head.count(b"\n")
    return before + tail.count(b"\n"), before, slice(len(head) - line_start, -line_end)
