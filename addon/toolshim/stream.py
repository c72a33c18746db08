"""What every streamed rewrite shares: SSE framing in, fail-open per event, the end of body.

An API rewriter (Chat Completions, Responses) subclasses `SseRewriter` and implements
`_on_block` (one complete SSE block in, the blocks to send out) and `_at_end` (the body ended:
release what the lexers still hold).

Lanes: a steady state (plain text while nothing is held; a call's arguments while a call is
open) is read from an event's bytes alone: the bytes around the one string that changes from
event to event (a `Frame`, learned from an event the full path read) are compared, the string is
decoded by itself, and the answer is the full path's own. A subclass sets `_direct` to the lane
that a read of one whole event takes straight from `feed` (no framing, no per-event
bookkeeping), and takes its lanes in `_on_block` for framed events. A lane may take a read of
several events at once as well (its `burst`: a call's arguments, bodies.py). Every lane is off
when `lanes` is False (tests compare both: the same bytes).
"""

from __future__ import annotations

import re

from collections.abc import Callable
from itertools import accumulate, count as counting
from operator import add
from typing import Any

import orjson

from .bodies import plain_bodies, plain_text
from .calls import RewriteStats
from .lexers import MARKUP_STARTS
from .lexers.base import ChainLexer, Lexer, Segment
from .lexers.think import ReasoningSplit
from .sse import SseFramer, has_no_fields

# The lanes, on by default; an instance's `lanes = False` turns them off (the differential tests).
LANES = True
# A lane taken straight from `feed`: (the rewriter, a read of one event) -> what to send, or None.
Direct = Callable[["SseRewriter", bytes], "list[bytes] | None"]

# `id:` and `retry:` lines of an event (an `id` line may have no colon). They are state of the
# client's EventSource (the last event id, the reconnection delay), not part of the data.
_CARRIED_FIELD = re.compile(rb"(?:^|(?<=[\r\n]))(?:id|retry)(?:[:][^\r\n]*)?(?:\r\n|\r|\n)", re.MULTILINE)
_LINE_END = re.compile(rb"\r\n?")
# Every marker begins with `<` or `[` (the dialect registry, `lexers.MARKUP_STARTS`). A `[` only
# counts as a bracket marker (`[TOOL_CALLS]`, `[THINK]`), or a text that ends in what may begin
# one (`… [TOO"`): the JSON's own brackets (`"choices":[{`, `"logprobs":[]`) never match.
# (tests/test_core_seed_oss.py checks that every registered start is seen.)
_BRACKET_MARKUP = re.compile(
    rb"\[(?:" + b"|".join(re.escape(m[1:].encode()) for m in MARKUP_STARTS if m[0] == "[") + rb'|/?[A-Z_]*")'
)


_MARKER_FIRSTS = tuple(sorted({start[0] for start in MARKUP_STARTS}))  # ("<", "[")


def text_may_start_markup(text: str) -> bool:
    """Might a marker of some dialect begin in this decoded text? Not without a marker's first
    character: an idle lexer gives such text back as it came, and stays idle (the lanes and
    Messages' late lexers rely on it)."""
    for first in _MARKER_FIRSTS:
        if first in text:
            return True
    return False


def markup_may_start(raw: bytes) -> bool:
    """Might a marker of some dialect begin in the text of these raw events (JSON bytes)? Every
    marker begins with `<` (`\\u003c` escaped) or is a bracket marker."""
    # (`in`: a search for one byte, no arguments parsed, see sse.py; no backslash, no escape: no
    # call, on the commonest read)
    if 60 in raw or (92 in raw and _escaped_markup(raw)):
        return True
    # A pattern that begins with a literal is searched for that byte in C: one pass, where
    # counting the JSON's own `[{` and `[]` to rule brackets out took three.
    return _BRACKET_MARKUP.search(raw) is not None


def _escaped_markup(raw: bytes) -> bool:
    """Is there a `\\u003` (an escaped `<`, or what may be one) in `raw`? A search for one byte
    is memchr, for several a pass over every byte: the first few backslashes are looked at one
    by one (text with quotes has a few), a run of many is searched for the escape itself.
    (`markup_may_start` calls it only for bytes that hold a backslash.)"""
    at = raw.find(b"\\")
    for _ in range(8):
        if at < 0:
            return False
        if raw.startswith(b"u003", at + 1):
            return True
        at = raw.find(b"\\", at + 1)
    return at >= 0 and raw.find(b"\\u003", at) >= 0


class Frame:
    """The bytes of an event around one JSON string value (or two equal values: mirrored
    fields), learned from one event: an event `head + s + tail` (or `head + s + mid + s + tail`)
    holds the same JSON as the learned one, but for the string whose body is `s`, provided `s`
    is a valid JSON string body (the caller decodes it, or rules out quotes in it)."""

    __slots__ = ("head", "mid", "tail", "fixed", "channel", "cut")

    def __init__(self, head: bytes, tail: bytes, mid: bytes | None = None) -> None:
        self.head, self.tail, self.mid = head, tail, mid
        self.fixed = len(head) + len(tail) + (len(mid) if mid is not None else 0)
        self.channel: object = None  # what a user of the frame says its string is (its keys)
        self.cut: tuple[int, int, slice] | None = None  # (`plain_bodies`, worked out when first needed)

    @classmethod
    def around(cls, raw: bytes, spans: list[tuple[int, int]]) -> Frame | None:
        """The frame of `raw` around the string bodies at `spans` (one, or two holding the same
        bytes), or None."""
        if len(spans) == 1:
            (start, end), = spans
            return cls(raw[:start], raw[end:])
        if len(spans) == 2:
            (s1, e1), (s2, e2) = sorted(spans)
            if e1 <= s2 and raw[s1:e1] == raw[s2:e2]:
                return cls(raw[:s1], raw[e2:], raw[e1:s2])
        return None

    def probe(self, body: bytes) -> bytes:
        """An event of this frame whose string body is `body`."""
        if self.mid is None:
            return self.head + body + self.tail
        return self.head + body + self.mid + body + self.tail

    def split(self, raw: bytes) -> bytes | None:
        """The string body of `raw` when `raw` is an event of this frame, else None."""
        extra = len(raw) - self.fixed
        mid = self.mid
        if mid is None:
            if extra < 0 or not raw.startswith(self.head) or not raw.endswith(self.tail):
                return None
            return raw[len(self.head) : len(self.head) + extra]
        if extra < 0 or extra & 1:
            return None
        # The event rebuilt around its first string and compared at once: a join and a compare
        # cost half what four compares of slices did.
        body = raw[len(self.head) : len(self.head) + (extra >> 1)]
        return body if b"".join((self.head, body, mid, body, self.tail)) == raw else None


