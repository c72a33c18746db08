"""The dialect engine: one incremental lexer that reads any dialect described by a `Spec`.

A spec names its dialect and body kind (`JsonCalls`, `XmlParams`, `KeyValues`, `NamedCalls`,
`LlamaCalls`) with the dialect's strings; `lexer(spec, scope)` makes one channel's lexer. What
every body shares is here (the special-token dialects, machines of their own, share tokens.py's):

* Text outside blocks streams live; only a possible beginning of an opening marker is held.
* A block is held as written until it closes, then judged (declared names, strict schemas,
  `scope.admit_all`): all calls, or all text as written. One not this dialect's after all
  (`<tool_call>` then something else) or missing a part the grammar expects is released at once.
* Padding (the body kind's `_LIVE`). BLOCK: whitespace before an opening marker, still unsent
  when the marker is read (in the same piece, or held after a call or before a possible marker),
  is the block's. LIVE: it streams as text, and AFTER reads what follows a block (`_continues`,
  `_trailers`, `_gap_after`). Both: whitespace after calls is held (prose gets it back, a next
  block takes it as padding, the end drops it); calls drop their padding, text shows it.
* The cap: `max_held` counts every character of a block, markers included; the block is
  released at the same character however the text was split.
* Guarded closers: a body may read a closer and wait for what follows (PEND) before it counts;
  the look-ahead is at most one tag. A block missing its closer is judged as if closed when the
  next block's opener follows a complete part, or the text ends after one (each kind says when:
  vLLM and llama.cpp accept that); else it is text. A tag cut short at the end goes with the block.
* Without declared tools nothing can be a call: everything passes through at once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from functools import lru_cache
from typing import Any, NamedTuple

from ..calls import INVALID_JSON, UNKNOWN_NAME, CallScope
from ..judge import Calls, NotACall, ToolCallJudge, call_entries, judge_call, judge_entries, pythonic_entries
from ..schema import _properties, coerce_value, compact_json
from .base import CLOSED, MORE, STOP, WAIT, CallArgs, CallBegin, CallEnd, JsonScanner, Marker, Reporting, Segment, Text, TextPieces, excerpt, find_marker, marker_beginnings

TEXT, AFTER = "text", "after"
MAX_NAME = 256  # a function, parameter or key name longer than this is not a name
MAX_CALL_NAME = MAX_ID = 64  # OpenAI's limit: a longer run of name characters is prose, not a name
_MODEL_ID = re.compile(r"[A-Za-z0-9_\-]{1,64}")  # a model's own call id we pass on (Mistral's: 9 alphanumerics)
_WS = re.compile(r"\s*")
_PARTIAL = object()  # what `match_tag` returns when more text is needed to tell
FUNCTION, NAMED, PYTHON, TAGGED = "function", "named", "python", "tagged"  # Llama's openers


def match_tag(buf: str, j: int, limit: int, tags: Collection[str]) -> Any:
    """The tag of `tags` at `buf[j]` (before `limit`), `_PARTIAL`, or None."""
    # (Slices compared, not `startswith` with bounds: CPython 3.11 parses its arguments from a
    # format string on every call, about a thousand instructions.)
    available = limit - j
    for tag in tags:
        if len(tag) <= available and buf[j : j + len(tag)] == tag:
            return tag
    if available < 0 or j > len(buf):
        return None
    rest = buf[j:limit]
    for tag in tags:
        if available < len(tag) and tag[:available] == rest:
            return _PARTIAL
    return None


# -- specs (a body with one `open` is opened by it alone) ----------------------------------------


class JsonCalls(NamedTuple):
    """A JSON call object `{"name", "arguments"}` or a list of them, between `open` and `close`.
    `close=""`: no closer, the block ends with its value (Granite 3); `name_key`: the key naming
    the tool (Command's `tool_name`; its arguments are `parameters`, which the judge reads)."""

    open: str
    close: str
    name_key: str = "name"


class XmlParams(NamedTuple):
    """Function elements holding parameter elements, optionally in a wrapper, typed by schema."""

    wrap: tuple[str, str]
    function: tuple[str, str]  # the opening tag up to the name, and the closer
    parameter: tuple[str, str]
    bare: bool = False  # a function without the wrapper is a block too
    function_name_stop: str = r"[<>\n]"  # characters that end (`>`) or spoil a name
    parameter_name_stop: str = r"[<>\n]"
    quoted_names: bool = False  # `name="NAME"`: the quotes come off

    def markers(self) -> tuple[Marker, ...]:
        return (Marker(self.wrap[0], "wrap"),) + ((Marker(self.function[0], "bare"),) if self.bare else ())


class KeyValues(NamedTuple):
    """A name right after the opening tag, then key / value pairs up to the closer. `escaped`: a
    separator that may arrive escaped (GLM-4.6's literal backslash-n), taken as whitespace; a block
    with one has escaped values, read as JSON string text (kept as written if that fails)."""

    open: str
    close: str
    key: tuple[str, str]
    value: tuple[str, str]
    name_stop: str = r"[^\w.:/-]"  # a character that ends the name
    escaped: str = ""


class NamedCalls(NamedTuple):
    """After `open`: a JSON list of call objects, or calls back to back, each `NAME`, optionally
    `call_id` and the model's id, optionally `args`, then the arguments object that ends it."""

    open: str
    args: str
    call_id: str
    pad: str = r"[\s\u2581]*"  # held after `open` (`▁`: SentencePiece's space)


class LlamaCalls(NamedTuple):
    """Three spellings by opener: a JSON object in a `function` tag (the second opener's name ends
    at `">`), a Python list of calls after `python[0]`, call objects after `tagged` separated by
    `separator`, whitespace or nothing. Swallowed after calls: `python[1]`, one of `tagged_ends`."""

    function: tuple[str, str]
    function_end: str
    python: tuple[str, str]
    tagged: str
    tagged_ends: tuple[str, ...]
    separator: str

    def markers(self) -> tuple[Marker, ...]:
        return (Marker(self.function[0], FUNCTION), Marker(self.function[1], NAMED), Marker(self.python[0], PYTHON), Marker(self.tagged, TAGGED))


Body = JsonCalls | XmlParams | KeyValues | NamedCalls | LlamaCalls


class Spec:
    """A dialect the engine reads: its name (for notes and counters), its body, the markers the
    body opens a block with (made once: `find_marker` caches by them) and `starts`, their texts."""

    def __init__(self, name: str, body: Body) -> None:
        self.name = name
        self.body = body
        self.opens = body.markers() if isinstance(body, XmlParams | LlamaCalls) else (Marker(body.open, "open"),)
        self.starts = tuple(m.text for m in self.opens)


def lexer(spec: Spec, scope: CallScope, *, max_held: int = 1 << 20, **options: Any) -> BlockLexer:
    """The lexer of one channel for `spec` (`options`: the body kind's own)."""
    return _lexer_class(spec)(scope, max_held=max_held, **options)


@lru_cache(maxsize=None)
def _lexer_class(spec: Spec) -> type[BlockLexer]:
    """The body kind's class for `spec`, made once: it holds the grammar, each lexer only state."""
    kind = {JsonCalls: JsonCallsLexer, XmlParams: XmlParamsLexer, KeyValues: KeyValuesLexer, NamedCalls: NamedCallsLexer, LlamaCalls: LlamaCallsLexer}[type(spec.body)]
    grammar = kind._grammar(spec.body)
    grammar["_steps"] = {AFTER: kind._step_after, **grammar["_steps"]}
    grammar["_raw_states"] = tuple(state for state, step in grammar["_steps"].items() if getattr(step, "raw", False))
    grammar |= {"_body": spec.body, "_opens": spec.opens, "_opens_by_text": {m.text: m for m in spec.opens}, "_opens_beginnings": marker_beginnings(spec.opens)}
    return type(f"{kind.__name__}[{spec.name}]", (kind,), grammar)


# -- the engine --------------------------------------------------------------------------------

Step = Callable[[Any, str, int, int, list[Segment]], "int | None"]  # (the lexer, buf, pos, limit, out)
Then = Callable[[Any, str, int, Any, list[Segment]], "int | None"]  # what a step makes of `buf[j]`, a tag found there


def tag_beginnings(tags: Collection[str]) -> frozenset[str]:
    """The text `match_tag` finds cut short when it is all that is left: every proper beginning of
    a tag of `tags` that holds none of them whole."""
    beginnings = {tag[:n] for tag in tags for n in range(1, len(tag))}
    return frozenset(p for p in beginnings if not any(p.startswith(tag) for tag in tags))


def _at_tag(tags: Collection[str], then: Then, raw: bool = False) -> Step:
    """A BLOCK step: hold whitespace (`raw`: any text), then `then` with a tag of `tags` or None."""
    beginnings = tag_beginnings(tags)

    def step(self: BlockLexer, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        j, tag = (self._scan_to_tag if raw else self._tag_after_ws)(buf, i, limit, tags)
        if tag is not _PARTIAL:
            return then(self, buf, j, tag, out)
        return self._wait(buf, j, limit, out, beginnings)  # (held: `BlockLexer.feed` holds it again while it stays cut short)

    step.raw = raw  # type: ignore[attr-defined]  # (`BlockLexer.feed` holds text with no tag in such a state itself)
    return step


def _held(then: Then, run: re.Pattern[str] = _WS, name: str = "", most: int = 0, tags: tuple[str, ...] = ()) -> Step:
    """A LIVE step: a run of `run` (whitespace) is held, then `then(lexer, buf, end, tag, out)`
    reads the character after it (`tag`: the one of `tags` there or None; one cut short waits).
    `name`: the attribute the run adds to, a name of at most `most` characters (longer: no call)."""

    def step(self: BlockLexer, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        room = self._room(i, len(buf))
        if name:
            read = getattr(self, name)
            room = min(room, i + most - len(read) + 1)
        end = run.match(buf, i, room).end()
        self._take(buf, i, end)
        if self._over_cap(out):
            return end
        if name:
            setattr(self, name, read + buf[i:end])
            if len(read) + end - i > most:
                return self._release(out, end)
        if end == len(buf):
            return None
        tag = self._tag(buf, end, tags)
        return self._hold(buf, end) if tag is _PARTIAL else then(self, buf, end, tag, out)

    return step


def _opener(first: str, state: str, mark: bool = True) -> Step:
    """A LIVE step: whitespace, then a character of `first` begins the value (`state`; `mark`: set
    `_value_at`); else no call (`[TOOL_CALLS] [see below]`, `<|python_tag|>` then code for Llama's
    own interpreter, a model explaining the syntax): the tag shows now, its prose streams live."""

    def then(self: BlockLexer, buf: str, end: int, tag: None, out: list[Segment]) -> int | None:
        if buf[end] not in first:
            return self._release(out, end)
        if mark:
            self._value_at = self._size
        self._state = state
        return end

    return _held(then)


def _follow(scanner: str, cut_by: tuple[str, ...], closed: Callable[..., int], cut: Any = None) -> Step:
    """A LIVE step: the lexer's `scanner` (`JsonScanner`'s contract) follows a value from where
    the last piece stopped; `closed(lexer, out, end)` when it closes. A tag of `cut_by` outside its
    strings is `cut(lexer, out, at, tag)`, by default a value cut short: released, TEXT reads it.
    A tag of `cut_by` cut short at the scanner's stop is held with what the step holds again (its
    beginnings) and the look-ahead the step counts for it in `examined`, one of the first tag's
    length at most: `BlockLexer.feed` holds a piece that leaves it cut short, and counts that
    look-ahead as the step would (no more than the text held)."""
    beginnings = tag_beginnings(cut_by)
    lookahead = len(cut_by[0])

    def step(self: BlockLexer, buf: str, pos: int, limit: int, out: list[Segment]) -> int | None:
        limit = self._room(pos, len(buf))
        follow = getattr(self, scanner)
        while True:
            j, what = follow.scan(buf, pos, limit, self._final)
            self.examined += j - pos
            self._take(buf, pos, j)
            if what is CLOSED:
                return closed(self, out, j)
            if what is MORE:
                return j if self._over_cap(out) else None
            if what is STOP:  # maybe a tag: the look-ahead counts as one of the first tag's length
                self.examined += min(lookahead, len(buf) - j)
            tag = _PARTIAL if what is WAIT else self._tag(buf, j, cut_by)
            if tag is _PARTIAL:  # more text is needed to read `buf[j:]`
                return self._hold(buf, j) if what is WAIT else self._hold(buf, j, beginnings, lookahead)
            if tag is not None:
                return cut(self, out, j, tag) if cut else self._release(out, j)
            follow.take(buf[j])
            self._take(buf, j, j + 1)
            pos = j + 1

    return step


class BlockLexer(Reporting):
    """Everything but the body's grammar: text, padding, holding a block, the cap, the verdict.

    A body kind gives `_grammar` (class attributes, `_lexer_class`: `_steps`, one step per state,
    reading `buf` up to `limit`, returning where to go on or None to wait), `_FIRST` (the state each
    kind of opener begins), `_reset_body`, `_verdict(text)` (its admitted calls; None: text).
    Steps hold (`_take`) each character of a block once, plus a bounded look-ahead. BLOCK steps read
    to the cap (`limit`) and `_wait`; LIVE ones read a character past it and release the block."""

    _LIVE = False  # LIVE padding (see the module docstring); else BLOCK
    _initial = TEXT  # the state the text begins in

    _body: Body
    _opens: tuple[Marker, ...]
    _opens_by_text: dict[str, Marker]
    _opens_beginnings: frozenset[str]  # what TEXT holds unread when it is all the text left (`find_marker`)
    _held_for: frozenset[str] | None = None  # what the step that held the tail holds of it again (`_hold`)
    _held_lookahead = 0  # and the look-ahead it counts in `examined` when it does
    _steps: dict[str, Step]
    _raw_states: tuple[str, ...]  # the states whose step holds any text up to a tag (`_at_tag(raw=True)`)

    def __init__(self, scope: CallScope, *, max_held: int = 1 << 20) -> None:
        self._scope = scope
        self.judge = ToolCallJudge(scope)  # its validator cache and INVALID_SCHEMA notes
        self._max_held = max_held
        self._pass_through = not scope.tools  # nothing held, nothing scanned
        self.examined = 0  # characters of JSON bodies examined by the scanner, over the lexer's life
        # The block as written, marker included; the text shown among its calls (XmlParams'
        # IN_WRAP): (number of calls before it, start, end). Emptied for each block, not made
        # again: each object a stream holds counts toward the garbage collector's next run.
        self._raw = TextPieces()
        self._texts: list[tuple[int, int, int]] = []
        self._reset()
        if self._state != TEXT:
            self._report(False)

    def _finish_block(self, out: list[Segment], tail: str) -> None:
        """The text ended in a block: LIVE steps read `tail` as final; a BLOCK's goes with it."""
        if self._LIVE:
            self._run(tail, out, final=True)
            tail = ""
            if self._state in (TEXT, AFTER):
                return
        if self._complete_at_end():
            self._take(tail, 0, len(tail))
            self._close(out, 0, implied=self._LIVE)
        else:  # nothing complete was a call: everything held is text, nothing lost
            self._release(out, 0, tail)

    def _complete_at_end(self) -> bool:
        return False

    def _continues(self, c: str) -> str | None:
        """AFTER: the state `c` begins when it continues the calls without a marker (None: not)."""
        return None

    def _gap_after(self) -> re.Pattern[str]:
        """AFTER: what is held as whitespace after the last block (separators between its calls too)."""
        return _WS

    def _reset(self) -> None:
        self._state = self._initial
        self._tail = ""  # unread text: a possible beginning of a marker or tag
        self._pad = ""  # whitespace held in TEXT or AFTER (padding, see the module docstring)
        self._after_call = False  # the last thing out was a call: whitespace is held
        self._trailers: tuple[str, ...] = ()  # end tokens swallowed after the last calls
        self._section = ""  # the kind of marker that opened the last block
        self._final = False  # the text has ended (`finish`)
        self._reset_block()

    def _reset_block(self) -> None:
        self._block_pad = ""  # the padding in front of the current block's marker
        self._raw.clear()
        self._size = 0  # its length: offsets into the block are counted in it
        self._last = ""  # its last character (does a tag open a line?)
        self._name = ""  # the name being read
        self._value_at = 0  # where the current value begins in the block
        self._texts.clear()
        self._reset_body()

    def feed(self, text: str) -> list[Segment]:
        if self._pass_through:
            return [Text(text)] if text else []
        if self._state in self._raw_states and not self._tail and "<" not in text and self._size + len(text) <= self._max_held:
            self._take(text, 0, len(text))  # (as the state's step holds text with no tag: each begins with `<`)
            return []
        if self._tail and (held_for := self._held_for) is not None and (buf := self._tail + text) in held_for and self._size + len(buf) <= self._max_held:
            # A tag cut short, held, and with this piece still cut short (a tag in token-sized
            # pieces): held again without the steps, as the step that held it holds it (a
            # marker's beginning in TEXT, a tag's in a block: `_hold`). Only within the cap:
            # past it the steps decide (a BLOCK step releases the block).
            self._tail = buf
            if self._held_lookahead:  # (`_follow`'s step counts its look-ahead at a tag: at most what is held)
                self.examined += min(self._held_lookahead, len(buf))
            return []
        return self._read(text)

    def _read(self, text: str) -> list[Segment]:
        """`feed` by the steps, whatever the state (what its shortcuts take as they would)."""
        out: list[Segment] = []
        buf, self._tail = self._tail + text, ""
        self._run(buf, out, final=False)
        idle = self._state == TEXT and not self._tail and not self._pad and not self._after_call
        if idle != self.idle:  # reported on change only: the hot path pays one comparison
            self._report(idle)
        return out

    def holds_block(self) -> bool:
        """In a block, in a state that holds any text up to a tag (`_raw_states`), nothing
        unread: `held_bulk` may take text."""
        return self._state in self._raw_states and not self._tail

    def held_bulk(self, text: str) -> bool:
        """Take `text` into the held block when it can neither end nor release it, as `feed`
        takes it (which then makes no segment): True; else False, nothing taken. Every tag
        begins with `<`; the cap is the other way out. A lane gives a run of a block's pieces
        at once (`ChatStreamRewriter._args_run`, `responses.held_reader`)."""
        if not self.holds_block() or "<" in text or self._size + len(text) > self._max_held:
            return False
        self.feed(text)
        return True

    def finish(self) -> list[Segment]:
        if self.idle and self._initial == TEXT:
            # Nothing held: nothing to release, and the state is the one the text begins in but
            # for two marks of the last block, cleared as `_reset` clears them (a chain finishes
            # its idle second stage before each segment of a call of its first: three a call).
            self._trailers = ()
            self._section = ""
            return []
        return self._finish_all()

    def _finish_all(self) -> list[Segment]:
        """`finish`, whatever the lexer holds."""
        out: list[Segment] = []
        tail, self._tail = self._tail, ""
        if self._state == TEXT:
            self._run(tail, out, final=True)
        else:
            self._finish_block(out, tail)
        if not self._after_call:
            self._emit(out, self._pad)
        self._reset()
        self._report(self._state == TEXT)
        return out

    # -- text --------------------------------------------------------------------------------------

    def _run(self, buf: str, out: list[Segment], final: bool) -> None:
        self._final = final
        pos: int | None = 0
        while pos is not None:
            if self._state == TEXT:
                pos = self._scan_text(buf, pos, out, final)
                continue
            # Never read past the cap (see the module docstring); `pos - size` is where the block began.
            limit = min(len(buf), max(pos, pos + self._max_held - self._size))
            while self._state != TEXT and pos is not None:
                pos = self._steps[self._state](self, buf, pos, limit, out)

    def _scan_text(self, buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
        """TEXT: pass text on; stop at an opening marker, or hold what may still become one."""
        match = find_marker(buf, pos, self._opens, final)
        if match is None:
            self._take_text(buf[pos:], out, before_tag=False)
            return None
        self._take_text(buf[pos : match.pos], out, before_tag=True)
        if match.marker is None:
            return self._hold(buf, match.pos, self._opens_beginnings)
        self._block_pad, self._pad = self._pad, ""
        return self._open(buf, match.pos, match.marker)

    def _open(self, buf: str, at: int, marker: Marker) -> int:
        self._section = marker.kind
        end = self._take_tag(buf, at, marker.text)
        self._state = self._FIRST[marker.kind]
        return end

    def _take_text(self, text: str, out: list[Segment], before_tag: bool) -> None:
        """Text outside blocks; `before_tag`: a marker (or a possible one) follows it."""
        if before_tag and not self._LIVE:
            body = text.rstrip()
        else:
            body = "" if self._after_call and text.isspace() else text
        if body:
            self._send_pad(out, body)
        self._pad += text[len(body) :]
        if len(self._pad) > self._max_held:  # a flood of whitespace is not padding
            self._send_pad(out)

    def _send_pad(self, out: list[Segment], text: str = "") -> None:
        """The held whitespace goes out as text, in front of `text`: prose is last out."""
        self._emit(out, self._pad + text)
        self._pad = ""
        self._after_call = False

    # -- holding -----------------------------------------------------------------------------------

    def _take(self, buf: str, start: int, end: int) -> None:
        """`buf[start:end]` becomes part of the held block."""
        if end > start:
            self._raw.append(buf[start:end])
            self._size += end - start
            self._last = buf[end - 1]

    def _take_tag(self, buf: str, j: int, tag: str) -> int:
        """The tag at `buf[j]` becomes part of the held block; reading goes on after it."""
        self._take(buf, j, j + len(tag))
        return j + len(tag)

    def _tag_after_ws(self, buf: str, i: int, limit: int, tags: tuple[str, ...]) -> tuple[int, Any]:
        """BLOCK: whitespace from `i` is held; where it ends and `match_tag` there (`_PARTIAL`: wait)."""
        j = _WS.match(buf, i, limit).end()
        self._take(buf, i, j)
        return j, match_tag(buf, j, limit, tags)

    def _scan_to_tag(self, buf: str, i: int, limit: int, tags: Collection[str]) -> tuple[int, Any]:
        """BLOCK: raw text from `i` is held up to the first tag of `tags`; where it is and which
        (`_PARTIAL` up to `limit`: `_wait`). Every tag begins with `<`."""
        while True:
            j = buf.find("<", i, limit)
            if j < 0:
                self._take(buf, i, limit)
                return limit, _PARTIAL
            self._take(buf, i, j)
            tag = match_tag(buf, j, limit, tags)
            if tag is not None:
                return j, tag
            self._take(buf, j, j + 1)
            i = j + 1

    def _name_upto(self, buf: str, i: int, limit: int, stop: re.Pattern[str]) -> tuple[int, bool]:
        """BLOCK: name characters from `i` are held and added to `_name`, up to `stop`: where they
        end (`limit`: `_wait`); False: the name grew longer than MAX_NAME, it is none."""
        room = MAX_NAME - len(self._name)
        end = min(limit, i + room + 1)
        found = stop.search(buf, i, end)
        if found is None and end - i > room:
            self._take(buf, i, i + room)
            return i + room, False
        j = end if found is None else found.start()
        self._take(buf, i, j)
        self._name += buf[i:j]
        return j, True

    def _hold(self, buf: str, j: int, held_for: frozenset[str] | None = None, lookahead: int = 0) -> None:
        """`buf[j:]` is kept unread: the next piece decides (None: the step waits for it).
        `held_for`: the text the step holds again, unread, when it is all that is left (a tag
        cut short: `tag_beginnings`); `feed` holds a piece that leaves the tail one of them,
        counting in `examined` the `lookahead` the step counts when it holds it again."""
        self._tail = buf[j:]
        self._held_for = held_for
        self._held_lookahead = lookahead

    def _wait(self, buf: str, j: int, limit: int, out: list[Segment], held_for: frozenset[str] | None = None) -> int | None:
        """More text is needed from `j` on; past the cap there is none to wait for."""
        if limit < len(buf):  # what would decide lies beyond `max_held`: the block is text
            return self._release(out, limit, buf[j:limit])
        return self._hold(buf, j, held_for)

    def _room(self, pos: int, n: int) -> int:
        return min(n, pos + max(0, self._max_held - self._size) + 1)

    def _over_cap(self, out: list[Segment]) -> bool:
        if self._size > self._max_held:
            self._release(out)
            return True
        return False

    def _tag(self, buf: str, j: int, tags: Collection[str]) -> Any:
        """`match_tag` to the end of `buf`; once the text has ended, a tag cut short is none."""
        tag = match_tag(buf, j, len(buf), tags)
        return None if tag is _PARTIAL and self._final else tag

    # -- after a block (LIVE) ----------------------------------------------------------------------

    def _step_after(self, buf: str, pos: int, limit: int, out: list[Segment]) -> int | None:
        """AFTER: whitespace (and separators) after a block; what follows says whose it is."""
        n = len(buf)
        end = self._gap_after().match(buf, pos).end()
        self._pad += buf[pos:end]
        if not self._after_call:  # after text it is text, whatever follows
            self._send_pad(out)
        if len(self._pad) > self._max_held:  # a flood of whitespace is not padding
            return self._to_text(out, end)
        if end == n:
            return None
        if self._after_call and self._trailers:
            tag = match_tag(buf, end, n, self._trailers)
            if tag is _PARTIAL:  # an end token cut short: held; at the end of the text, markup too
                return None if self._final else self._hold(buf, end)
            if tag is not None:  # the end token of the calls: markup, swallowed
                self._trailers = ()
                return end + len(tag)
        tag = self._tag(buf, end, self._opens_by_text)
        if tag is _PARTIAL:
            return self._hold(buf, end)
        state = None if tag is not None else self._continues(buf[end])
        if tag is None and state is None:
            return self._to_text(out, end)
        self._block_pad, self._pad = self._pad, ""  # the next block takes the padding of calls
        if tag is not None:
            return self._open(buf, end, self._opens_by_text[tag])
        self._state = state
        return end

    def _to_text(self, out: list[Segment], pos: int) -> int:
        """AFTER: prose follows; the padding goes back in front of it."""
        self._send_pad(out)
        self._state = TEXT
        return pos

    # -- leaving a block ---------------------------------------------------------------------------

    def _close(self, out: list[Segment], pos: int, closer: str = "", implied: bool = False, judged: bool = True) -> int:
        """The block ended (by `closer`, not held, or `implied` by what follows: whitespace at
        its end then pads what comes next): its calls, else its text. TEXT (LIVE: AFTER) at `pos`."""
        text = self._raw.text()
        body = text.rstrip() if implied else text
        text, trailing = body, text[len(body) :]
        self._trailers = ()  # (until the verdict sets them: read only while `_after_call`)
        calls = self._verdict(text) if judged else None
        if calls:
            shown: dict[int, str] = {}  # text inside the block, shown in its place
            for k, start, end in self._texts:  # (whitespace before the next tag pads it)
                shown[k] = shown.get(k, "") + text[start:end].rstrip()
            for k, (name, arguments, model_id) in enumerate(calls):
                self._emit(out, shown.get(k, ""))
                out += (CallBegin(self._call_id(model_id), name), CallArgs(arguments), CallEnd())
            self._emit(out, shown.get(len(calls), ""))
            self._after_call = not shown.get(len(calls))
        else:
            self._emit(out, self._block_pad + text + closer)
            self._after_call = False
        self._state = AFTER if self._LIVE and judged else TEXT
        self._reset_block()
        self._pad = trailing
        return pos

    def _release(self, out: list[Segment], pos: int = 0, rest: str = "") -> int:
        """Not a call: all held, then `rest`, goes out as text; TEXT reads on at `pos`."""
        return self._close(out, pos, rest, judged=False)

    def _call_id(self, model_id: str | None) -> str:
        """The model's id when it is usable and not taken in this scope, else a minted one."""
        scope = self._scope
        if model_id and _MODEL_ID.fullmatch(model_id) and not scope.id_taken(model_id):
            return scope.claim_id(model_id)
        return scope.mint_call_id()

    @staticmethod
    def _emit(out: list[Segment], text: str) -> None:
        if text:
            out.append(Text(text))


# -- JSON call objects (Hermes) ------------------------------------------------------------------

OPEN, JSON = "open", "json"


class JsonCallsLexer(BlockLexer):
    """States: OPEN, whitespace, then `{` or `[`; JSON, the value through strings, escapes and depth
    (`<` outside them looks one closer ahead). Complete: the value closed, only whitespace after."""

    _FIRST = {"open": OPEN}

    @classmethod
    def _grammar(cls, b: JsonCalls) -> dict[str, Any]:
        tags = tuple(tag for tag in (b.close, b.open) if tag)
        return {"_steps": {OPEN: _opener("{[", JSON, mark=False), JSON: _follow("_scanner", tags, cls._value_closed, cls._tag_read)}}

    _scanner: JsonScanner | None = None

    def _reset_body(self) -> None:
        if self._scanner is None:
            self._scanner = JsonScanner(stops="<")
        else:
            self._scanner.reset()  # (one a lexer: see `_raw`)
        self._value_end = -1  # size at which the top-level value closed, -1 while it is open

    def feed(self, text: str) -> list[Segment]:
        scanner = self._scanner
        if self._state == JSON and not scanner.escape and not self._tail and "\\" not in text and self._size + len(text) <= self._max_held:
            # A held block's bulk, taken as JSON's step takes it, without the scanner's loop (a
            # Python step per quote and bracket): text that cannot end its string, or, with no
            # escape and no `<` (the scanner's one stop), text whose quotes only switch strings
            # on and off and whose closers cannot close the value (fewer than it is deep).
            if not scanner.in_string or '"' in text:
                if not scanner.depth or "<" in text:
                    return super().feed(text)
                parts = text.split('"')
                outside = "".join(parts[scanner.in_string :: 2])  # (in a string, the first part is the string's)
                # (`in` before `count`, which CPython 3.11 parses its arguments for on every call:
                # most pieces hold no bracket)
                if "}" in outside or "]" in outside or "{" in outside or "[" in outside:
                    closes = outside.count("}") + outside.count("]")
                    if closes >= scanner.depth:
                        return super().feed(text)
                    scanner.depth += outside.count("{") + outside.count("[") - closes
                if not len(parts) & 1:  # an odd number of quotes
                    scanner.in_string = not scanner.in_string
            self._raw.append(text)
            self._size += len(text)
            self.examined += len(text)
            return []
        return super().feed(text)

    def holds_block(self) -> bool:
        """In a value (JSON) closed by its closer, nothing unread: `held_bulk` may take text (in
        the value `<` is the only way out: the closer, the next opener)."""
        return self._state == JSON and not self._tail and bool(self._body.close)

    def _value_closed(self, out: list[Segment], j: int) -> int:
        if not self._body.close:  # no closer: the block ends with its value
            return self._close(out, j)
        if self._value_end < 0:
            self._value_end = self._size
        return j

    def _tag_read(self, out: list[Segment], j: int, tag: str) -> int:
        """The closer ends the block; so does the next opener (missing closer: module docstring)."""
        if tag == self._body.close:
            return self._close(out, j + len(tag), closer=tag)
        return self._close(out, j, implied=True, judged=self._complete())

    def _complete(self) -> bool:
        return self._value_end >= 0 and not self._raw.text()[self._value_end :].strip()

    def _finish_block(self, out: list[Segment], tail: str) -> None:
        if self._state != JSON or not self._complete():  # OPEN, or a value cut short
            return super()._finish_block(out, tail)
        self._close(out, 0, implied=True)  # the tail goes with the calls, or after the text
        if not self._after_call:
            self._send_pad(out, tail)

    def _verdict(self, text: str) -> Calls | None:
        block = text[len(self._body.open) :]
        key = self._body.name_key
        entries = call_entries(block) if key != "name" else None
        if entries is not None:  # the judge reads `name`: renamed, the arguments as written
            block = compact_json([{"name": e.get(key), "arguments": e.get("parameters", e.get("arguments"))} if isinstance(e, dict) else e for e in entries])
        return self.judge.verdict(block)


# -- held calls with parameters: what XmlParams and KeyValues share ------------------------------


class _ParamsLexer(BlockLexer):
    """Calls of named raw values, typed by the tool's schema (`coerce_value`). `_calls`: (name,
    parameters) per call; a parameter is (name, start, end, trim_close): where its value lies in the
    block's text, and whether the function's closer ended it; each kind reads it (`_value_text`)."""

    def _reset_body(self) -> None:
        self._calls: list[tuple[str, list[tuple[str, int, int, bool]]]] = []
        self._pend_at = 0  # where the closer PEND is confirming began: the value's end if it counts

    def _verdict(self, text: str) -> Calls | None:
        """Names checked first; then the judge reads the typed calls as a JSON list (its notes)."""
        tools = self._scope.tools
        for name, _ in self._calls:
            if name not in tools:
                self._scope.note(UNKNOWN_NAME, f"{excerpt(name)} is not a declared tool")
                return None
        entries = []
        for name, params in self._calls:
            properties = _properties(tools[name]) or {}
            arguments = {key: coerce_value(self._value_text(text, *where), properties.get(key)) for key, *where in params}
            entries.append({"name": name, "arguments": arguments})
        return self.judge.verdict(compact_json(entries)) if entries else None


# -- XML parameters (Qwen3-Coder, MiniMax, Seed-OSS) ---------------------------------------------

WRAP, NAME, BODY, VALUE, IN_WRAP, AFTER_BARE = "wrap", "name", "body", "value", "in_wrap", "after_bare"
PEND, PEND_BARE, PEND_END = "pend", "pend_bare", "pend_end"
FUNC, PARAM, IMPLICIT, WRAPPER = "function", "parameter", "implicit", "wrapper"  # whose name NAME reads; kinds of element


class XmlParamsLexer(_ParamsLexer):
    """States: WRAP, between a wrapper's functions; NAME, a function or parameter name up to `>`;
    BODY, after the name: a parameter tag or the function end; VALUE, raw text; PEND, a parameter's
    closer read (PEND_BARE: in a bare function), PEND_END the function's; IN_WRAP, text in a wrapper
    after a complete function (shown in place; before any function it makes the block text);
    AFTER_BARE: an orphan wrapper end right after a bare function is the block's, anything else pads
    what follows. Complete at the end: WRAP after a function, IN_WRAP, PEND_END, AFTER_BARE.

    Values are not escaped: they may hold the dialect's own tags, so a closer counts only when what
    follows fits: after the parameter end the next parameter, the function end or the wrapper end;
    after the function end the wrapper end, the next function or the next wrapper; a bare function's
    end counts at once. Opening tags beginning a line in a value open literal elements, counted per
    kind, whose closers are literal too; a parameter tag beginning a line outside them ends the
    value (its closer missing) if it names a tool property not yet given (any new name if the tool
    has none). One leading and one trailing newline of a value are markup."""

    _FIRST = {"wrap": WRAP, "bare": NAME}  # `_reset_body` readies NAME for a function's name

    @classmethod
    def _grammar(cls, b: XmlParams) -> dict[str, Any]:
        (wrap_open, wrap_close), (func_open, func_close), (param_open, param_close) = b.wrap, b.function, b.parameter
        param_stop = re.compile(b.parameter_name_stop)
        wrap_tags = (func_open, wrap_close, wrap_open)  # (also what confirms a function end)
        body_tags = (param_open, func_close)  # (also what confirms a bare function's parameter end)
        # In a value: each tag's kind of element, and whether it closes one (closers first).
        value_tags = {param_close: (PARAM, True), func_close: (FUNC, True), wrap_close: (WRAPPER, True),
                      param_open: (PARAM, False), func_open: (FUNC, False), wrap_open: (WRAPPER, False)}
        return {"_WRAP_OPEN": wrap_open, "_WRAP_CLOSE": wrap_close, "_FUNC_OPEN": func_open, "_PARAM_CLOSE": param_close,
                "_name_stop": {FUNC: re.compile(b.function_name_stop), PARAM: param_stop, IMPLICIT: param_stop},
                "_reads_name": {func_open: FUNC, param_open: PARAM}, "_value_tags": value_tags,  # (tags a name follows)
                "_steps": {WRAP: _at_tag(wrap_tags, cls._next_tag), NAME: cls._step_name, BODY: _at_tag(body_tags, cls._next_tag),
                           VALUE: _at_tag(value_tags, cls._value_tag, raw=True), IN_WRAP: _at_tag(wrap_tags, cls._in_wrap_tag, raw=True),
                           PEND: _at_tag(body_tags + (wrap_close,), cls._next_tag), PEND_BARE: _at_tag(body_tags, cls._next_tag),
                           PEND_END: _at_tag(wrap_tags, cls._next_tag), AFTER_BARE: cls._step_after_bare}}

    def _reset_body(self) -> None:
        super()._reset_body()
        self._name_for = FUNC  # whose name NAME reads
        self._judged: Calls | None = None  # a bare function's calls, judged at its end

    @property
    def _wrapped(self) -> bool:  # the block opened with the wrapper, else with a bare function
        return self._section == "wrap"

    def _complete_at_end(self) -> bool:
        if self._state == IN_WRAP:  # text after a complete function, up to the end
            self._texts.append((len(self._calls), self._function_end, self._size))
        elif self._state == PEND_END:  # the end of the text confirms it
            self._end_param(trim_close=True)
        else:  # in WRAP every function is closed
            return self._state == AFTER_BARE or (self._state == WRAP and bool(self._calls))
        return True

    def _parse_name(self, raw: str) -> str | None:
        if self._body.quoted_names:  # `"NAME"`, `'NAME'` or a bare NAME
            raw = raw.strip()
            if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
                raw = raw[1:-1]
        return raw or None

    def _next_tag(self, buf: str, j: int, tag: str | None, out: list[Segment]) -> int | None:
        """WRAP, BODY and the PEND states: the tag that follows a part (None: something else)."""
        pending = self._state in (PEND, PEND_BARE, PEND_END)
        if tag is None and pending:  # the closer and the whitespace after it are part of the value
            self._state = VALUE
            return j
        if tag is None and self._state == WRAP and self._calls:  # text after a complete function: held, shown in place
            self._state = IN_WRAP
            return j
        if tag is None or not (self._calls or tag == self._FUNC_OPEN):
            # `<tool_call>{` (Hermes), `<tool_call>name` (GLM), `use <function=NAME> tags`, Llama's
            # `<function=NAME>{json}`, prose: not ours
            return self._release(out, j)
        if pending:
            self._end_param(trim_close=self._state == PEND_END)
        if tag == self._WRAP_OPEN:  # the end tag is missing: the next block begins, this one is complete
            return self._close(out, j)
        end = self._take_tag(buf, j, tag)
        if tag in self._reads_name:
            return self._read_name(self._reads_name[tag], end)
        if tag == self._WRAP_CLOSE:  # (after the function end: it was missing, or confirmed)
            return self._close(out, end)
        return self._end_function(out, end)  # (after the parameter end too)

    def _in_wrap_tag(self, buf: str, j: int, tag: str, out: list[Segment]) -> int | None:
        self._texts.append((len(self._calls), self._function_end, self._size))
        self._state = WRAP  # WRAP reads the tag
        return j

    def _step_after_bare(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """AFTER_BARE (class docstring; vLLM drops an orphan closer with whatever follows it)."""
        j, tag = self._tag_after_ws(buf, i, limit, (self._WRAP_CLOSE,))
        if tag is _PARTIAL and limit == len(buf):
            return self._hold(buf, j)
        if tag is None or tag is _PARTIAL:  # (past the cap: the look-ahead ends here)
            return self._close(out, j, implied=True)
        return self._close(out, self._take_tag(buf, j, tag))

    def _verdict(self, text: str) -> Calls | None:
        return self._judged or super()._verdict(text)

    def _read_name(self, target: str, pos: int = 0) -> int:
        self._name_for = target
        self._name = ""
        self._state = NAME
        return pos

    def _step_name(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        j, named = self._name_upto(buf, i, limit, self._name_stop[self._name_for])
        if named and j == limit:
            return self._wait(buf, j, limit, out)
        if named and buf[j] == ">":
            return self._named(out, self._take_tag(buf, j, ">"))
        if self._name_for == IMPLICIT:  # not a tag after all: plain text of the value
            self._state = VALUE
            return j
        return self._release(out, j)

    def _named(self, out: list[Segment], pos: int) -> int:
        name = self._parse_name(self._name)
        if name is None and self._name_for != IMPLICIT:
            return self._release(out, pos)
        if self._name_for == FUNC:
            self._calls.append((name, []))
            self._properties = _properties(self._scope.tools.get(name))  # of the current function's tool
            self._seen: set[str] = set()  # parameters the current function has given
            self._state = BODY
        elif self._name_for == PARAM:
            self._begin_param(name)
        elif name is not None and name not in self._seen and (self._properties is None or name in self._properties):
            # (class docstring) the previous value lacked its closer: vLLM tolerates this.
            self._end_param(trim_close=False)
            self._begin_param(name)
        else:
            if name is not None:  # a literal element inside the value: its close is literal too
                self._literals[PARAM] += 1
            self._state = VALUE
        return pos

    def _begin_param(self, name: str) -> None:
        self._param_name = name
        self._seen.add(name)
        self._value_at = self._size
        # Per kind, so a stray literal parameter tag cannot hide the real function end (as in vLLM).
        self._literals = dict.fromkeys((PARAM, FUNC, WRAPPER), 0)
        self._state = VALUE

    def _end_param(self, trim_close: bool) -> None:
        self._calls[-1][1].append((self._param_name, self._value_at, self._pend_at, trim_close))

    def _value_text(self, text: str, start: int, end: int, trim_close: bool) -> str:
        if trim_close:  # its parameter closer, before the function's, is markup
            body = text[start:end].rstrip()
            if body.endswith(self._PARAM_CLOSE):
                end = start + len(body) - len(self._PARAM_CLOSE)
        return text[start:end].removeprefix("\n").removesuffix("\n")

    def _end_function(self, out: list[Segment], pos: int) -> int:
        if self._wrapped:
            self._function_end = self._size  # where the last function's closer ended
            self._state = WRAP
            return pos
        # A bare function is the whole block (an orphan closer aside): text goes now, calls wait.
        self._judged = super()._verdict(self._raw.text())
        self._state = AFTER_BARE
        return pos if self._judged else self._release(out, pos)

    def _value_tag(self, buf: str, j: int, tag: str, out: list[Segment]) -> int | None:
        """VALUE: raw text; only the dialect's tags matter, and only some of them count."""
        line_start = self._size == self._value_at or self._last == "\n"
        at = self._size  # where the tag begins in the block
        i = self._take_tag(buf, j, tag)
        kind, closes = self._value_tags[tag]
        if closes and self._literals[kind]:  # closes a literal element of the value
            self._literals[kind] -= 1
        elif closes and kind != WRAPPER:  # the parameter end or the function end
            self._pend_at = at
            if not self._wrapped and kind == FUNC:  # bare: nothing follows to confirm it
                self._end_param(trim_close=True)
                return self._end_function(out, i)
            self._state = PEND_END if kind == FUNC else PEND if self._wrapped else PEND_BARE
        elif not closes and line_start:  # only line starts nest: tags inside a line are prose about tags
            if kind != PARAM or any(self._literals.values()):
                self._literals[kind] += 1
            else:  # maybe the missing parameter end: decided once its name is read
                self._pend_at = at
                return self._read_name(IMPLICIT, i)
        return i


# -- key / value pairs (GLM) ---------------------------------------------------------------------

KV_NAME, AFTER_NAME, KEY, KV, KV_VALUE, KV_PEND = "kv_name", "after_name", "key", "kv", "kv_value", "kv_pend"
_LT = re.compile("<")


class KeyValuesLexer(_ParamsLexer):
    """States: NAME, whitespace then name characters (none: not this dialect); AFTER_NAME, the
    first key tag or the closer (a `{}` call); KEY, up to the key end (any other `<`: text); KV, the
    value tag; VALUE, as written (no newline comes off) to the value end; PEND: that counts if the
    next key, the closer or the next opener follows, else it is value. Complete at the end: PEND."""

    _FIRST = {"open": KV_NAME}

    @classmethod
    def _grammar(cls, b: KeyValues) -> dict[str, Any]:
        return {"_name_stop": re.compile(b.name_stop), "_gap": re.compile(rf"(?:\s|{re.escape(b.escaped)})*" if b.escaped else r"\s*"),
                "_steps": {KV_NAME: cls._step_name, AFTER_NAME: _at_tag((b.key[0], b.close), cls._pend_tag), KEY: cls._step_key,
                           KV: _at_tag((b.value[0],), cls._value_open), KV_VALUE: _at_tag((b.value[1],), cls._value_end, raw=True),
                           KV_PEND: _at_tag((b.key[0], b.close, b.open), cls._pend_tag)}}

    def _reset_body(self) -> None:
        super()._reset_body()
        self._escaped = False  # an escaped separator was read: the values are escaped too
        self._pend_escaped = False  # `_escaped` when the value end PEND confirms was read

    def _tag_after_ws(self, buf: str, i: int, limit: int, tags: tuple[str, ...]) -> tuple[int, Any]:
        """BLOCK steps skip `escaped` separators as whitespace (`_PARTIAL` also: one cut short)."""
        sep = self._body.escaped
        j = self._gap.match(buf, i, limit).end()
        self._take(buf, i, j)
        if sep and sep in buf[i:j]:
            self._escaped = True
        return j, match_tag(buf, j, limit, tags + (sep,) if sep else tags)

    def _complete_at_end(self) -> bool:
        if self._state == KV_PEND:  # every value closed; only the closer is missing
            self._end_pair()
            return True
        return False

    def _step_name(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        if not self._name:  # whitespace before the name
            i = self._take_tag(buf, i, _WS.match(buf, i, limit).group())
        j, named = self._name_upto(buf, i, limit, self._name_stop)
        if named and j == limit:
            return self._wait(buf, j, limit, out)
        if not named or not self._name:  # `{` (Hermes), `<function=` (Qwen), prose, a run too long: not this dialect
            return self._release(out, j)
        self._calls = [(self._name, [])]
        self._name = ""  # the keys are read into it next
        self._state = AFTER_NAME
        return j

    def _step_key(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        j, named = self._name_upto(buf, i, limit, _LT)
        tag = match_tag(buf, j, limit, (self._body.key[1],)) if named else None
        if tag is _PARTIAL:
            return self._wait(buf, j, limit, out)
        self._name = self._name.strip()
        if tag is None or not self._name:
            return self._release(out, j)
        self._state = KV
        return self._take_tag(buf, j, tag)

    def _value_open(self, buf: str, j: int, tag: str | None, out: list[Segment]) -> int | None:
        if tag is None:
            return self._release(out, j)
        self._value_at = self._size + len(tag)
        self._state = KV_VALUE
        return self._take_tag(buf, j, tag)

    def _value_end(self, buf: str, j: int, tag: str, out: list[Segment]) -> int | None:
        self._pend_at = self._size
        self._pend_escaped = self._escaped
        self._state = KV_PEND
        return self._take_tag(buf, j, tag)

    def _pend_tag(self, buf: str, j: int, tag: str | None, out: list[Segment]) -> int | None:
        """AFTER_NAME and PEND: a key tag or the closer (PEND: also the next opener) follows."""
        if tag is None and self._state == AFTER_NAME:  # `<tool_call> tags, like...`: prose, shown at once
            return self._release(out, j)
        if tag is None:  # part of the value, like the whitespace after it
            self._escaped = self._pend_escaped  # (and a separator read there was none)
            self._state = KV_VALUE
            return j
        if self._state == KV_PEND:
            self._end_pair()
        if tag == self._body.open:  # the closer is missing: the next block begins
            return self._close(out, j)
        pos = self._take_tag(buf, j, tag)
        if tag == self._body.close:
            return self._close(out, pos)
        self._state = KEY
        return pos

    def _end_pair(self) -> None:
        self._calls[0][1].append((self._name, self._value_at, self._pend_at, False))
        self._name = ""

    def _value_text(self, text: str, start: int, end: int, trim_close: bool) -> str:
        if self._escaped:  # read as the text of a JSON string, else as written
            try:
                return json.loads(f'"{text[start:end]}"', strict=False)
            except ValueError:
                pass
        return text[start:end]


# -- calls named in front of their arguments (Mistral) ---------------------------------------------

CALLS, LIST_OPEN, LIST, CALL_NAME, CALL_ID, ARGS_OPEN, ARGS = "calls", "list_open", "list", "call_name", "call_id", "args_open", "args"
_NAME_CHAR = re.compile(r"[A-Za-z0-9_.\-]")
_NAME_RUN = re.compile(r"[A-Za-z0-9_.\-]*")
_ID_RUN = re.compile(r"[A-Za-z0-9_\-]*")


class NamedCallsLexer(BlockLexer):
    """States: CALLS, the pad after `open`, then `[` (LIST_OPEN: whitespace, `{`: LIST) or a name
    (CALL_NAME) ended by `{` (ARGS; `args` stripped upstream), `args` (ARGS_OPEN: whitespace, `{`)
    or `call_id` (CALL_ID: the id, then `args`). `open` outside strings cuts a value short."""

    _LIVE = True
    _FIRST = {"open": CALLS}

    @classmethod
    def _grammar(cls, b: NamedCalls) -> dict[str, Any]:
        inner = (b.args, b.call_id, b.open)
        value = _follow("_scanner", (b.open,), cls._close)
        return {"_steps": {
            CALLS: _held(cls._after_open, re.compile(b.pad), tags=(b.open,)),
            LIST_OPEN: _opener("{", LIST, mark=False),  # the list began at its `[`
            CALL_NAME: _held(cls._after_name, _NAME_RUN, "_name", MAX_CALL_NAME, inner),
            CALL_ID: _held(cls._inner_tag, _ID_RUN, "_model_id", MAX_ID, inner),
            ARGS_OPEN: _opener("{", ARGS),
            LIST: value,
            ARGS: value,
        }}

    def _reset_body(self) -> None:
        self._model_id = ""
        self._scanner = JsonScanner(stops="[")  # a `[` may begin `open`

    def _continues(self, c: str) -> str | None:
        return CALL_NAME if _NAME_CHAR.match(c) else None  # v13+: the next name right after a call

    def _after_open(self, buf: str, end: int, tag: str | None, out: list[Segment]) -> int | None:
        """CALLS, after the pad: `[` begins a list, a name character a call."""
        if buf[end] == "[" and tag is None:
            self._value_at = self._size
            self._take(buf, end, end + 1)
            self._scanner.take("[")
            self._state = LIST_OPEN
            self._over_cap(out)
            return end + 1
        if not _NAME_CHAR.match(buf, end):  # `open` twice (TEXT reads the second), the token quoted in prose
            return self._release(out, end)
        self._state = CALL_NAME
        return end

    def _after_name(self, buf: str, end: int, tag: str | None, out: list[Segment]) -> int | None:
        """CALL_NAME, after the name: `{`, `args` or `call_id`."""
        if buf[end] == "{":
            self._value_at = self._size
            self._state = ARGS
            return end
        return self._inner_tag(buf, end, tag, out)

    def _inner_tag(self, buf: str, i: int, tag: str | None, out: list[Segment]) -> int | None:
        """CALL_NAME: `args` or `call_id`; CALL_ID: `args`; else no call (TEXT rereads `open`)."""
        b: NamedCalls = self._body  # type: ignore[assignment]
        if tag is None or tag == b.open or (tag == b.call_id and self._state == CALL_ID):
            return self._release(out, i)
        end = self._take_tag(buf, i, tag)
        if not self._over_cap(out):
            self._state = ARGS_OPEN if tag == b.args else CALL_ID
        return end

    def _verdict(self, text: str) -> Calls | None:
        value = text[self._value_at :]
        if self._state == LIST:
            return judge_entries(self.judge, value)
        return judge_call(self.judge, self._name, value, self._model_id)


# -- Llama's three spellings ---------------------------------------------------------------------

START, FUNC_NAME, FUNC_OPEN, FUNC_ARGS, FUNC_END = "start", "func_name", "func_open", "func_args", "func_end"
PY_OPEN, PY_LIST, TAG_OPEN, TAG_JSON = "py_open", "py_list", "tag_open", "tag_json"


class LlamaCallsLexer(BlockLexer):
    """States: FUNC_NAME, up to `>` (or `">`); FUNC_OPEN, whitespace, then `{` (FUNC_ARGS) or
    `function_end` (a `{}` call); FUNC_END, whitespace, then `function_end` or the next function
    opener; PY_OPEN then PY_LIST; TAG_OPEN then TAG_JSON; START (`bare_json`), Llama 3.x's untagged
    call objects, only at the text's very start as in vLLM. Complete at the end: FUNC_END."""

    _LIVE = True
    _FIRST = {FUNCTION: FUNC_NAME, NAMED: FUNC_NAME, PYTHON: PY_OPEN, TAGGED: TAG_OPEN}

    def __init__(self, scope: CallScope, *, max_held: int = 1 << 20, bare_json: bool = False) -> None:
        self._initial = START if bare_json else TEXT
        super().__init__(scope, max_held=max_held)

    @classmethod
    def _grammar(cls, b: LlamaCalls) -> dict[str, Any]:
        func_cut = (b.function_end, b.function[0])
        return {"_tagged_gap": re.compile(rf"[\s{re.escape(b.separator)}]*"), "_steps": {
            START: cls._step_start,
            FUNC_NAME: _held(cls._after_name, _NAME_RUN, "_name", MAX_CALL_NAME),
            FUNC_OPEN: _held(cls._after_name_tag, tags=(b.function_end,)),
            FUNC_ARGS: _follow("_json", func_cut, cls._value_closed),
            FUNC_END: _held(cls._after_args, tags=func_cut),
            PY_OPEN: _opener("[", PY_LIST),
            PY_LIST: _follow("_python", (b.python[1], b.python[0], b.tagged), cls._close),
            TAG_OPEN: _opener("{", TAG_JSON),
            TAG_JSON: _follow("_json", (b.tagged,) + b.tagged_ends, cls._close),
        }}

    def _reset_body(self) -> None:
        self._value_end = -1  # FUNC_END: where it ended
        self._json = JsonScanner(stops="<")
        self._python = PythonScanner(stops="<")

    def _continues(self, c: str) -> str | None:
        # Llama 3.x's template writes `; `; vLLM PR #49923 skips any run of `; \t\n` (LlamaCalls).
        return TAG_JSON if self._section == TAGGED and c == "{" and self._after_call else None

    def _gap_after(self) -> re.Pattern[str]:
        return self._tagged_gap if self._section == TAGGED else _WS

    def _complete_at_end(self) -> bool:
        return self._state == FUNC_END

    def _step_start(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """START: whitespace alone decides nothing; a `{` first is a tagged call without its tag."""
        end = _WS.match(buf, i).end()
        if end == len(buf) and not self._final:
            return self._hold(buf, i)
        self._state = TEXT
        if end == len(buf) or buf[end] != "{":  # the text ended, or began otherwise: TEXT reads it
            return i
        self._section = TAGGED
        self._state = TAG_OPEN
        self._take(buf, i, end)
        return end

    def _after_name(self, buf: str, end: int, tag: None, out: list[Segment]) -> int | None:
        """FUNC_NAME, after the name: `>` (`">`); anything else (a code sample) is text."""
        close = '">' if self._section == NAMED else ">"
        if self._name and buf.startswith(close, end):
            self._state = FUNC_OPEN
            return self._take_tag(buf, end, close)
        if self._name and not self._final and close.startswith(buf[end:]):  # `"` at the end: the `>` may follow
            return self._hold(buf, end)
        return self._release(out, end)

    def _after_name_tag(self, buf: str, end: int, tag: str | None, out: list[Segment]) -> int | None:
        """FUNC_OPEN, after whitespace: the arguments object or the end tag."""
        if buf[end] == "{":
            self._state = FUNC_ARGS
            self._value_at = self._size
            return end
        if tag is None:
            return self._release(out, end)
        return self._close(out, self._take_tag(buf, end, tag))

    def _value_closed(self, out: list[Segment], j: int) -> int:
        self._state = FUNC_END
        self._value_end = self._size
        return j

    def _after_args(self, buf: str, end: int, tag: str | None, out: list[Segment]) -> int | None:
        """FUNC_END, after whitespace: the end tag (or the next tag: the end tag is missing)."""
        b: LlamaCalls = self._body  # type: ignore[assignment]
        if tag == b.function_end:
            return self._close(out, self._take_tag(buf, end, tag))
        if tag == b.function[0]:  # AFTER reads the next tag
            return self._close(out, end, implied=True)
        if b.function_end.startswith(buf[end:]):  # (`_final`) a half-written end tag at the end
            return self._close(out, self._take_tag(buf, end, buf[end:]))
        return self._release(out, end)  # a value followed by prose is not a call

    def _verdict(self, text: str) -> Calls | None:
        state, value = self._state, text[self._value_at :]
        if state in (FUNC_OPEN, FUNC_END):
            return judge_call(self.judge, self._name, "{}" if state == FUNC_OPEN else text[self._value_at : self._value_end])
        if state == TAG_JSON:
            self._trailers = self._body.tagged_ends
            return judge_entries(self.judge, value)
        self._trailers = (self._body.python[1],)
        try:
            entries = pythonic_entries(value)
        except NotACall as exc:
            self._scope.note(INVALID_JSON, f"pythonic call list: {exc}")
            return None
        return judge_entries(self.judge, compact_json(entries))


_PY_STOP = re.compile(r"""[\[\](){}'"<]""")
_IN_STRING = {"'": re.compile(r"['\\]"), '"': re.compile(r'["\\]')}  # by the open string's quote


class PythonScanner(JsonScanner):
    """`JsonScanner`'s contract for a Python list: strings (`'`, `"`, triple-quoted), escapes and
    brackets; a `<` outside strings is a STOP. WAIT: a quote at the end of the text may still
    begin (or end) a triple quote. (Quotes are read here: `take` gets brackets and `<` only.)"""

    _OPENERS, _CLOSERS = "([{", ")]}"

    def reset(self) -> None:
        super().reset()
        self.quote = ""  # the open string's quote, "" outside strings

    def scan(self, buf: str, pos: int, limit: int, final: bool = False) -> tuple[int, str]:
        i = pos
        while i < limit:
            if self.escape:  # the escaped character, whatever it is
                self.escape = False
                i += 1
                continue
            stop = (_IN_STRING[self.quote[0]] if self.quote else _PY_STOP).search(buf, i, limit)
            if stop is None:
                return limit, MORE
            j = stop.start()
            c = buf[j]
            i = j + 1
            if c == "\\":  # found inside strings only
                self.escape = True
            elif c in "'\"":  # inside a string, only its own quote is found
                if self.quote and (len(self.quote) == 1 or buf.startswith(self.quote, j)):
                    i = j + len(self.quote)
                    self.quote = ""
                elif not final and len(buf) - j < 3 and (c * 3).startswith(buf[j:]):
                    return j, WAIT
                elif not self.quote:  # (else a lone quote inside a triple-quoted string)
                    self.quote = c * 3 if buf.startswith(c * 3, j) else c
                    i = j + len(self.quote)
            elif c == "<":
                return j, STOP
            elif self.take(c):
                return i, CLOSED
        return i, MORE  # `i` may pass `limit` by the rest of a triple quote
