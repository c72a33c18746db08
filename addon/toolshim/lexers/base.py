"""What every markup lexer emits, and the marker matching they share.

A lexer turns the text of one channel (`content`, or reasoning) into typed segments. It is fed
the text in whatever pieces the upstream sends and holds back only what a marker could still
need, so that the output is the same however the text was split.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

from ..calls import excerpt  # noqa: F401  (re-exported: the lexers quote markup in notes)


# Segments are made for nearly every piece of a stream, and never changed once made: plain
# slots classes, as a frozen dataclass's `__init__` costs about twice as much.
@dataclass(slots=True)
class Text:
    """Visible text that stays in the channel it came from."""

    text: str


@dataclass(slots=True)
class CallBegin:
    """A tool call starts; its id and name are final."""

    id: str
    name: str


@dataclass(slots=True)
class CallArgs:
    """A piece of the current call's arguments (raw JSON text, streamed as it arrives)."""

    text: str


@dataclass(slots=True)
class CallEnd:
    """The current call is complete."""


@dataclass(slots=True)
class ReasoningEnd:
    """A leaked `</think>` closed the reasoning: later text of this channel is content."""


@dataclass(slots=True)
class ReasoningText:
    """Text of a content channel that is reasoning (`<think>…</think>` in content): it belongs
    in the reasoning field (Chat) or a reasoning item (Responses)."""

    text: str


Segment = Text | CallBegin | CallArgs | CallEnd | ReasoningEnd | ReasoningText


class Lexer(Protocol):
    """One incremental lexer per channel and choice."""

    def feed(self, text: str) -> list[Segment]:
        """Consume the next piece of the channel's text."""

    def finish(self) -> list[Segment]:
        """End of the channel: release or close whatever is still held."""

    @property
    def idle(self) -> bool:
        """True when nothing is held and text without markers would pass unchanged."""

    def steady_piece(self, text: str, live: bool) -> str | None:
        """Optional, for a lane's commonest read: a piece taken in the lexer's steady state (a
        call's arguments streamed live, when `live`: arguments may be made; a block held), as
        `feed` takes it: the arguments it makes (`feed`'s one `CallArgs` of that text), ""
        when it makes nothing; busy before and after. None: not such a piece, nothing taken
        (`feed` reads it). Lanes look it up once, when they are armed (chat.py, `ArgsLane`).

        A lexer whose class names a `verbatim_stop` character promises more: once it made
        arguments (not "") of a text that does not end in whitespace, it is in its verbatim
        state until it is given anything else: it would make any text that is not empty, holds
        no `verbatim_stop` and does not end in whitespace into that text itself, and stay so.
        A lane then takes such a text as it is, without the call (chat.py `_args_read`, and the
        Messages and Responses lanes alike)."""


class Reporting:
    """A lexer that reports each change of its `idle` (see `Lexer`) to its watcher, if any: the
    `ScopeLexers` that made it counts its busy lexers (`busy`), so its `idle` costs nothing. Its
    `feed` serves lexers that hold what they are fed in `_buf` and read it with `_run(final)`."""

    idle = True
    watcher: Any = None  # a ScopeLexers

    def feed(self, text: str) -> list[Segment]:
        self._buf += text
        out = self._run(final=False)
        self._report_idle()
        return out

    def _report_idle(self) -> None:
        """Report the lexer's `_idle_now()` (hot paths compare first, sparing the calls)."""
        self._report(self._idle_now())

    def _report(self, idle: bool) -> None:
        if idle != self.idle:
            self.idle = idle
            if self.watcher is not None:
                self.watcher.busy += -1 if idle else 1

    def watched_by(self, watcher: Any) -> None:
        self.watcher = watcher
        if not self.idle:
            watcher.busy += 1


@dataclass(slots=True, frozen=True, eq=False)
class Marker:
    """A literal marker and the role it plays in its dialect. Compared and hashed by identity:
    markers are module constants, and `find_marker` looks their tuples up on every piece."""

    text: str
    kind: str


@dataclass(slots=True, frozen=True)
class Match:
    """Where `find_marker` stopped: a whole marker, or the start of a possible one."""

    pos: int
    marker: Marker | None  # None: a marker may begin at `pos`, more text is needed


class _MarkerTable:
    """What `find_marker` needs of a tuple of markers, made once per tuple: the first characters
    they begin with (a search for the next place one may begin), the markers longest first (the
    first that matches at a place is the longest there; of two as long, the first given), and
    every proper beginning of one (the text left at a place may still become one: one lookup)."""

    __slots__ = ("firsts", "longest_first", "beginnings", "longest")

    def __init__(self, markers: tuple[Marker, ...]) -> None:
        self.firsts = re.compile("[" + re.escape("".join(sorted({m.text[0] for m in markers}))) + "]")
        self.longest_first = tuple(sorted(markers, key=lambda m: -len(m.text)))  # (a stable sort)
        self.beginnings = frozenset(m.text[:end] for m in markers for end in range(1, len(m.text)))
        self.longest = max(len(m.text) for m in markers)


@lru_cache(maxsize=64)
def _marker_table(markers: tuple[Marker, ...]) -> _MarkerTable:
    return _MarkerTable(markers)