# Events a lane is learned from: token-sized ones (a frame of a long event would not pay).
FRAME_MAX = 1 << 14

# A lane's burst (`_feed_read`) is tried on reads of about this many events or more: a burst
# costs a few calls whatever the read holds, which the events of a shorter read, each through
# the lane, cost less than (a Kimi flow in reads of two events: 20% more in process with it,
# in reads of four to eight the same or less; a long call's arguments in reads of eight, a
# third less).
BURST_MIN_EVENTS = 4


def plain_body(body: bytes, refuse: bytes | None = None) -> bool:
    """May the string body of an event of a frame learned from a plain text event pass without
    a look (what `markup_may_start` says of the whole event, the frame having passed)? Not with
    a line end (no longer one event), a `<`, a `[` or a `\\u003.` escape (a marker may begin),
    nor with a quote that is not escaped (`quoted_body`). `refuse`: not when `"` + `refuse`
    is in the event's bytes, nor when the body begins with it. (Membership of a byte as an int
    is the cheapest search CPython has.)"""
    if 60 in body or 91 in body or 10 in body or 13 in body or (92 in body and body.find(b"\\u003") >= 0):
        return False
    if 34 in body and not quoted_body(body, refuse):
        return False
    return refuse is None or not body.startswith(refuse)


# A JSON string body: every quote escaped, no escape cut short at its end.
_STRING_BODY = re.compile(rb'(?:[^"\\]++|\\.)*+', re.DOTALL)


def quoted_body(body: bytes, refuse: bytes | None) -> bool:
    """May a body holding a quote pass (`plain_body`)? Only when it is one JSON string body, so
    that the event holds the frame's JSON (an unescaped quote could make any other). Then a key
    the full path looks for in the raw bytes (`"tool_calls"`, `"finish_reason"`, `"content"`)
    cannot be made with the frame's bytes either: its closing quote would be escaped in the
    body, and what follows a string value in the tail is never `:`. Only a name's beginning
    (`"` + `refuse`, the `"reasoning` the full path looks for) can be in the body itself."""
    return _STRING_BODY.fullmatch(body) is not None and (refuse is None or body.find(b'"' + refuse) < 0)


def quiet_lane(frame: Frame, echo: EchoCheck, refuse: bytes | None = None) -> Direct:
    """A read of one plain text event of `frame`, taken straight from `feed` while the echo check
    holds nothing (`feed` asks `echo` before it takes the lane: `direct.waits_for`): the read as
    it came, or None (the framed path reads it). One event of the frame whose text may begin a
    marker (a `<`) is handed on to be read as the framed path reads it, at once
    (`SseRewriter._one_event_framed`). `refuse`: a body beginning with it is read in full too.
    A closure, with the fewest lookups on the commonest path."""
    head, tail = frame.head, frame.tail
    start, end = len(head), len(tail)  # (a tail holds at least the string's closing quote)
    first = refuse[0] if refuse else -1  # (no byte is -1)

    def direct(rewriter: SseRewriter, data: bytes) -> list[bytes] | None:
        if data[:start] != head or data[-end:] != tail:
            return None
        body = data[start:-end]  # empty: the event is no longer than the frame (or overlaps it)
        # `plain_body`, inline (this is the commonest read); a read of several events holds a
        # line end in its body: `10 in body`.
        if not body or 60 in body or 91 in body or 10 in body or 13 in body or (92 in body and body.find(b"\\u003") >= 0):
            if 60 in body and 10 not in body and 13 not in body:
                # One event of the frame in which a marker may begin (a block's opener): read
                # now, as the framed path would read it, not refused to go there through
                # `feed`'s tests of a read and the framer (a tenth of such an event's cost).
                return rewriter._one_event_framed(data)
            return None
        if 34 in body and not quoted_body(body, refuse):  # (about one token in thirty of prose)
            return None
        if body[0] == first and body.startswith(refuse):  # (a byte compared first: most bodies begin otherwise)
            return None
        return [data]

    def mirrored(_rewriter: SseRewriter, data: bytes) -> list[bytes] | None:
        body = frame.split(data)
        if body is None or not plain_body(body, refuse):
            return None
        return [data]

    def read_bodies(data: bytes) -> list[bytes] | None:
        # A read of several events of the frame (`_feed_read`'s burst), each passing as `plain_body`
        # lets it: plain bodies (no line end, `<`, `\u` escape nor bare quote), none with a `[`
        # nor (anywhere) `refuse`: their bodies. Reasoning in its own field, in bursts, before the
        # answer (whole reads pass only once it began: `ChatStreamRewriter._settle`).
        bodies = plain_bodies(data, frame)
        if bodies is None:
            return None
        joined = b"".join(bodies)
        if 91 in joined or (refuse is not None and joined.find(refuse) >= 0):
            return None
        return bodies

    def burst(_rewriter: SseRewriter, data: bytes) -> list[bytes] | None:
        return None if read_bodies(data) is None else [data]

    lane = direct if frame.mid is None else mirrored
    lane.waits_for = echo  # type: ignore[attr-defined]
    lane.burst = burst  # type: ignore[attr-defined]
    lane.read_bodies = read_bodies  # type: ignore[attr-defined]
    return lane


def held_burst(data: bytes, frame: Frame, leaf: Lexer, name_unknown: bool = False, guarded: bool = False) -> list[bytes] | None:
    """A lane's read of several events (`SseRewriter._feed_read`'s) inside a block its leaf holds
    whole (a chain's: its first stage, whose held block makes nothing for its second), taken at
    once when each is an event of `frame` with a plain body (`plain_bodies`: cut and checked in
    C): their text fed to the block as one (`held_bulk`), nothing sent: []. None: nothing taken
    (the events go one by one), as well for a text naming the reasoning field while it is not
    known (`name_unknown`, Chat) or, `guarded`, one in which a marker may begin (`live_path`).
    (chat.py's `_held_read`, messages.py's `_block_read`.)"""
    holder = leaf.first if type(leaf) is ChainLexer else leaf
    holding = getattr(holder, "holds_block", None)
    if holding is None or not holding():
        return None
    bodies = plain_bodies(data, frame)
    if bodies is None:
        return None
    text = plain_text(bodies)
    if (name_unknown and "reasoning" in text) or (guarded and text_may_start_markup(text)) or not holder.held_bulk(text):
        return None  # (a `<` escaped, the cap: each event is read by the lane)
    return []


def each_string(bodies: list[bytes]) -> list[str] | None:
    """Each of `bodies` decoded as a JSON string body, by one parse of them all as an array;
    None when one of them is no string body by itself. The array holds as many strings only
    then: a separator (`","`) is taken into a string only by an odd run of backslashes before
    it (looked for), and a quote that a body does not escape adds a string or breaks the array."""
    joined = b'","'.join(bodies) + b'","'
    cut = joined.find(b'\\","')
    separators = None
    while cut >= 0:  # (`\",` ends many a piece of JSON: only a separator's own backslashes count)
        if separators is None:  # where the separators begin: the bodies' lengths summed, 3 a separator
            separators = set(map(add, accumulate(map(len, bodies)), counting(0, 3)))
        if cut + 1 in separators:
            before = cut
            while before >= 0 and joined[before] == 92:
                before -= 1
            if (cut - before) & 1:
                return None
        cut = joined.find(b'\\","', cut + 1)
    try:
        texts = orjson.loads(b'["' + joined[:-2] + b"]")
    except orjson.JSONDecodeError:
        return None
    return texts if len(texts) == len(bodies) else None


def string_spans(raw: bytes, keys: tuple[str, ...]) -> list[tuple[int, int]] | None:
    """Where the string values of `keys` lie in the JSON of `raw` (each key once), or None."""
    if len(raw) > FRAME_MAX:
        return None
    spans = []
    for key in keys:
        found = [m.span(1) for m in _string_value(key).finditer(raw)]
        if len(found) != 1:
            return None
        spans.append(found[0])
    return spans


_STRING_VALUES: dict[str, re.Pattern[bytes]] = {}


def _string_value(key: str) -> re.Pattern[bytes]:
    pattern = _STRING_VALUES.get(key)
    if pattern is None:
        pattern = _STRING_VALUES[key] = re.compile(rb'"' + re.escape(key.encode()) + rb'"\s*:\s*"((?:[^"\\]++|\\.)*+)"')  # possessive: no backtracking
    return pattern


def live_path(lexer: Lexer, *, past_idle_first: bool = False) -> tuple[Lexer, list[Any]]:
    """The innermost lexer that reads a channel's text, and the lexers around it, outermost
    first. A `ReasoningSplit` whose think lexer reads nothing more (idle in content, not
    watching for a bare closer) and whose reasoning side is idle passes text to its content
    side as it came; a `ChainLexer` whose second stage is idle gives its first stage the text,
    and gives the second only the first's Text (none while a call's arguments stream: its
    second stage was finished when the call began, and stays so).
    `past_idle_first`: also a chain whose first stage is idle and second is not (a block the
    first passed on as text, Qwen3-Coder's `<tool_call><function=…>` in Hermes's chain): its
    first stage gives text in which no marker can begin (`text_may_start_markup`) to the second
    as it came, and stays idle; the path holds `SecondOf(chain)`, and a caller feeds the leaf
    only such text (`guarded`). Anything else is read as a whole (it is the leaf).
    (These are the lexers' own attributes: should they change, the channel's lexer is fed
    whole, always right.)"""
    try:
        return _live_path(lexer, past_idle_first)
    except AttributeError:
        return lexer, []


class SecondOf:
    """In a `live_path`: a chain whose second stage the path goes on to, its first idle."""

    __slots__ = ("chain",)

    def __init__(self, chain: ChainLexer) -> None:
        self.chain = chain


def guarded(path: list[Any]) -> bool:
    """Must the leaf of `path` be fed only text in which no marker can begin (`live_path`)?"""
    return any(type(node) is SecondOf for node in path)


_UNWINDS = hasattr(ChainLexer, "_through_second")  # (what `unwind` needs of a chain)


def _live_path(lexer: Lexer, past_idle_first: bool) -> tuple[Lexer, list[Any]]:
    path: list[Any] = []
    while True:
        kind = type(lexer)
        if kind is ReasoningSplit:
            think, reasoning, content = lexer._think, lexer._reasoning, lexer._content
            if not (think.reads_nothing and (reasoning is None or reasoning.idle) and lexer._side is content):
                return lexer, path
            path.append(lexer)
            lexer = content
        elif kind is ChainLexer and _UNWINDS:
            if past_idle_first and lexer.first.idle and not lexer.second.idle:
                path.append(SecondOf(lexer))
                lexer = lexer.second
                continue
            if lexer.first.idle or not lexer.second.idle:
                return lexer, path
            path.append(lexer)
            lexer = lexer.first
        else:
            return lexer, path


def unwind(path: list[Any], segments: list[Segment]) -> list[Segment]:
    """What the lexers of `path` (outermost first) make of their leaf's segments: what the
    channel's lexer would have returned had it been fed the text itself."""
    for node in reversed(path):
        if type(node) is ChainLexer:
            segments = node._through_second(segments)
    return segments  # (a ReasoningSplit, and a chain's idle first stage, pass them as they are)


def _latest_fields(fields: bytes) -> bytes:
    """Of `\\n`-ended field lines, the last `retry` and the last `id` (an EventSource keeps
    only those)."""
    last_id = last_retry = b""
    for line in fields.splitlines(keepends=True):
        if line.startswith(b"id"):
            last_id = line
        else:
            last_retry = line
    return last_retry + last_id