def find_marker(buf: str, start: int, markers: tuple[Marker, ...], final: bool) -> Match | None:
    """Find the first marker in `buf[start:]`, or the point from which one may still begin.

    Only positions holding the first character of some marker ("<" for most dialects, "[" for
    Mistral's) are examined: linear in the text whatever their density. Where the rest of the
    text is the beginning of a marker (`final` aside), the position is held (`marker=None`), even
    when a shorter marker matches there: a truncated marker like `<|tool_calls_section_end|`
    counts only when no `>` follows. Else the longest marker that matches whole wins.
    """
    table = _marker_table(markers)
    found = table.firsts.search(buf, start)
    if found is None:
        return None
    # (Each marker compared in turn costs less than one match of a pattern of them all: a
    # dialect's sets are small, and a pattern's match costs its setup each time.)
    firsts, longest_first, beginnings = table.firsts, table.longest_first, table.beginnings
    shortest_rest = len(buf) - table.longest  # (from here on the rest may be a marker's beginning)
    i = found.start()
    while True:
        if i > shortest_rest and not final and buf[i:] in beginnings:
            return Match(i, None)
        for marker in longest_first:
            if buf.startswith(marker.text, i):
                return Match(i, marker)
        found = firsts.search(buf, i + 1)
        if found is None:
            return None
        i = found.start()


def marker_beginnings(markers: tuple[Marker, ...]) -> frozenset[str]:
    """Every proper beginning of one of `markers`: text that `find_marker` holds when it is all
    that is left at a place where a marker may begin (the first character of one)."""
    return _marker_table(markers).beginnings


def is_marker_fragment(tail: str, markers: tuple[Marker, ...]) -> bool:
    """True when `tail` is a proper beginning of some marker (and at least two characters)."""
    return len(tail) >= 2 and any(m.text.startswith(tail) and m.text != tail for m in markers)


# -- the one JSON scanner ------------------------------------------------------------------------

MORE, STOP, CLOSED, WAIT = "more", "stop", "closed", "wait"
_STRING_STOP = re.compile(r'["\\]')


@lru_cache(maxsize=None)
def _value_stop(stops: str) -> re.Pattern[str]:
    """What `JsonScanner` stops at outside strings (made once a set of stops: a block's scanner
    is made anew for each block)."""
    return re.compile("[" + re.escape("{}[]\"" + stops) + "]")


class JsonScanner:
    """Follows the strings, escapes and nesting of one JSON value, resuming where it stopped.

    `scan` returns `(i, what)`: CLOSED, the value closed just before `i`; STOP, `buf[i]` is one
    of `stops` outside strings and is not consumed (the caller looks at it, then calls `take`);
    MORE, everything up to `limit` was read (WAIT, "more text needed here", is never returned:
    one character always decides). Each character is examined once.
    """

    _OPENERS, _CLOSERS = "{[", "}]"

    def __init__(self, stops: str = "") -> None:
        self._stops = stops
        self._value_stop = _value_stop(stops)
        self.reset()

    def reset(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escape = False

    def scan(self, buf: str, pos: int, limit: int, final: bool = False) -> tuple[int, str]:
        i = pos
        while i < limit:
            if self.in_string:
                if self.escape:  # the escaped character, whatever it is
                    self.escape = False
                    i += 1
                    continue
                stop = _STRING_STOP.search(buf, i, limit)
                if stop is None:
                    return limit, MORE
                j = stop.start()
                if buf[j] == '"':
                    self.in_string = False
                else:
                    self.escape = True
                i = j + 1
                continue
            stop = self._value_stop.search(buf, i, limit)
            if stop is None:
                return limit, MORE
            j = stop.start()
            if buf[j] in self._stops:
                return j, STOP
            if self.take(buf[j]):
                return j + 1, CLOSED
            i = j + 1
        return limit, MORE

    def take(self, c: str) -> bool:
        """Read one character outside strings; True when it closes the value."""
        if c == '"':
            self.in_string = True
        elif c in self._OPENERS:
            self.depth += 1
        elif c in self._CLOSERS and self.depth:
            self.depth -= 1
            return self.depth == 0
        return False


class PlainText:
    """No dialect: every piece of text passes as it came."""

    idle = True

    def feed(self, text: str) -> list[Segment]:
        return [Text(text)] if text else []

    def finish(self) -> list[Segment]:
        return []


class ChainLexer:
    """Two dialects on one channel: `first` reads the text, `second` reads `first`'s Text. When
    `first` emits anything else, what `second` holds is finished first: output keeps input order."""

    def __init__(self, first: Lexer, second: Lexer) -> None:
        self.first = first
        self.second = second

    @property
    def idle(self) -> bool:
        return self.first.idle and self.second.idle

    def feed(self, text: str) -> list[Segment]:
        return self._through_second(self.first.feed(text))

    def finish(self) -> list[Segment]:
        return self._through_second(self.first.finish()) + self.second.finish()

    def _through_second(self, segments: list[Segment]) -> list[Segment]:
        out: list[Segment] = []
        for seg in segments:
            if type(seg) is Text:
                out += self.second.feed(seg.text)
            else:
                out += self.second.finish()
                out.append(seg)
        return out


class TextPieces:
    """Text that arrives in token-sized pieces and is held until a block closes. A list of 1-4
    character strings costs about 60 bytes a character (an object and a pointer each); joining
    every `BATCH` pieces keeps it near one byte, copying each character once more: still linear."""

    BATCH = 256

    __slots__ = ("_joined", "_recent")

    def __init__(self) -> None:
        self._joined: list[str] = []
        self._recent: list[str] = []

    def append(self, piece: str) -> None:
        self._recent.append(piece)
        if len(self._recent) >= self.BATCH:
            self._joined.append("".join(self._recent))
            self._recent.clear()

    def clear(self) -> None:
        self._joined.clear()
        self._recent.clear()

    def text(self) -> str:
        """Everything appended, in order (kept joined for the next call)."""
        text = "".join(self._joined) + "".join(self._recent)
        self._joined.clear()
        self._joined.append(text)
        self._recent.clear()
        return text