class NotedEvents(list):
    """The events lanes sent, noted for remembering the turn (memory.py) without reading them
    again: the very bytes objects a lane returned, one whole event each (or a read of several
    events a quiet lane's burst passed, its bodies in `several`), in the order sent, and what each
    run of them adds to (`runs`). Remembering walks what the client got and takes a
    piece as noted only when it *is* (by identity) the next noted one: whatever else went out
    around it (events the full path rendered, a read joined, a stream failed) is read again, so a
    note can make remembering cheaper but never different. The notes hold the objects alive, so
    no other piece can share an identity with one. `runs`: (the index of the run's first note,
    what its events add to, as the API's stream names it: ("args", choice, call index) and
    ("text", choice, fields) for Chat, ("args", block index) and ("text", block index, field) for
    Messages, None: not told, read again; the bytes around the JSON string body each of its events holds: before, after, and
    between its two copies for mirrored fields, else None). A lane that notes is armed first
    (`armed`)."""

    __slots__ = ("runs", "several")

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[tuple[int, tuple[Any, ...] | None, bytes, bytes, bytes | None]] = []
        # Notes that are a read of several events (a quiet lane's burst), by their index: the
        # string bodies of its events, as the lane found them.
        self.several: dict[int, list[bytes]] = {}

    def note_several(self, read: bytes, bodies: list[bytes]) -> None:
        """`read`, several events of the armed lane's frame whose bodies are `bodies`, sent as one piece."""
        self.several[len(self)] = bodies
        self.append(read)

    def armed(self, call: tuple[Any, ...] | None, head: bytes, tail: bytes, mid: bytes | None = None) -> None:
        """A lane that notes what it sends was armed (or taken up again): the events noted from
        now on are `head`, a string body, `tail` (with `mid`: the body, `mid`, the body again),
        and add their string to `call`."""
        runs = self.runs
        if not runs or runs[-1][1:] != (call, head, tail, mid):
            runs.append((len(self), call, head, tail, mid))


def noting_lane(lane: Direct, frame: Frame, call: tuple[Any, ...] | None) -> Direct:
    """`lane` (`quiet_lane`'s), noting each event it passes in the rewriter's `laned`, for
    remembering (`NotedEvents`); `noted_as`: what to arm it with."""

    def noting(rewriter: SseRewriter, data: bytes) -> list[bytes] | None:
        out = lane(rewriter, data)
        if out is not None and len(out) == 1 and out[0] is data and rewriter._direct_lane is noting:
            # (An event passed as it came, the lane still taken: not one the lane handed on to
            # be read, `_one_event_framed`, whose reading armed another lane, or rendered it.)
            rewriter.laned.append(data)
        return out

    noting.waits_for = lane.waits_for  # type: ignore[attr-defined]
    noting.noted_as = (call, frame.head, frame.tail, frame.mid)  # type: ignore[attr-defined]
    read_bodies = getattr(lane, "read_bodies", None)
    if read_bodies is not None:

        def noting_burst(rewriter: SseRewriter, data: bytes) -> list[bytes] | None:
            bodies = read_bodies(data)
            if bodies is None:
                return None
            rewriter.laned.note_several(data, bodies)  # (the read goes out as one piece)
            return [data]

        noting.burst = noting_burst  # type: ignore[attr-defined]
    return noting


class SseRewriter:
    """An SSE body in (any byte pieces), the repaired SSE body out."""

    def __init__(self) -> None:
        self._framer = SseFramer()
        self.stats = RewriteStats()
        self.failure: Exception | None = None
        self._echo = EchoCheck(self._assembled, self._telltales, self.stats)
        # `id:`/`retry:` lines of events rewritten or held, not sent yet: (the number of the
        # event in the stream, its field lines), oldest first.
        self._waiting: list[tuple[int, bytes]] = []
        # Held events the subclass may still send as they came, by identity: (raw, number).
        self._withheld: dict[int, tuple[bytes, int]] = {}
        self._sent_upto = 0  # the newest event whose fields went out while anything was waiting or held
        self._taken = 0  # events read so far: the number of the one being read
        # Set by a subclass while its state lets whole reads pass when `_nothing_to_read`.
        self._passes_whole_reads = False
        self._rest_untried = True  # (`_framed_rest_whole`: once a stream)
        self.lanes = LANES
        # Set (to a `NotedEvents`) by the caller that remembers the turn: the lanes that note
        # what they send (chat.py's `_args_read`, messages.py's `_block_read`, `noting_lane`)
        # note it there.
        self.laned: NotedEvents | None = None
        # Set by a subclass (`_direct`): the lane a read of one whole event takes from `feed` (it
        # returns the events to send, or None: the event takes the framed path). A function
        # called with the rewriter, never a bound method or a closure holding it: a rewriter in
        # a cycle with itself is freed by the garbage collector only (its full collections,
        # which cost the proxy as much as the lanes save).
        self._direct_lane: Direct | None = None
        # The lane `feed` takes first: `_direct` while nothing is framed, waiting or withheld
        # (and the echo check is idle, for a lane that `waits_for` it); else None. Worked out
        # again whenever any of these may have changed (`_open_gate`), so that the commonest
        # read costs `feed` one lookup before the lane.
        self._gate: Direct | None = None

    @property
    def _direct(self) -> Direct | None:
        return self._direct_lane

    @_direct.setter
    def _direct(self, lane: Direct | None) -> None:
        self._direct_lane = lane
        self._open_gate()

    def _open_gate(self) -> None:
        lane = self._direct_lane
        if lane is not None and (self._framer._buf or self._waiting or self._withheld):
            lane = None
        elif lane is not None and (echo := getattr(lane, "waits_for", None)) is not None and not echo.idle:
            lane = None
        self._gate = lane

    @property
    def changed(self) -> bool:
        """Did the client get anything else than upstream sent (so far)?"""
        return self._echo.changed

    def feed(self, data: bytes) -> list[bytes]:
        """The bytes to send for a read, in pieces: an event a lane sent is a piece of its own
        (remembering knows it by its identity: `NotedEvents`); the caller writes them as one."""
        # Inside a busy proxy each read begins with cold caches, and every function it calls
        # costs the cache misses of its code more than its instructions (bench/instructions.py
        # --cold): the commonest reads are told apart here, with the fewest calls.
        lane = self._gate
        if lane is not None:
            # One event, as a model's pace has it: a lane takes no read of several (its string
            # may hold no line end, nor a quote it does not decode). (Telling a read of several
            # apart first, with a search for the blank line, cost the one-event read more than
            # the lane's own refusal costs a read of several.)
            # (A lane's events need no number: none wait or are held while a lane takes events.)
            try:
                out = lane(self, data)
            except Exception as exc:
                return self._lane_failed(exc, data)
            if out is not None:
                return out
        # (`self._echo.idle`, inline: a property is a call, on every read)
        whole = self._passes_whole_reads and not self._waiting and not self._withheld and not (echo := self._echo)._unsent and echo._assembly is None
        if whole and data[-2:] == b"\n\n" and not self._framer._buf:
            # Whole events, as a read of several nearly always is (`_whole_read`'s commonest
            # case): as they came when nothing in them needs a look. (What this changes, a frame
            # learned, opens the gate again itself: `_direct`.)
            if self._nothing_to_read(data):
                if self._direct_lane is None and self.lanes:
                    self._passed_whole(data)
                return [data]
            whole = False  # (tried)
        offered: int | None = None  # (the read's first event's end, once its burst was offered here)
        if lane is not None and not whole and 2 <= (first_end := data.find(b"\n\n") + 2) < len(data) and 13 not in data:
            # A read of several events (in bursts) the lane refused, where whole reads do not
            # pass: the lane's burst, here, as `_feed_read` would offer it, without that call
            # nor the gate worked out again after it (a burst sets no lane; the checked one that
            # lets its lane go unchecked opens the gate itself: `_direct`).
            if (burst := getattr(lane, "burst", None)) is not None and len(data) >= BURST_MIN_EVENTS * first_end:
                try:
                    if (out := burst(self, data)) is not None:
                        return out
                except Exception as exc:
                    return self._lane_failed(exc, data)
            offered = first_end
        try:
            return self._feed_read(data, lane, whole, offered)
        finally:
            self._open_gate()

    def _lane_failed(self, exc: Exception, event: bytes) -> list[bytes]:
        """A lane raised on one whole event: as `_on_block_failing_open` fails, the event goes as
        it came and the stream passes unchanged from now on."""
        self.failure = exc
        self._direct = None
        self._taken += 1
        return [event]

    def _feed_read(self, data: bytes, lane: Direct | None, whole: bool, offered: int | None = None) -> list[bytes]:
        """A read `feed` did not send: `whole`, the whole read as it came when nothing in it needs
        a look (`_whole_read`); else, when it holds several events back to back (a fast model, a
        busy proxy: its first blank line before its end), the lane's (its burst, unless `feed`
        offered it the read already, its first event ending at `offered`); else framed."""
        if whole:
            passed = self._whole_read(data)
            if passed is not None:
                return passed
            if lane is not None:
                self._open_gate()  # (what the whole read learned may close the gate)
                lane = self._gate
        if offered is not None:
            first_end = offered  # (`feed` found it, as below, the lane unchanged: the read is not tried whole here)
        if lane is not None and (offered is not None or (2 <= (first_end := data.find(b"\n\n") + 2) < len(data) and 13 not in data)):
            if offered is None and (burst := getattr(lane, "burst", None)) is not None and len(data) >= BURST_MIN_EVENTS * first_end:
                # The read at once, when the lane can take it so (each event's piece without
                # Python work of its own: chat.py's `_args_burst`), and when it holds about
                # `BURST_MIN_EVENTS` events or more (its first event's size tells). Until the echo
                # check has decided, it gets each event and what went out for it: `_lane_direct`'s
                # `checked` has a burst only for a held block's lane, which sends nothing.
                try:
                    out = burst(self, data)
                except Exception as exc:
                    return self._lane_failed(exc, data)
                if out is not None:
                    return out
            # Each blank line ends an event (LF line ends), each through the lane while there
            # is one (an event it does not take is framed and read alone, after which the lane
            # may take the next). One split in C, not a search per event. A lane's events
            # need no number and carry no fields: lanes take one-line events, or frames without
            # fields, while the echo check is decided or idle (the lane's to check). (An empty
            # block, `\n\n\n`, makes an event that begins with a line end: no lane takes it,
            # the framer reads it.)
            events = data.split(b"\n\n")
            events.pop()  # after the last blank line: no event's end (b"" when the read ends one)
            if getattr(lane, "run", None) is not None:
                out, at = self._lane_runs(events)
            else:
                out = []
                at = 0
                for event in events:
                    lane = self._gate
                    if lane is None:
                        break
                    event += b"\n\n"
                    try:
                        sent = lane(self, event)
                    except Exception as exc:
                        sent = self._lane_failed(exc, event)
                    if sent is None:
                        sent = self._framed(event)
                        self._open_gate()
                    if self._gate is not lane and getattr(self._gate, "run", None) is not None:
                        # A block began (read framed, or by a lane's hand-off: `quiet_lane`): its
                        # lane takes the rest.
                        out += sent
                        at += len(event)
                        rest = data[at:].split(b"\n\n")
                        rest.pop()
                        more, taken = self._lane_runs(rest)
                        out += more
                        at += taken
                        break
                    out += sent
                    at += len(event)
            if at:
                if at < len(data):
                    out += self._framed(data[at:])
                return out
        return self._framed(data, True)  # (the whole read tried above, or not to be tried now)

    def _lane_runs(self, events: list[bytes]) -> tuple[list[bytes], int]:
        """`_feed_read`'s events through the lane, for a lane with a `run`, which takes a run of
        them at once where it can (events that add to a block held whole, none sent:
        `responses.held_reader`, `ChatStreamRewriter._args_run`): what went out, and the bytes
        of the read taken. A run is
        looked for where one may begin: first, and after an event that sent nothing; never again
        among events a run refused (each is looked at once by a run at most)."""
        out: list[bytes] = []
        at = skip = no_run = 0
        may_run = True
        for n, event in enumerate(events):
            if n < skip:
                continue  # (taken by a run)
            lane = self._gate
            if lane is None:
                break
            if may_run and n >= no_run and (run := getattr(lane, "run", None)) is not None:
                try:
                    ran = run(self, events, n)
                except Exception as exc:  # (as a lane's failure: the rest passes as it came)
                    self.failure = exc
                    self._direct = None
                    break
                if ran > 0:
                    skip = n + ran
                    at += sum(map(len, events[n:skip])) + 2 * ran
                    may_run = False  # (the event after a run is no event of it)
                    continue
                no_run = n - ran
            event += b"\n\n"
            try:
                sent = lane(self, event)
            except Exception as exc:
                sent = self._lane_failed(exc, event)
            if sent is None:
                sent = self._framed(event)
                self._open_gate()
            may_run = not sent
            out += sent
            at += len(event)
        return out, at

    def _lane_direct(self, read: Direct) -> Direct:
        """A lane whose events go out otherwise than they came (`read`, the method `_on_block`
        calls, unbound), for `_direct`: until the echo check has decided, it gets each event and
        what went out for it, as in the framed path."""
        if self._echo.changed:
            return read

        def checked(rewriter: SseRewriter, raw: bytes) -> list[bytes] | None:
            out = read(rewriter, raw)
            if out is not None and not rewriter._told(read, raw, out) and getattr(rewriter._gate, "lane", None) is not read:
                rewriter._open_gate()  # (a lane the read set may wait for the echo check)
            return out

        checked.lane = read  # type: ignore[attr-defined]
        run = getattr(read, "run", None)
        if run is not None:

            def checked_run(rewriter: SseRewriter, events: list[bytes], first: int) -> int:
                # A run sends nothing: the check gets its events, as `checked` gets each (held
                # bytes past `MAX_UNSENT` read into the assembly once after the run, not within).
                ran = run(rewriter, events, first)
                if ran > 0:
                    rewriter._told(read, b"\n\n".join(events[first : first + ran]) + b"\n\n", [])
                return ran

            checked.run = checked_run  # type: ignore[attr-defined]
            burst = getattr(read, "burst", None)
            if burst is not None:

                def checked_burst(rewriter: SseRewriter, data: bytes) -> list[bytes] | None:
                    # A held block's burst (a lane with a run: `ChatStreamRewriter._held_burst`)
                    # sends nothing: the check gets the read as `checked_run` gets a run's events.
                    # (A burst that sends events, a live call's arguments, is not offered here:
                    # until the check has decided, it gets each event and what went out for it.)
                    out = burst(rewriter, data)
                    if out is not None:
                        rewriter._told(read, data, out)
                    return out

                checked.burst = checked_burst  # type: ignore[attr-defined]
        return checked

    def _told(self, read: Direct, taken: bytes, out: list[bytes]) -> bool:
        """`_lane_direct`'s checked lane of `read` took `taken` and sent `out`: the echo check
        gets both; once it has decided, `read` is taken unchecked (True). (A method, not a
        closure of each checked lane: one object fewer a stream holds.)"""
        echo = self._echo
        echo.took(taken)
        echo.gave(out)
        if echo.changed and getattr(self._direct_lane, "lane", None) is read:
            self._direct = read
            return True
        return False

    def _one_event_framed(self, event: bytes) -> list[bytes]:
        """`_framed` of a read that is one whole event without fields (one data line, a lane's
        frame), the framer empty: the event is read as the framer would give it, without its
        cut (a lane's hand-off: `quiet_lane`)."""
        echo = self._echo
        echo.took(event)
        out = self._on_block_failing_open(event)
        echo.gave(out)
        self._open_gate()
        return out

    def _framed(self, data: bytes, whole_tried: bool = False) -> list[bytes]:
        if not whole_tried and self._whole_reads_pass():
            whole = self._whole_read(data)
            if whole is not None:
                return whole
        events = self._framer.feed(data)
        if self._rest_untried and len(events) > 2:
            return self._framed_rest_whole(events)
        out: list[bytes] = []
        for raw in events:
            self._echo.took(raw)
            out += self._on_block_failing_open(raw)
        self._echo.gave(out)
        return out

    def _framed_rest_whole(self, events: list[bytes]) -> list[bytes]:
        """`_framed`'s events, the first read of several that is framed (a stream's start, in
        bursts, with the text after it): once whole reads pass, the rest of the read passes as
        one when nothing in it needs a look, as a read of it alone would (`_whole_read`); before
        (reasoning first), once a quiet lane is learned, the rest goes to its burst. Once a
        stream: tried on every framed read, it cost the reads around markup more than it saved."""
        self._rest_untried = False
        out: list[bytes] = []
        echo, given, last = self._echo, 0, len(events) - 2
        burst_untried = True
        for at, raw in enumerate(events):
            echo.took(raw)
            out += self._on_block_failing_open(raw)
            if at < last and self._passes_whole_reads:
                echo.gave(out[given:])
                given = len(out)
                if self._whole_reads_pass() and self._nothing_to_read(events[at + 1]):
                    last = -1  # (the rest looked at once: linear in the read, whatever it holds)
                    rest = b"".join(events[at + 1 :])
                    if self._nothing_to_read(rest):
                        echo.took(rest)
                        out.append(rest)
                        if self._direct_lane is None and self.lanes:
                            self._passed_among(events[at + 1])
                        break
            elif (
                burst_untried and len(events) - at > BURST_MIN_EVENTS and (lane := self._direct_lane) is not None
                and getattr(lane, "waits_for", None) is not None and (burst := getattr(lane, "burst", None)) is not None
            ):  # fmt: skip
                # A quiet lane learned from the events before (reasoning, where whole reads do
                # not pass yet): the rest of the read (`BURST_MIN_EVENTS` events or more) through
                # its burst, as `_feed_read` gives it the next read, when it takes it as it came.
                echo.gave(out[given:])
                given = len(out)
                self._open_gate()
                if self._gate is lane:
                    burst_untried = False  # (the rest looked at once: linear in the read)
                    rest = b"".join(events[at + 1 :])
                    try:
                        passed = burst(self, rest)
                    except Exception:  # (as refused: each event is read, failing open on its own)
                        passed = None
                    if passed is not None:
                        echo.took(rest)
                        out += passed
                        break
        echo.gave(out[given:])
        return out

    def _whole_reads_pass(self) -> bool:
        # (Not while fields wait or a held event keeps its own: the next event sent takes them.)
        return self._passes_whole_reads and self._echo.idle and not self._waiting and not self._withheld

    def _whole_read(self, data: bytes) -> list[bytes] | None:
        """The fast path: the whole events of this read pass unframed when nothing in them
        needs a look; an unfinished last event waits in the framer, as ever. None: the read
        must be framed."""
        end = data.rfind(b"\n\n") + 2  # a blank line ends an event (a CRLF stream has none)
        # Only a read that ends an event takes the framer's held bytes out: a long event
        # arriving in many reads stays with the framer, which scans each byte once (taking
        # them out on every read copied and rescanned them: a 10 MB event took seconds).
        # A blank line split across reads is found by the framer below.
        held = b""
        if end >= 2 and self._framer._buf:
            held = self._framer.take_pending()
            data = held + data
            end += len(held)
        # After the last "\n\n", events ending in CR line ends ("\r\n\r\n", "\r\r") may be
        # complete: they must be framed and read, not left to the framer (fuzzing found a
        # `data: [DONE]\r\n\r\n` dropped that way), so such a read takes the framed path.
        if end >= 2 and data.find(b"\r", end) < 0:
            whole = data if end == len(data) else data[:end]
            if self._nothing_to_read(whole):
                if whole is data:
                    if self._direct_lane is None and self.lanes:
                        self._passed_whole(data)
                    return [data]
                self._framer.hold(data[end:])  # (no event is complete in it, nor a CR: see above)
                return [whole]
        if held:
            self._framer.feed(held)  # put back (no event is complete in it): framed with the read
        return None

    def close(self) -> list[bytes]:
        """End of body: complete blocks, then whatever the lexers still hold, then the tail."""
        out: list[bytes] = []
        for raw in self._framer.close():
            self._echo.took(raw)
            out += self._on_block_failing_open(raw)
        if self.failure is None:
            try:
                released = self._at_end()
            except Exception as exc:  # nothing more to lose than what was held
                self.failure = exc
            else:
                out += released
        # Fields still carried with nothing after them to go on are dropped: an event of an
        # `id:` alone would reach the OpenAI SDK as an event with empty data, which it cannot read.
        self._place_fields(out, None)
        self._waiting = []
        self._withheld.clear()
        tail = self._framer.take_pending()
        self._echo.gave(out)
        self._echo.end()
        return [*out, tail] if tail else out

    def take_pending(self) -> bytes:
        """Failing open: the bytes not yet forwarded, as they came."""
        return self._framer.take_pending()

    def _on_block_failing_open(self, raw: bytes) -> list[bytes]:
        """Invariant 4: after the first exception this stream's events pass as they came."""
        self._taken += 1
        if self.failure is not None:
            return [raw]
        try:
            out = self._on_block(raw)
        except Exception as exc:  # a bug of ours must not cost the client an event
            self.failure = exc
            self._direct = None
            self._withheld.clear()  # nothing held is sent from now on
            return self._place_fields([raw], raw)
        if out != [raw] and not has_no_fields(raw) and not any(piece is raw for piece in out):
            fields = _CARRIED_FIELD.findall(raw)
            if fields:
                sent_later = self._may_send_later(raw)
                self._wait(_LINE_END.sub(b"\n", b"".join(fields)), merge=not sent_later)
                if sent_later:
                    self._withheld[id(raw)] = (raw, self._taken)
        return self._place_fields(out, raw) if self._waiting or self._withheld else out

    def _wait(self, fields: bytes, merge: bool) -> None:
        """The fields of the event just read wait for an event to go on. Entries no held event
        stands between are merged, keeping the last `id` and the last `retry` (all the client
        keeps of them): a long hold costs one entry, not one per event. A held event's own entry
        stays apart: sent as it came, it carries its own fields, and only those are let go."""
        if merge and self._waiting and all(number < self._waiting[-1][0] for _, number in self._withheld.values()):
            fields = _latest_fields(self._waiting.pop()[1] + fields)
        self._waiting.append((self._taken, fields))

    def _place_fields(self, out: list[bytes], raw: bytes | None) -> list[bytes]:
        """An event rewritten or held loses its raw lines: its `id:` and `retry:` go on the
        events sent in its place, or on the next ones sent, so that the client's last event id
        and retry delay end up where upstream's would: never going back, none twice.

        `raw` is the event just read (None at the end). The last of an event's fields wins, so
        waiting fields older than an event sent as it came go before its own, and the newest go
        on the last piece. A held event sent as it came later keeps its own fields, unless they
        or newer ones went out meanwhile: then it goes without them."""
        if not out:
            return out
        last_keeps_own = False  # does the last piece end with its own fields (an event as it came)?
        for position, piece in enumerate(out):
            last_keeps_own = False
            if piece is raw:
                number = self._taken
                if self._withheld and not has_no_fields(raw) and _CARRIED_FIELD.search(raw):
                    self._sent_upto = number  # fields newer than anything held
            elif (withheld := self._withheld.pop(id(piece), None)) is not None:  # (kept alive: ids are unique)
                number = withheld[1]
                if number <= self._sent_upto:  # its own fields would repeat or take the client back
                    out[position] = _CARRIED_FIELD.sub(b"", piece)
                    continue
                self._waiting = [entry for entry in self._waiting if entry[0] != number]  # it carries them
                self._sent_upto = number
            else:
                continue
            last_keeps_own = True
            older = [fields for n, fields in self._waiting if n < number]
            if older:
                out[position] = _latest_fields(b"".join(older)) + piece
                self._waiting = [entry for entry in self._waiting if entry[0] > number]
        if self._waiting:
            fields = _latest_fields(b"".join(fields for _, fields in self._waiting))
            self._sent_upto = max(self._sent_upto, self._waiting[-1][0])
            self._waiting = []
            last = out[-1]
            if last_keeps_own:  # older than the fields: they go after its own, before the blank line
                cut = len(last) - (2 if last.endswith(b"\r\n") else 1)
                out[-1] = last[:cut] + fields + last[cut:]
            else:
                out[-1] = fields + last
        return out

    _telltales: dict[str, bytes] = {}  # see EchoCheck

    @staticmethod
    def _assembled(raw: bytes) -> list[Contribution]:
        """What a client assembles from one event of the API (see `EchoCheck`). Raises (or a
        subclass that does not say) when it cannot tell: then the flow counts as changed when
        its bytes part."""
        raise NotImplementedError

    def _may_send_later(self, raw: bytes) -> bool:
        """Might the event just read, not sent now, still be sent as it came (a subclass that
        holds raw events to send them later says so)? Then its fields stay in it."""
        return False

    def _nothing_to_read(self, data: bytes) -> bool:
        """With `_passes_whole_reads` set: may these whole events go out as they came?"""
        return False

    def _passed_whole(self, data: bytes) -> None:
        """A read of whole events passed as it came (`_nothing_to_read`): a subclass may learn
        a lane from it."""

    def _passed_among(self, event: bytes) -> None:
        """`event` passed as it came among others, in a read of several (`_framed_rest_whole`):
        a subclass may learn from it a lane to take up later, not now (a one-event lane would
        only refuse the reads of several that follow, in bursts)."""

    def _on_block(self, raw: bytes) -> list[bytes]:
        raise NotImplementedError

    def _at_end(self) -> list[bytes]:
        return []


# What a client assembles from one event, as contributions `(key, value, grows)`: a value that
# grows (`grows`: a text, arguments, a list of logprobs, as str) is appended to what came before
# under its key; any other value replaces it (the last one counts: a finish reason, usage, an
# id), but for `null`, which is no value.
Contribution = tuple[tuple, Any, bool]
Assembler = Callable[[bytes], list[Contribution]]


class EchoCheck:
    """Did the client get what upstream sent? Decided as the bytes go, without a copy of
    either body, so that a flow is marked and annotated only when what its client assembles
    differs from what upstream sent.

    Byte for byte while the bytes agree: only what came in and was not sent yet (what the
    rewriter holds) is kept. When they part (a `<` held at the end of one event and sent with
    the next, which re-cuts the text but changes nothing a client assembles), the events from
    there on are read into what a client assembles (`Assembly`, fed by the rewriter's API's
    `assembler`) on each side; once both sides agree again, byte for byte it is. A difference
    in what is assembled, a part of it only one side has, or more held than `MAX_UNSENT` makes
    `changed` final; so does a call the rewriter made of markup (its `stats`), once the bytes
    part, without either side read."""

    # Held raw bytes past this mean the rewriter is holding markup over many events (a block, a
    # section): they are read into the assembly (~1 byte a character instead of ~85 of event
    # JSON). Text held in the assembly past MAX_HELD decides it: changed.
    MAX_UNSENT = 16 * 1024
    MAX_HELD = 16 * 1024

    def __init__(self, assembler: Assembler | None = None, telltales: dict[str, bytes] | None = None, stats: RewriteStats | None = None) -> None:
        self.changed = False
        self._unsent = bytearray()
        self._assembler = assembler
        # Kinds of contribution (`key[0]`) upstream's events can only hold with these bytes in
        # them: ours holding one when the bytes upstream's held back lack them is a difference,
        # told without reading those events (a call made from markup held over many events).
        self._telltales = telltales or {}
        # The rewriter's counts: once it made a call of markup, what a client assembles differs
        # (a call upstream never sent), told without reading either side's events (`_compare`).
        self._stats = stats
        self._assembly: Assembly | None = None

    def took(self, raw: bytes) -> None:
        if not self.changed:
            self._unsent += raw

    def gave(self, pieces: list[bytes]) -> None:
        for at, piece in enumerate(pieces):
            if self.changed:
                return
            if self._assembly is None and self._unsent.startswith(piece):
                del self._unsent[: len(piece)]
            else:
                self._compare(pieces[at:])
                break
        if self.changed:
            return
        if self._assembly is not None and not self._unsent and self._assembly.agrees():
            self._assembly = None  # both sides assembled the same: bytes again
        elif len(self._unsent) > self.MAX_UNSENT:
            self._compare([])

    @property
    def idle(self) -> bool:
        """Everything received was sent as it came, or what is assembled agrees (or a difference
        is known already)."""
        return not self._unsent and self._assembly is None

    def end(self) -> None:
        if self.changed:
            return
        if self._unsent or self._assembly is not None:  # held and never sent, or sent otherwise
            self._compare([])
        if not self.changed and self._assembly is not None and not self._assembly.agrees():
            self._differs()
        self._assembly = None

    def _compare(self, pieces: list[bytes]) -> None:
        """What upstream sent that was not read yet, then `pieces` sent, into the assembly (read
        only when something was sent, or too much is held: a block held over many events, then
        made a call, is told apart by the telltales without being read)."""
        if self._assembler is None or (self._stats is not None and self._stats.calls):
            self._differs()
            return
        unsent, self._unsent = bytes(self._unsent), bytearray()
        ours = [contribution for piece in pieces for contribution in self._read(piece) or [(None, None, False)]]
        if self._assembly is None:
            self._assembly = Assembly(self.MAX_HELD)
        known, telltales = self._assembly.keys, self._telltales
        try:
            if any(key is None or (key[0] in telltales and key not in known and telltales[key[0]] not in unsent) for key, _, _ in ours):
                self._differs()
                return
            theirs = self._read(unsent)
            if theirs is None or not self._assembly.add(True, theirs) or not self._assembly.add(False, ours):
                self._differs()
        except TypeError:  # a key holding what is no key (an `item_id` that is a list): no telling
            self._differs()

    def _read(self, data: bytes) -> list[Contribution] | None:
        """What a client assembles from whole events' bytes; None: no telling."""
        framer = SseFramer()
        events = framer.feed(data) + framer.close()
        if framer.pending:  # not whole events
            return None
        contributions: list[Contribution] = []
        for raw in events:
            try:
                contributions += self._assembler(raw)
            except Exception:  # noqa: BLE001 (no telling)
                return None
        return contributions

    def _differs(self) -> None:
        self.changed = True
        self._unsent = bytearray()
        self._assembly = None


class Assembly:
    """What a client assembles from upstream's events and from ours, since the bytes parted:
    of what grows, only what one side has that the other does not yet (each side's text is the
    other's so far, plus what is held); of what is replaced, the last value on each side."""

    __slots__ = ("_ahead", "_last", "keys", "_held", "_limit")

    def __init__(self, limit: int) -> None:
        self._ahead: dict[tuple, tuple[bool, str]] = {}  # key -> (upstream's side?, what it has more)
        self._last: tuple[dict[tuple, Any], dict[tuple, Any]] = ({}, {})  # ours, upstream's
        self.keys: set[tuple] = set()  # keys upstream's side has had
        self._held = 0
        self._limit = limit

    def add(self, upstream: bool, contributions: list[Contribution]) -> bool:
        """False when the sides now differ for good."""
        for key, value, grows in contributions:
            if value is None:
                continue  # `null` and no field are one to a client (`logprobs`, `usage`, `finish_reason`)
            if upstream:
                self.keys.add(key)
            elif key not in self.keys:
                return False  # something upstream never sent (a call, text moved to another field)
            if not grows:
                self._last[upstream][key] = value
                continue
            if not value:
                continue
            side, more = self._ahead.get(key, (upstream, ""))
            if side == upstream or not more:
                self._ahead[key] = (upstream, more + value)
                self._held += len(value)
            elif more.startswith(value):
                self._ahead[key] = (side, more[len(value) :])
                self._held -= len(value)
            elif value.startswith(more):
                self._ahead[key] = (upstream, value[len(more) :])
                self._held += len(value) - 2 * len(more)
            else:
                return False
            if self._held > self._limit:
                return False
        return True

    def agrees(self) -> bool:
        """Does each side assemble the same so far?"""
        return not any(more for _, more in self._ahead.values()) and self._last[0] == self._last[1]
