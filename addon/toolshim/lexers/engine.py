"""The dialect engine: one incremental lexer that reads any dialect described by a `Spec`.

A spec names its dialect and the kind of its body, with the dialect's strings: `JsonCalls`,
`XmlParams`, `KeyValues`, `NamedCalls`, `LlamaCalls` (the body gives the markers that open a
block in text); `lexer(spec, scope)` makes the lexer of one channel. What every body shares is
here once (the special-token dialects, machines of their own, share tokens.py's):

* Text outside blocks streams live; only a possible beginning of an opening marker is held.
* A block is held as written until it closes, then judged (declared names, strict schemas,
  `scope.admit_all`): calls, or the block shown as text exactly as written, all or nothing. A
  block that turns out not to be this dialect's (`<tool_call>` then something else) is
  released at once.
* Padding, one of two ways (the body kind's `_LIVE`). BLOCK: whitespace right before an opening
  marker that is still unsent when the marker is read (in the same piece, or held after a call
  or before a possible marker) belongs to the block; whitespace sent earlier stays sent. LIVE:
  whitespace before a marker streams as text; after a block, AFTER reads what follows: a next
  block may begin without a marker (`_continues`), an end token after calls is swallowed
  (`_trailers`), separators count as whitespace. Both: after calls whitespace is held (prose
  that follows gets it back, a next block takes it as padding, the end of the text drops it); a
  block that becomes calls drops its padding, one that stays text shows it.
* The cap: `max_held` counts every character of a block, markers included; the block is
  released at the same character however the text was split.
* Guarded closers: a body may read a closer and wait for what follows it (PEND) before it
  counts; the look-ahead is at most one tag.
* Without declared tools nothing can be a call: everything passes through at once.

Each body kind is a subclass of `BlockLexer` with one step per state: a step reads `buf` from a
position up to `limit` and returns where reading goes on, or None: it waits for more text.
Every character of a block is read once, plus a bounded look-ahead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..calls import INVALID_JSON, SCHEMA_MISMATCH, STRICT_FAILURE, UNKNOWN_NAME, CallScope
from ..judge import Calls, NotACall, ToolCallJudge, call_entries, judge_call, judge_entries, pythonic_entries
from ..schema import _properties, coerce_value, compact_json
from .base import CLOSED, MORE, STOP, WAIT, CallArgs, CallBegin, CallEnd, JsonScanner, Marker, Reporting, Segment, Text, TextPieces, excerpt, find_marker

TEXT, AFTER = "text", "after"
MAX_NAME = 256  # a function, parameter or key name longer than this is not a name
MAX_CALL_NAME = MAX_ID = 64  # OpenAI's limit: a longer run of name characters is prose, not a name
_MODEL_ID = re.compile(r"[A-Za-z0-9_\-]{1,64}")  # a model's own call id we pass on (Mistral's: 9 alphanumerics)
_WS = re.compile(r"\s*")
_PARTIAL = object()  # what `match_tag` returns when more text is needed to tell
FUNCTION, NAMED, PYTHON, TAGGED = "function", "named", "python", "tagged"  # Llama's openers


def match_tag(buf: str, j: int, limit: int, tags: tuple[str, ...]) -> Any:
    """The tag of `tags` at `buf[j]` (before `limit`), `_PARTIAL`, or None."""
    for tag in tags:
        if buf.startswith(tag, j, limit):
            return tag
    available = limit - j
    for tag in tags:
        if available < len(tag) and buf.startswith(tag[:available], j, limit):
            return _PARTIAL
    return None


# -- specs -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JsonCalls:
    """A JSON call object `{"name", "arguments"}` or a list of them, between `open` and `close`.
    `close=""`: no closer, the block ends with its value (Granite 3); `name_key`: the key that
    names the tool (Command's `tool_name`; its arguments are `parameters`, which the judge reads)."""

    open: str
    close: str
    name_key: str = "name"

    def markers(self) -> tuple[Marker, ...]:
        return (Marker(self.open, "open"),)


@dataclass(frozen=True, slots=True)
class XmlParams:
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


@dataclass(frozen=True, slots=True)
class KeyValues:
    """A name right after the opening tag, then key / value pairs up to the closer. `escaped`: a
    separator that may arrive escaped (GLM-4.6's literal backslash-n): taken as whitespace, and a
    block that has one had its values escaped too, so they are unescaped (JSON string escapes)."""

    open: str
    close: str
    key: tuple[str, str]
    value: tuple[str, str]
    name_chars: str = r"[\w.:/-]"
    escaped: str = ""

    def markers(self) -> tuple[Marker, ...]:
        return (Marker(self.open, "open"),)


@dataclass(frozen=True, slots=True)
class NamedCalls:
    """After `open`: a JSON list of call objects, or calls written `NAME`, optionally `call_id` and
    the model's id, optionally `args`, then the arguments object, back to back. No closer: a call
    ends with its value. LIVE padding; a name right after a call is the next call."""

    open: str
    args: str
    call_id: str
    pad: str = r"[\s\u2581]*"  # held after `open` (`▁`: SentencePiece's space)

    def markers(self) -> tuple[Marker, ...]:
        return (Marker(self.open, "open"),)


@dataclass(frozen=True, slots=True)
class LlamaCalls:
    """Three spellings, each with its own opener: a `function` tag around a JSON object (the
    second opener ends its name at `">`), a Python list of calls after `python[0]` (literals
    only, never evaluated), call objects after `tagged` separated by `separator`, whitespace or nothing. LIVE padding;
    after calls, `python[1]` or one of `tagged_ends` is swallowed."""

    function: tuple[str, str]
    function_end: str
    python: tuple[str, str]
    tagged: str
    tagged_ends: tuple[str, ...]
    separator: str

    def markers(self) -> tuple[Marker, ...]:
        return (Marker(self.function[0], FUNCTION), Marker(self.function[1], NAMED), Marker(self.python[0], PYTHON), Marker(self.tagged, TAGGED))


Body = JsonCalls | XmlParams | KeyValues | NamedCalls | LlamaCalls


@dataclass(frozen=True, slots=True)
class Spec:
    """A dialect the engine reads: its name (for notes and counters) and its body."""

    name: str
    body: Body
    opens: tuple[Marker, ...] = field(init=False)  # what opens a block in text

    def __post_init__(self) -> None:
        object.__setattr__(self, "opens", self.body.markers())

    @property
    def starts(self) -> tuple[str, ...]:
        """The markers that may begin this dialect's markup."""
        return tuple(m.text for m in self.opens)


def lexer(spec: Spec, scope: CallScope, *, max_held: int = 1 << 20, **options: Any) -> BlockLexer:
    """The lexer of one channel for `spec` (`options`: the body kind's own)."""
    kind = {JsonCalls: JsonCallsLexer, XmlParams: XmlParamsLexer, KeyValues: KeyValuesLexer, NamedCalls: NamedCallsLexer, LlamaCalls: LlamaCallsLexer}[type(spec.body)]
    return kind(spec, scope, max_held=max_held, **options)


# -- the engine --------------------------------------------------------------------------------

Step = Callable[[str, int, int, list[Segment]], "int | None"]


class BlockLexer(Reporting):
    """Text, padding, holding a block, the cap and the verdict: everything but the body's grammar."""

    _STRIP_NEWLINES = True
    _LIVE = False  # LIVE padding (see the module docstring); else BLOCK

    def __init__(self, spec: Spec, scope: CallScope, *, max_held: int = 1 << 20) -> None:
        self.spec = spec
        self._body = spec.body
        self._opens = spec.opens
        self._scope = scope
        self.judge = ToolCallJudge(scope)  # its validator cache and INVALID_SCHEMA notes
        self._max_held = max_held
        # Without declared tools no block can be a call: nothing is held, nothing is scanned.
        self._pass_through = not scope.tools
        self.examined = 0  # characters of JSON bodies examined by the scanner, over the lexer's life
        self._steps: dict[str, Step] = {AFTER: self._step_after, **self._step_table()}
        self._reset()
        if self._state != TEXT:
            self._report(False)

    def _step_table(self) -> dict[str, Step]:
        raise NotImplementedError

    def _begin(self, kind: str) -> None:
        """An opening marker of `kind` was read: the body's first state."""
        raise NotImplementedError

    def _reset_body(self) -> None:
        raise NotImplementedError

    def _verdict(self, text: str) -> Calls | None:
        """(name, arguments, the model's id or None) of the calls of the block `text`, admitted;
        None: it is text."""
        raise NotImplementedError

    def _finish_block(self, out: list[Segment], tail: str) -> None:
        """The text ended inside a block (`tail`: unread, a possible tag cut short)."""
        if not self._LIVE:
            self._release(out, tail)
            return
        self._run(tail, out, final=True)  # LIVE steps read `_final`: none keeps a tail
        if self._state not in (TEXT, AFTER):
            self._end_block(out)

    def _end_block(self, out: list[Segment]) -> None:
        """LIVE: the text ended inside a block; by default it is incomplete, so it is text."""
        self._release(out)

    def _continues(self, c: str) -> str | None:
        """AFTER: the state `c` begins when it continues the calls without a marker (None: not)."""
        return None

    def _separators(self) -> str:
        """AFTER: the characters held with whitespace between the calls of the last block."""
        return ""

    def _reset(self) -> None:
        self._state = TEXT
        self._tail = ""  # unread text: a possible beginning of a marker or tag
        self._pad = ""  # whitespace held in TEXT or AFTER (padding, see the module docstring)
        self._after_call = False  # the last thing out was a call: whitespace is held
        self._trailers: tuple[str, ...] = ()  # end tokens swallowed after the last calls
        self._section = ""  # the kind of marker that opened the last block
        self._final = False  # the text has ended (`finish`)
        self._reset_block()

    def _reset_block(self) -> None:
        self._block_pad = ""  # the padding in front of the current block's marker
        self._raw = TextPieces()  # the block as written, marker included
        self._size = 0  # its length: offsets into the block are counted in it
        self._last = ""  # its last character (does a tag open a line?)
        self._reset_body()

    def feed(self, text: str) -> list[Segment]:
        if self._pass_through:
            return [Text(text)] if text else []
        out: list[Segment] = []
        buf, self._tail = self._tail + text, ""
        self._run(buf, out, final=False)
        idle = self._state == TEXT and not self._tail and not self._pad and not self._after_call
        if idle != self.idle:  # reported on change only: the hot path pays one comparison
            self._report(idle)
        return out

    def finish(self) -> list[Segment]:
        out: list[Segment] = []
        tail, self._tail = self._tail, ""
        if self._state == TEXT:
            self._run(tail, out, final=True)
        else:
            self._finish_block(out, tail)
        if not self._after_call:
            self._emit(out, self._pad)
        self._reset()
        idle = self._state == TEXT
        if idle != self.idle:
            self._report(idle)
        return out

    # -- text --------------------------------------------------------------------------------------

    def _run(self, buf: str, out: list[Segment], final: bool) -> None:
        self._final = final
        pos: int | None = 0
        while pos is not None:
            if self._state == TEXT:
                pos = self._scan_text(buf, pos, out, final)
                continue
            # Never read past the cap: the block is released at the same character of the
            # block however the text was split. `pos - size` is where the block began.
            limit = min(len(buf), max(pos, pos + self._max_held - self._size))
            while self._state != TEXT and pos is not None:
                pos = self._steps[self._state](buf, pos, limit, out)

    def _scan_text(self, buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
        """TEXT: pass text on; stop at an opening marker, or hold what may still become one."""
        match = find_marker(buf, pos, self._opens, final)
        if match is None:
            self._take_text(buf[pos:], out, before_tag=False)
            return None
        self._take_text(buf[pos : match.pos], out, before_tag=True)
        if match.marker is None:
            self._tail = buf[match.pos :]
            return None
        self._block_pad, self._pad = self._pad, ""
        return self._open(buf, match.pos, match.marker)

    def _open(self, buf: str, at: int, marker: Marker) -> int:
        end = at + len(marker.text)
        self._section = marker.kind
        self._take(buf, at, end)
        self._begin(marker.kind)
        return end

    def _take_text(self, text: str, out: list[Segment], before_tag: bool) -> None:
        """Text outside blocks; `before_tag`: a marker (or a possible one) follows it."""
        if before_tag and not self._LIVE:
            body = text.rstrip()
        else:
            body = "" if self._after_call and text.isspace() else text
        if body:
            self._emit(out, self._pad + body)
            self._pad = ""
            self._after_call = False
        self._pad += text[len(body) :]
        if len(self._pad) > self._max_held:  # a flood of whitespace is not padding
            self._emit(out, self._pad)
            self._pad = ""
            self._after_call = False

    # -- holding -----------------------------------------------------------------------------------

    def _take(self, buf: str, start: int, end: int) -> None:
        """`buf[start:end]` becomes part of the held block."""
        if end > start:
            self._raw.append(buf[start:end])
            self._size += end - start
            self._last = buf[end - 1]

    def _skip_ws(self, buf: str, i: int, limit: int) -> int:
        j = _WS.match(buf, i, limit).end()
        self._take(buf, i, j)
        return j

    def _wait(self, buf: str, j: int, limit: int, out: list[Segment]) -> int | None:
        """More text is needed from `j` on; past the cap there is none to wait for."""
        if limit < len(buf):  # what would decide lies beyond `max_held`: the block is text
            self._release(out, buf[j:limit])
            return limit
        self._tail = buf[j:]
        return None

    # LIVE steps check the cap themselves: they read one character past it, then release.

    def _room(self, pos: int, n: int) -> int:
        return min(n, pos + max(0, self._max_held - self._size) + 1)

    def _over_cap(self, out: list[Segment]) -> bool:
        if self._size > self._max_held:
            self._release(out)
            return True
        return False

    def _opener(self, first: str, state: str, mark: bool = True) -> Step:
        """A LIVE step: whitespace, then `first` begins the value (`state`; `mark`: it begins
        here, `_value_at`); anything else is not a call (`[TOOL_CALLS] [see below]`, a
        `<|python_tag|>` before code for Llama's own interpreter)."""

        def step(buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
            end = _WS.match(buf, i, self._room(i, len(buf))).end()
            self._take(buf, i, end)
            if self._over_cap(out):
                return end
            if end == len(buf):
                return None
            if buf[end] != first:
                return self._reject(out, end)
            if mark:
                self._value_at = self._size
            self._state = state
            return end

        return step

    def _tag(self, buf: str, j: int, tags: tuple[str, ...]) -> Any:
        """`match_tag` to the end of `buf`; once the text has ended, a tag cut short is none."""
        tag = match_tag(buf, j, len(buf), tags)
        return None if tag is _PARTIAL and self._final else tag

    def _follow(self, buf: str, pos: int, out: list[Segment], scanner: Any, cut_by: tuple[str, ...], closed: Callable[[list[Segment], int], int]) -> int | None:
        """Follow a value with `scanner` from where the last piece stopped; `closed(out, end)` when
        it closes. A tag of `cut_by` outside its strings cuts it short: released (TEXT reads it)."""
        limit = self._room(pos, len(buf))
        i = pos
        while True:
            j, what = scanner.scan(buf, i, limit, self._final)
            self._take(buf, pos, j)
            if what is CLOSED:
                return closed(out, j)
            if what is MORE:
                return j if self._over_cap(out) else None
            if what is WAIT:  # the scanner needs more text to read `buf[j:]`
                self._tail = buf[j:]
                return None
            tag = self._tag(buf, j, cut_by)  # STOP: `buf[j]` may begin a tag
            if tag is _PARTIAL:
                self._tail = buf[j:]
                return None
            if tag is not None:
                self._release(out)
                return j
            scanner.take(buf[j])
            self._take(buf, j, j + 1)
            pos = i = j + 1

    # -- after a block (LIVE) ----------------------------------------------------------------------

    def _step_after(self, buf: str, pos: int, limit: int, out: list[Segment]) -> int | None:
        """AFTER: whitespace (and separators) after a block; what follows says whose it is."""
        n = len(buf)
        seps = self._separators()
        end = pos
        while end < n and (buf[end].isspace() or buf[end] in seps):
            end += 1
        self._pad += buf[pos:end]
        if not self._after_call and self._pad:  # after text it is text, whatever follows
            self._emit(out, self._pad)
            self._pad = ""
        if len(self._pad) > self._max_held:  # a flood of whitespace is not padding
            return self._to_text(out, end)
        if end == n:
            return None
        if self._after_call and self._trailers:
            tag = match_tag(buf, end, n, self._trailers)
            if tag is _PARTIAL:  # an end token cut short at the end is markup too
                if self._final:
                    self._trailers = ()
                else:
                    self._tail = buf[end:]
                return None
            if tag is not None:  # the end token of the calls: markup, swallowed
                self._trailers = ()
                return end + len(tag)
        marker = self._marker_at(buf, end)
        if marker is _PARTIAL:
            self._tail = buf[end:]
            return None
        state = None if marker is not None else self._continues(buf[end])
        if marker is None and state is None:
            return self._to_text(out, end)
        if self._after_call:  # the next block takes the padding; after text it was sent
            self._block_pad = self._pad
        else:
            self._emit(out, self._pad)
        self._pad = ""
        self._trailers = ()
        if marker is not None:
            return self._open(buf, end, marker)
        self._state = state
        return end

    def _marker_at(self, buf: str, j: int) -> Any:
        """The opening marker at `buf[j]`, `_PARTIAL` (the text may still make one), or None."""
        partial = False
        for marker in self._opens:
            if buf.startswith(marker.text, j):
                return marker
            if len(buf) - j < len(marker.text) and marker.text.startswith(buf[j:]):
                partial = True
        return _PARTIAL if partial and not self._final else None

    def _to_text(self, out: list[Segment], pos: int) -> int:
        """AFTER: prose follows; the padding goes back in front of it."""
        self._emit(out, self._pad)
        self._pad = ""
        self._after_call = False
        self._trailers = ()
        self._state = TEXT
        return pos

    # -- leaving a block ---------------------------------------------------------------------------

    def _close(self, out: list[Segment], pos: int, closing: str = "", implied: bool = False) -> int:
        """The block ended (by `closing`, not held, or `implied` by what follows: whitespace at
        its end then pads what comes next): its calls, else its text. TEXT at `pos`."""
        text = self._raw.text()
        trailing = ""
        if implied:
            body = text.rstrip()
            text, trailing = body, text[len(body) :]
        calls = self._verdict(text)
        if calls:
            shown = self._between(text)  # text inside the block, shown in its place
            for k, (name, arguments, model_id) in enumerate(calls):
                self._emit(out, shown.get(k, ""))
                out.append(CallBegin(self._call_id(model_id), name))
                out.append(CallArgs(arguments))
                out.append(CallEnd())
            self._emit(out, shown.get(len(calls), ""))
            self._after_call = not shown.get(len(calls))
        else:
            self._emit(out, self._block_pad + text + closing)
            self._after_call = False
            self._trailers = ()
        self._state = AFTER if self._LIVE else TEXT
        self._reset_block()
        self._pad = trailing
        return pos

    def _between(self, text: str) -> dict[int, str]:
        """Text of the block `text` that is no call, by the index of the call it comes before
        (the number of calls: after the last); shown when the block becomes calls."""
        return {}

    def _call_id(self, model_id: str | None) -> str:
        """The model's id when it is usable and not taken in this scope, else a minted one."""
        scope = self._scope
        if model_id and _MODEL_ID.fullmatch(model_id) and not scope.id_taken(model_id):
            return scope.claim_id(model_id)
        return scope.mint_call_id()

    def _release(self, out: list[Segment], rest: str = "", implied: bool = False) -> None:
        """The block is not a call: everything held goes out as text, nothing lost."""
        text = self._raw.text()
        trailing = ""
        if implied:
            body = text.rstrip()
            text, trailing = body, text[len(body) :]
        self._emit(out, self._block_pad + text + rest)
        self._after_call = False
        self._trailers = ()
        self._state = TEXT
        self._reset_block()
        self._pad = trailing

    def _reject(self, out: list[Segment], pos: int) -> int:
        """Not this dialect's block after all: release it at once, read on as text at `pos`."""
        self._release(out)
        return pos

    @staticmethod
    def _emit(out: list[Segment], text: str) -> None:
        if text:
            out.append(Text(text))


# -- JSON call objects (Hermes) ------------------------------------------------------------------

OPEN, JSON = "open", "json"


class JsonCallsLexer(BlockLexer):
    """`<tool_call>` whitespace, then `{` or `[` (else not a call, released at once), then a JSON
    value followed through strings, escapes and depth. The block ends at the closer outside
    strings; at the next opener outside strings (a complete value is judged as if closed, an
    incomplete one is text); or at the end of the text (a complete value is judged). "Complete":
    the top-level value closed and only whitespace follows it. A `<` outside strings looks ahead
    at most one closer's length."""

    def _step_table(self) -> dict[str, Step]:
        self._scanner = JsonScanner(stops="<")
        return {OPEN: self._step_open, JSON: self._step_json}

    def _reset_body(self) -> None:
        self._scanner.reset()
        self._value_end = -1  # size at which the top-level value closed, -1 while it is open

    def _begin(self, kind: str) -> None:
        self._state = OPEN

    def feed(self, text: str) -> list[Segment]:
        scanner = self._scanner
        if self._state == JSON and scanner.in_string and not scanner.escape and not self._tail and '"' not in text and "\\" not in text and self._size + len(text) <= self._max_held:
            # The bulk of a held block: string text that cannot end the string. What `_step_json`
            # makes of it (the whole piece taken), without its search.
            self._raw.append(text)
            self._size += len(text)
            self.examined += len(text)
            return []
        return super().feed(text)

    def _step_open(self, buf: str, pos: int, limit: int, out: list[Segment]) -> int | None:
        """OPEN: whitespace after the tag is held; the next character decides."""
        end = _WS.match(buf, pos, self._room(pos, len(buf))).end()
        self._take(buf, pos, end)
        if self._size > self._max_held:
            self._release(out)
            return end
        if end == len(buf):
            return None
        if buf[end] in "{[":
            self._state = JSON
            return end
        # A model explaining the syntax: show the tag now, so that its prose streams live.
        return self._reject(out, end)

    def _step_json(self, buf: str, pos: int, limit: int, out: list[Segment]) -> int | None:
        body = self._body
        n = len(buf)
        limit = min(n, pos + max(0, self._max_held - self._size) + 1)
        scan = self._scanner.scan
        i = pos
        while i < limit:
            j, what = scan(buf, i, limit)
            self.examined += j - i
            if what is MORE:
                i = j
                break
            if what is CLOSED:
                if not body.close:  # no closer: the block ends with its value
                    self._take(buf, pos, j)
                    return self._close(out, j)
                if self._value_end < 0:
                    self._value_end = self._size + j - pos
                i = j
                continue
            # "<" outside strings: maybe a tag
            self.examined += min(len(body.close), n - j)
            if body.close and buf.startswith(body.close, j):
                self._take(buf, pos, j)
                return self._close(out, j + len(body.close), closing=body.close)
            if buf.startswith(body.open, j):  # the closer is missing: the next block begins
                self._take(buf, pos, j)
                if self._complete():
                    return self._close(out, j, implied=True)
                self._release(out, implied=True)
                return j
            if n - j < max(len(body.close), len(body.open)) and ((body.close and body.close.startswith(buf[j:])) or body.open.startswith(buf[j:])):
                self._take(buf, pos, j)
                self._tail = buf[j:]
                return None
            i = j + 1
        self._take(buf, pos, i)
        if self._size > self._max_held:
            self._release(out)
            return i
        return None

    def _complete(self) -> bool:
        return self._value_end >= 0 and not self._raw.text()[self._value_end :].strip()

    def _finish_block(self, out: list[Segment], tail: str) -> None:
        if self._state == JSON and self._complete():
            # vLLM accepts a block left open until the end. A tag cut in half at the end is
            # part of the markup: it goes with the block.
            self._close(out, 0, implied=True)
            if not self._after_call:
                self._emit(out, self._pad + tail)
                self._pad = ""
        else:  # OPEN, or a value cut short: nothing was a call, nothing is lost
            self._release(out, tail)

    def _verdict(self, text: str) -> Calls | None:
        block = text[len(self._body.open) :]
        key = self._body.name_key
        entries = call_entries(block) if key != "name" else None
        if entries is not None:  # the judge reads `name`: renamed, the arguments as written
            block = compact_json([{"name": e.get(key), "arguments": e.get("parameters", e.get("arguments"))} if isinstance(e, dict) else e for e in entries])
        calls = self.judge.verdict(block)
        return [(call.name, call.arguments, None) for call in calls] if calls else None


# -- held calls with parameters: what XmlParams and KeyValues share ------------------------------


@dataclass(slots=True)
class _Param:
    """A parameter of a call: its name and where its value lies in the block's text."""

    name: str
    start: int
    end: int
    trim_close: bool = False  # ended by the function's closer: a parameter closer before it is markup


@dataclass(slots=True)
class _Call:
    name: str
    params: list[_Param] = field(default_factory=list)


class _ParamsLexer(BlockLexer):
    """Calls built from named raw values, typed by the tool's schema (`coerce_value`)."""

    _PARAM_CLOSE = ""  # trimmed off values ended by the function's closer

    def _reset_body(self) -> None:
        self._calls: list[_Call] = []

    def _complete_at_end(self) -> bool:
        raise NotImplementedError

    def _finish_block(self, out: list[Segment], tail: str) -> None:
        if self._complete_at_end():
            # vLLM accepts a block left open at the end. A tag cut short at the end is part of
            # the markup: it goes with the block (dropped with its calls, shown with its text).
            self._take(tail, 0, len(tail))
            self._close(out, 0)
        else:  # nothing complete was a call: everything held is text, nothing lost
            self._release(out, tail)

    def _verdict(self, text: str) -> Calls | None:
        """All or nothing, like a list in a JSON block; problems noted as the judge notes them."""
        if not self._calls:
            return None
        tools = self._scope.tools
        for call in self._calls:
            if call.name not in tools:
                self._scope.note(UNKNOWN_NAME, f"{excerpt(call.name)} is not a declared tool")
                return None
        built: Calls = []
        notes: list[tuple[str, str]] = []
        for call in self._calls:
            spec = tools[call.name]
            properties = _properties(spec) or {}
            arguments: dict[str, Any] = {}
            for param in call.params:
                arguments[param.name] = coerce_value(self._value_text(text, param), properties.get(param.name))
            error = self.judge.schema_error(spec, arguments)
            if error is not None:
                if spec.strict:
                    self._scope.note(STRICT_FAILURE, f"{call.name}: {error}")
                    return None
                notes.append((SCHEMA_MISMATCH, f"{call.name}: {error}"))
            built.append((call.name, compact_json(arguments), None))
        if not self._scope.admit_all([name for name, _, _ in built]):
            return None
        for problem, detail in notes:
            self._scope.note(problem, detail)
        return built

    def _value_text(self, text: str, param: _Param) -> str:
        end = param.end
        if param.trim_close:
            body = text[param.start : end].rstrip()
            if self._PARAM_CLOSE and body.endswith(self._PARAM_CLOSE):
                end = param.start + len(body) - len(self._PARAM_CLOSE)
        value = text[param.start : end]
        if self._STRIP_NEWLINES:
            value = value.removeprefix("\n")
            value = value.removesuffix("\n")
        return value


# -- XML parameters (Qwen3-Coder, MiniMax, Seed-OSS) ---------------------------------------------

WRAP, NAME, BODY, VALUE, PEND = "wrap", "name", "body", "value", "pend"
IN_WRAP, AFTER_BARE = "in_wrap", "after_bare"
_UNJUDGED = object()
FUNC, PARAM, IMPLICIT = "function", "parameter", "implicit"  # whose name NAME reads


class XmlParamsLexer(_ParamsLexer):
    """States, and what moves between them:

        TEXT   --wrapper tag-->  WRAP;  --function tag (bare)-->  NAME (of the function)
        WRAP   --whitespace-->  WRAP;  --function tag-->  NAME;  --wrapper end, calls made-->  TEXT (verdict)
        WRAP   --next wrapper tag, calls made-->  TEXT (verdict as if closed)
        WRAP   --other text, calls made-->  IN_WRAP;  --else-->  TEXT (released)
        IN_WRAP  --text-->  IN_WRAP;  --function tag, wrapper end or tag-->  WRAP (the text is shown in place)
        NAME   --`>`-->  BODY (function) / VALUE (parameter);  --a character no name has-->  TEXT (released)
        BODY   --whitespace-->  BODY;  --parameter tag-->  NAME;  --function end-->  WRAP (bare: AFTER_BARE)
        BODY   --anything else-->  TEXT (released: `use <function=NAME> tags` is prose)
        VALUE  --parameter end / function end-->  PEND;  --parameter tag opening a line-->  NAME (implicit)
        PEND   --whitespace-->  PEND;  --a tag that may follow the closer-->  the value ends where it began
        PEND   --anything else-->  VALUE (the closer was part of the value)
        AFTER_BARE  --whitespace-->  AFTER_BARE;  --wrapper end-->  TEXT (verdict: an orphan end is
               markup of the call);  --anything else-->  TEXT (verdict; the whitespace pads what follows)
        finish: WRAP or IN_WRAP after a complete function, PEND after the function end, or
               AFTER_BARE: verdict; else text.

    Values are not escaped, so a value may hold the dialect's own tags. A closer counts only when
    what follows it fits: the parameter end then the next parameter, the function end or the
    wrapper end; the function end then the wrapper end, the next function or the next wrapper
    (bare: at once; a wrapper end right after it, a model's orphan closer, is part of the block).
    Text inside a wrapper after a complete function (before the next function or the wrapper
    end) is shown in its place when the block becomes calls; before the first function it makes
    the block text at once. Opening tags that begin a line inside a value open literal elements,
    counted per kind, whose closers are literal too. A parameter tag beginning a line outside
    literal elements closes the value (a missing parameter end) when it names a property of the
    tool not yet given (any name not yet given when the tool has no properties); otherwise it
    opens a literal element. One leading and one trailing newline of each value are markup."""

    def _step_table(self) -> dict[str, Step]:
        b: XmlParams = self._body  # type: ignore[assignment]
        self._WRAP_OPEN, self._WRAP_CLOSE = b.wrap
        self._FUNC_OPEN, self._FUNC_CLOSE = b.function
        self._PARAM_OPEN, self._PARAM_CLOSE = b.parameter
        self._FUNC_NAME_STOP = re.compile(b.function_name_stop)
        self._PARAM_NAME_STOP = re.compile(b.parameter_name_stop)
        self._wrap_tags = (self._FUNC_OPEN, self._WRAP_CLOSE, self._WRAP_OPEN)
        self._body_tags = (self._PARAM_OPEN, self._FUNC_CLOSE)
        self._value_tags = (self._PARAM_CLOSE, self._FUNC_CLOSE, self._WRAP_CLOSE, self._PARAM_OPEN, self._FUNC_OPEN, self._WRAP_OPEN)
        # What may follow a closer for it to count.
        self._after_param_wrapped = (self._PARAM_OPEN, self._FUNC_CLOSE, self._WRAP_CLOSE)
        self._after_param_bare = (self._PARAM_OPEN, self._FUNC_CLOSE)
        self._after_function = (self._WRAP_CLOSE, self._FUNC_OPEN, self._WRAP_OPEN)
        return {
            WRAP: self._step_wrap,
            NAME: self._step_name,
            BODY: self._step_body,
            VALUE: self._step_value,
            PEND: self._step_pend,
            IN_WRAP: self._step_in_wrap,
            AFTER_BARE: self._step_after_bare,
        }

    def _reset_body(self) -> None:
        super()._reset_body()
        self._wrapped = False
        self._properties: dict[str, Any] | None = None  # of the current function's tool
        self._seen: set[str] = set()  # parameters the current function has given
        self._name_for = FUNC
        self._name_chars = ""
        self._param_name = ""
        self._value_start = 0
        # Elements opened literally inside the current value, per kind: their closers are
        # literal too. Kept apart so that a stray literal parameter tag cannot hide the real
        # function end (vLLM falls back on it the same way).
        self._open_params = self._open_functions = self._open_wraps = 0
        self._pend_kind = PARAM  # which closer PEND is confirming
        self._pend_at = 0  # where that closer began: the value's end if it counts
        self._function_end = 0  # where the last function's closer ended
        self._judged: Any = _UNJUDGED  # a bare function's verdict, given at its end
        self._texts: list[tuple[int, int, int]] = []  # (calls before it, start, end): text in the wrapper

    def _begin(self, kind: str) -> None:
        self._wrapped = kind == "wrap"
        if self._wrapped:
            self._state = WRAP
        else:
            self._read_name(FUNC)

    def _complete_at_end(self) -> bool:
        if self._state == WRAP:
            return bool(self._calls)  # every function in it is closed
        if self._state == IN_WRAP:  # text after a complete function, up to the end
            self._texts.append((len(self._calls), self._function_end, self._size))
            return True
        if self._state == AFTER_BARE:
            return True
        if self._state == PEND and self._pend_kind == FUNC:  # the end of the text confirms it
            self._end_param(trim_close=True)
            return True
        return False

    def _parse_name(self, raw: str) -> str | None:
        if self._body.quoted_names:  # `"NAME"`, `'NAME'` or a bare NAME
            raw = raw.strip()
            if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
                raw = raw[1:-1]
        return raw or None

    def _step_wrap(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """WRAP: between the functions of a wrapper."""
        j = self._skip_ws(buf, i, limit)
        if j == limit:
            return self._wait(buf, j, limit, out)
        tag = match_tag(buf, j, limit, self._wrap_tags)
        if tag is _PARTIAL:
            return self._wait(buf, j, limit, out)
        if tag == self._FUNC_OPEN:
            self._take(buf, j, j + len(tag))
            self._read_name(FUNC)
            return j + len(tag)
        if self._calls and tag == self._WRAP_CLOSE:
            self._take(buf, j, j + len(tag))
            return self._close(out, j + len(tag))
        if self._calls and tag == self._WRAP_OPEN:  # the end tag is missing: the next block begins
            return self._close(out, j)
        if self._calls:  # text after a complete function: held with the block, shown in place
            self._state = IN_WRAP
            return j
        # `<tool_call>{` (Hermes), `<tool_call>name` (GLM), prose: not ours, shown at once.
        return self._reject(out, j)

    def _step_in_wrap(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """IN_WRAP: text inside the wrapper after a function, up to the wrapper's next tag."""
        while True:
            j = buf.find("<", i, limit)
            if j < 0:
                self._take(buf, i, limit)
                return self._wait(buf, limit, limit, out)
            self._take(buf, i, j)
            tag = match_tag(buf, j, limit, self._wrap_tags)
            if tag is _PARTIAL:
                return self._wait(buf, j, limit, out)
            if tag is not None:  # WRAP reads the tag
                self._texts.append((len(self._calls), self._function_end, self._size))
                self._state = WRAP
                return j
            self._take(buf, j, j + 1)
            i = j + 1

    def _step_after_bare(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """AFTER_BARE: a bare function ended; the wrapper's end may follow it (vLLM drops it with
        whatever follows the call; here only the closer goes, prose after it stays)."""
        j = self._skip_ws(buf, i, limit)
        tag = match_tag(buf, j, limit, (self._WRAP_CLOSE,)) if j < limit else _PARTIAL
        if tag is _PARTIAL:
            if limit < len(buf):  # the cap: the call is complete, the look-ahead ends here
                return self._close(out, j, implied=True)
            self._tail = buf[j:]
            return None
        if tag is None:
            return self._close(out, j, implied=True)
        self._take(buf, j, j + len(tag))
        return self._close(out, j + len(tag))

    def _verdict(self, text: str) -> Calls | None:
        return super()._verdict(text) if self._judged is _UNJUDGED else self._judged

    def _between(self, text: str) -> dict[int, str]:
        shown: dict[int, str] = {}
        for k, start, end in self._texts:  # whitespace before the next tag pads it
            shown[k] = shown.get(k, "") + text[start:end].rstrip()
        return shown

    def _read_name(self, target: str) -> None:
        self._name_for = target
        self._name_chars = ""
        self._state = NAME

    def _step_name(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """NAME: the name of a function or parameter tag, up to its `>`."""
        stop_at = self._FUNC_NAME_STOP if self._name_for == FUNC else self._PARAM_NAME_STOP
        room = MAX_NAME - len(self._name_chars)
        end = min(limit, i + room + 1)
        stop = stop_at.search(buf, i, end)
        if stop is None:
            if end - i > room:  # longer than any name
                self._take(buf, i, i + room)
                return self._bad_name(out, i + room)
            self._name_chars += buf[i:end]
            self._take(buf, i, end)
            return self._wait(buf, end, limit, out)
        j = stop.start()
        self._name_chars += buf[i:j]
        self._take(buf, i, j)
        if buf[j] != ">":
            return self._bad_name(out, j)
        self._take(buf, j, j + 1)
        return self._named(out, j + 1)

    def _bad_name(self, out: list[Segment], j: int) -> int:
        if self._name_for == IMPLICIT:  # not a tag after all: plain text of the value
            self._state = VALUE
            return j
        return self._reject(out, j)

    def _named(self, out: list[Segment], pos: int) -> int:
        name = self._parse_name(self._name_chars)
        if self._name_for == FUNC:
            if name is None:
                return self._reject(out, pos)
            self._calls.append(_Call(name))
            self._properties = _properties(self._scope.tools.get(name))
            self._seen = set()
            self._state = BODY
        elif self._name_for == PARAM:
            if name is None:
                return self._reject(out, pos)
            self._begin_param(name)
        elif name is not None and name not in self._seen and (self._properties is None or name in self._properties):
            # A parameter the tool has and the call has not given yet: the previous value
            # lacked its closer (vLLM tolerates this).
            self._end_param(trim_close=False)
            self._begin_param(name)
        else:
            if name is not None:  # a literal element inside the value: its close is literal too
                self._open_params += 1
            self._state = VALUE
        return pos

    def _begin_param(self, name: str) -> None:
        self._param_name = name
        self._seen.add(name)
        self._value_start = self._size
        self._open_params = self._open_functions = self._open_wraps = 0
        self._state = VALUE

    def _end_param(self, trim_close: bool) -> None:
        self._calls[-1].params.append(_Param(self._param_name, self._value_start, self._pend_at, trim_close))

    def _end_function(self, out: list[Segment], pos: int) -> int:
        if not self._wrapped:  # a bare function is the whole block (an orphan closer aside)
            # Judged now: a block that is text goes at once, calls wait for what follows them.
            self._judged = super()._verdict(self._raw.text())
            if not self._judged:
                return self._close(out, pos)
            self._state = AFTER_BARE
            return pos
        self._function_end = self._size
        self._state = WRAP
        return pos

    def _step_body(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """BODY: right after the function's name: a parameter or the end of the function."""
        j = self._skip_ws(buf, i, limit)
        if j == limit:
            return self._wait(buf, j, limit, out)
        tag = match_tag(buf, j, limit, self._body_tags)
        if tag is _PARTIAL:
            return self._wait(buf, j, limit, out)
        if tag is None:  # `use <function=NAME> tags`, Llama's `<function=NAME>{json}`: not ours
            return self._reject(out, j)
        self._take(buf, j, j + len(tag))
        if tag == self._PARAM_OPEN:
            self._read_name(PARAM)
            return j + len(tag)
        return self._end_function(out, j + len(tag))

    def _step_value(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """VALUE: raw text; only the dialect's tags matter, and only some of them count."""
        while True:
            j = buf.find("<", i, limit)
            if j < 0:
                self._take(buf, i, limit)
                return self._wait(buf, limit, limit, out)
            self._take(buf, i, j)
            tag = match_tag(buf, j, limit, self._value_tags)
            if tag is _PARTIAL:
                return self._wait(buf, j, limit, out)
            if tag is None:
                self._take(buf, j, j + 1)
                i = j + 1
                continue
            line_start = self._size == self._value_start or self._last == "\n"
            n = j + len(tag)
            self._take(buf, j, n)
            if tag == self._PARAM_CLOSE:
                if self._open_params:  # closes a literal element of the value
                    self._open_params -= 1
                    i = n
                    continue
                self._pend_at = self._size - len(tag)
                self._pend_kind = PARAM
                self._state = PEND
                return n
            if tag == self._FUNC_CLOSE:
                if self._open_functions:
                    self._open_functions -= 1
                    i = n
                    continue
                self._pend_at = self._size - len(tag)
                if not self._wrapped:  # bare: nothing follows to confirm it
                    self._end_param(trim_close=True)
                    return self._end_function(out, n)
                self._pend_kind = FUNC
                self._state = PEND
                return n
            if tag == self._WRAP_CLOSE:
                self._open_wraps = max(0, self._open_wraps - 1)
            elif line_start:  # tags inside a line are prose about tags: only line starts nest
                if tag == self._FUNC_OPEN:
                    self._open_functions += 1
                elif tag == self._WRAP_OPEN:
                    self._open_wraps += 1
                elif self._open_params or self._open_functions or self._open_wraps:
                    self._open_params += 1
                else:  # a parameter opening a line, outside any literal element: maybe the
                    # missing parameter end (decided once its name is read)
                    self._pend_at = self._size - len(tag)
                    self._read_name(IMPLICIT)
                    return n
            i = n

    def _step_pend(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """PEND: a closer was read; what follows it says whether it counts."""
        j = self._skip_ws(buf, i, limit)
        if j == limit:
            return self._wait(buf, j, limit, out)
        if self._pend_kind == PARAM:
            tags = self._after_param_wrapped if self._wrapped else self._after_param_bare
        else:
            tags = self._after_function
        tag = match_tag(buf, j, limit, tags)
        if tag is _PARTIAL:
            return self._wait(buf, j, limit, out)
        if tag is None:  # the closer and the whitespace after it are part of the value
            self._state = VALUE
            return j
        n = j + len(tag)
        self._end_param(trim_close=self._pend_kind == FUNC)
        if tag == self._WRAP_OPEN:  # the function end, then the next block: this one is complete
            return self._close(out, j)
        self._take(buf, j, n)
        if tag == self._PARAM_OPEN:
            self._read_name(PARAM)
            return n
        if tag == self._FUNC_OPEN:
            self._read_name(FUNC)
            return n
        if tag == self._WRAP_CLOSE:  # the function end was missing, or confirmed
            return self._close(out, n)
        return self._end_function(out, n)  # the parameter end, then the function end


# -- key / value pairs (GLM) ---------------------------------------------------------------------

HEAD, KV_NAME, AFTER_NAME, KEY, KV, KV_VALUE, KV_PEND = "head", "kv_name", "after_name", "key", "kv", "kv_value", "kv_pend"


class KeyValuesLexer(_ParamsLexer):
    """States, and what moves between them:

        TEXT   --opener-->  HEAD  --whitespace-->  HEAD;  --name character-->  NAME;  --else-->  TEXT (released)
        NAME   --name characters-->  NAME;  --anything else-->  AFTER_NAME
        AFTER_NAME  --whitespace-->  AFTER_NAME;  --key tag-->  KEY;  --closer-->  TEXT (verdict, `{}`)
        KEY    --text-->  KEY;  --key end-->  KV;  --any other `<`-->  TEXT (released)
        KV     --whitespace-->  KV;  --value tag-->  VALUE;  --else-->  TEXT (released)
        VALUE  --value end-->  PEND
        PEND   --whitespace-->  PEND;  --key tag-->  KEY;  --closer-->  TEXT (verdict)
        PEND   --opener-->  TEXT (verdict as if closed; the next block begins)
        PEND   --anything else-->  VALUE (the value end was part of the value)
        finish: PEND (every value closed): verdict; else text.

    Values are taken as written (no newline comes off). With `escaped`, the whitespace that
    AFTER_NAME, KV and PEND skip may hold the escaped separator; a block where one was skipped
    has its values unescaped as the text of a JSON string (kept as written when that fails)."""

    _STRIP_NEWLINES = False

    def _step_table(self) -> dict[str, Step]:
        b: KeyValues = self._body  # type: ignore[assignment]
        self._name_char = re.compile(b.name_chars)
        self._name_run = re.compile(b.name_chars + "*")
        return {
            HEAD: self._step_head,
            KV_NAME: self._step_name,
            AFTER_NAME: self._step_after_name,
            KEY: self._step_key,
            KV: self._step_kv,
            KV_VALUE: self._step_value,
            KV_PEND: self._step_pend,
        }

    def _reset_body(self) -> None:
        super()._reset_body()
        self._name_chars = ""
        self._key_chars = ""
        self._value_start = 0
        self._pend_at = 0
        self._escaped = False  # an escaped separator was read: the values are escaped too
        self._pend_escaped = False  # `_escaped` when the value end PEND confirms was read

    def _skip_sep(self, buf: str, i: int, limit: int) -> tuple[int, bool]:
        """Whitespace and escaped separators from `i`: where they end, and whether an escaped
        separator may be cut short there (more text decides)."""
        sep = self._body.escaped
        j = self._skip_ws(buf, i, limit)
        while sep and j < limit and buf[j] == sep[0]:
            if buf.startswith(sep, j, limit):
                self._escaped = True
                self._take(buf, j, j + len(sep))
                j = self._skip_ws(buf, j + len(sep), limit)
            else:
                return j, limit - j < len(sep) and sep.startswith(buf[j:limit])
        return j, False

    def _value_text(self, text: str, param: _Param) -> str:
        value = super()._value_text(text, param)
        if self._escaped:
            try:
                return json.loads(f'"{value}"', strict=False)
            except ValueError:
                pass
        return value

    def _begin(self, kind: str) -> None:
        self._state = HEAD

    def _complete_at_end(self) -> bool:
        if self._state == KV_PEND:  # every value closed; only the closer is missing
            self._end_pair()
            return True
        return False

    def _step_head(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """HEAD: whitespace, then the first character of a name, or not this dialect at all."""
        j = self._skip_ws(buf, i, limit)
        if j == limit:
            return self._wait(buf, j, limit, out)
        if not self._name_char.match(buf, j):  # `{` (Hermes), `<function=` (Qwen), prose
            return self._reject(out, j)
        self._state = KV_NAME
        return j

    def _step_name(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        room = MAX_NAME - len(self._name_chars)
        j = self._name_run.match(buf, i, min(limit, i + room + 1)).end()
        if j - i > room:
            self._take(buf, i, i + room)
            return self._reject(out, i + room)
        self._name_chars += buf[i:j]
        self._take(buf, i, j)
        if j == limit:
            return self._wait(buf, j, limit, out)
        self._calls = [_Call(self._name_chars)]
        self._state = AFTER_NAME
        return j

    def _step_after_name(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """AFTER_NAME: the first key, or the end of a call without arguments."""
        b: KeyValues = self._body  # type: ignore[assignment]
        j, cut = self._skip_sep(buf, i, limit)
        if cut or j == limit:
            return self._wait(buf, j, limit, out)
        tag = match_tag(buf, j, limit, (b.key[0], b.close))
        if tag is _PARTIAL:
            return self._wait(buf, j, limit, out)
        if tag is None:  # `<tool_call> tags, like...`: prose, shown at once
            return self._reject(out, j)
        self._take(buf, j, j + len(tag))
        if tag == b.close:
            return self._close(out, j + len(tag))
        self._key_chars = ""
        self._state = KEY
        return j + len(tag)

    def _step_key(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        room = MAX_NAME - len(self._key_chars)
        end = min(limit, i + room + 1)
        j = buf.find("<", i, end)
        if j < 0:
            if end - i > room:
                self._take(buf, i, i + room)
                return self._reject(out, i + room)
            self._key_chars += buf[i:end]
            self._take(buf, i, end)
            return self._wait(buf, end, limit, out)
        self._key_chars += buf[i:j]
        self._take(buf, i, j)
        tag = match_tag(buf, j, limit, (self._body.key[1],))
        if tag is _PARTIAL:
            return self._wait(buf, j, limit, out)
        key = self._key_chars.strip()
        if tag is None or not key:
            return self._reject(out, j)
        self._take(buf, j, j + len(tag))
        self._key_chars = key
        self._state = KV
        return j + len(tag)

    def _step_kv(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        j, cut = self._skip_sep(buf, i, limit)
        if cut or j == limit:
            return self._wait(buf, j, limit, out)
        tag = match_tag(buf, j, limit, (self._body.value[0],))
        if tag is _PARTIAL:
            return self._wait(buf, j, limit, out)
        if tag is None:
            return self._reject(out, j)
        self._take(buf, j, j + len(tag))
        self._value_start = self._size
        self._state = KV_VALUE
        return j + len(tag)

    def _step_value(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        close = (self._body.value[1],)
        while True:
            j = buf.find("<", i, limit)
            if j < 0:
                self._take(buf, i, limit)
                return self._wait(buf, limit, limit, out)
            self._take(buf, i, j)
            tag = match_tag(buf, j, limit, close)
            if tag is _PARTIAL:
                return self._wait(buf, j, limit, out)
            if tag is None:
                self._take(buf, j, j + 1)
                i = j + 1
                continue
            self._pend_at = self._size
            self._pend_escaped = self._escaped
            self._take(buf, j, j + len(tag))
            self._state = KV_PEND
            return j + len(tag)

    def _step_pend(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """PEND: the value end counts when the next key or the end of the call follows."""
        b: KeyValues = self._body  # type: ignore[assignment]
        j, cut = self._skip_sep(buf, i, limit)
        if cut or j == limit:
            return self._wait(buf, j, limit, out)
        tag = match_tag(buf, j, limit, (b.key[0], b.close, b.open))
        if tag is _PARTIAL:
            return self._wait(buf, j, limit, out)
        if tag is None:  # part of the value, like the whitespace after it
            self._escaped = self._pend_escaped  # (and a separator read there was none)
            self._state = KV_VALUE
            return j
        self._end_pair()
        if tag == b.open:  # the closer is missing: the next block begins
            return self._close(out, j)
        self._take(buf, j, j + len(tag))
        if tag == b.close:
            return self._close(out, j + len(tag))
        self._key_chars = ""
        self._state = KEY
        return j + len(tag)

    def _end_pair(self) -> None:
        self._calls[0].params.append(_Param(self._key_chars, self._value_start, self._pend_at))


# -- calls named in front of their arguments (Mistral) ---------------------------------------------

CALLS, LIST_OPEN, LIST, CALL_NAME, CALL_ID, ARGS_OPEN, ARGS = "calls", "list_open", "list", "call_name", "call_id", "args_open", "args"
_NAME_CHAR = re.compile(r"[A-Za-z0-9_.\-]")
_NAME_RUN = re.compile(r"[A-Za-z0-9_.\-]*")
_ID_RUN = re.compile(r"[A-Za-z0-9_\-]*")


class NamedCallsLexer(BlockLexer):
    """States, and what moves between them (`open`: `[TOOL_CALLS]`, `args`: `[ARGS]`, `call_id`:
    `[CALL_ID]`):

        TEXT       --open-->  CALLS  --pad-->  CALLS;  --`[`-->  LIST_OPEN;  --name character-->  NAME
        LIST_OPEN  --whitespace, then `{`-->  LIST (a JSON list of call objects)
        NAME       --`{`-->  ARGS (`args` stripped upstream);  --args-->  ARGS_OPEN;  --call_id-->  CALL_ID
        CALL_ID    --id characters, then args-->  ARGS_OPEN  --whitespace, then `{`-->  ARGS
        LIST, ARGS --the value closes-->  AFTER (verdict);  --open outside strings-->  TEXT (released)
        AFTER      --open-->  CALLS;  --name character-->  NAME (the next call)
        anything else where the table expects something: TEXT (released at once)
        finish: a block still open is incomplete: text."""

    _LIVE = True

    def _step_table(self) -> dict[str, Step]:
        b: NamedCalls = self._body  # type: ignore[assignment]
        self._scanner = JsonScanner(stops="[")  # a `[` may begin `open`
        self._pad_run = re.compile(b.pad)
        self._inner = (b.args, b.call_id, b.open)
        return {
            CALLS: self._step_calls,
            LIST_OPEN: self._opener("{", LIST, mark=False),  # the list began at its `[`
            CALL_NAME: self._step_name,
            CALL_ID: self._step_id,
            ARGS_OPEN: self._opener("{", ARGS),
            LIST: self._step_value,
            ARGS: self._step_value,
        }

    def _reset_body(self) -> None:
        self._name = ""
        self._model_id = ""
        self._value_at = 0  # where the JSON value begins in the block
        self._scanner.reset()

    def _begin(self, kind: str) -> None:
        self._state = CALLS

    def _continues(self, c: str) -> str | None:
        return CALL_NAME if _NAME_CHAR.match(c) else None  # v13+: the next name right after a call

    def _step_calls(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """CALLS: the pad after `open` is held; the next character decides."""
        end = self._pad_run.match(buf, i, self._room(i, len(buf))).end()
        self._take(buf, i, end)
        if self._over_cap(out):
            return end
        if end == len(buf):
            return None
        if buf[end] == "[":
            tag = self._tag(buf, end, (self._body.open,))
            if tag is _PARTIAL:
                self._tail = buf[end:]
                return None
            if tag is not None:  # `open` twice: the first is text, TEXT reads the second
                return self._reject(out, end)
            self._value_at = self._size
            self._take(buf, end, end + 1)
            self._scanner.take("[")
            self._state = LIST_OPEN
            self._over_cap(out)
            return end + 1
        if not _NAME_CHAR.match(buf, end):  # e.g. the token quoted in prose: shown at once
            return self._reject(out, end)
        self._state = CALL_NAME
        return end

    def _step_name(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """NAME: name characters, then `{`, `args` or `call_id`."""
        n = len(buf)
        end = _NAME_RUN.match(buf, i, min(self._room(i, n), i + MAX_CALL_NAME - len(self._name) + 1)).end()
        self._take(buf, i, end)
        self._name += buf[i:end]
        if self._over_cap(out):
            return end
        if len(self._name) > MAX_CALL_NAME:
            return self._reject(out, end)
        if end == n:
            return None
        if buf[end] == "{":
            self._value_at = self._size
            self._state = ARGS
            return end
        return self._inner_tag(buf, end, out, {self._body.args: ARGS_OPEN, self._body.call_id: CALL_ID})

    def _step_id(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """CALL_ID: the model's id, then `args`."""
        n = len(buf)
        end = _ID_RUN.match(buf, i, min(self._room(i, n), i + MAX_ID - len(self._model_id) + 1)).end()
        self._take(buf, i, end)
        self._model_id += buf[i:end]
        if self._over_cap(out):
            return end
        if len(self._model_id) > MAX_ID:
            return self._reject(out, end)
        if end == n:
            return None
        return self._inner_tag(buf, end, out, {self._body.args: ARGS_OPEN})

    def _inner_tag(self, buf: str, i: int, out: list[Segment], moves: dict[str, str]) -> int | None:
        """At `buf[i]`: a tag of `moves` goes on; anything else is not a call (an `open` here is
        read again by TEXT)."""
        tag = self._tag(buf, i, self._inner)
        if tag is _PARTIAL:
            self._tail = buf[i:]
            return None
        if tag not in moves:
            return self._reject(out, i)
        end = i + len(tag)
        self._take(buf, i, end)
        if not self._over_cap(out):
            self._state = moves[tag]
        return end

    def _step_value(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """LIST, ARGS: follow the value to its end; `open` outside strings cuts it short."""
        return self._follow(buf, i, out, self._scanner, (self._body.open,), self._close)

    def _verdict(self, text: str) -> Calls | None:
        value = text[self._value_at :]
        if self._state == LIST:
            return judge_entries(self.judge, value)
        return judge_call(self.judge, self._name, value, self._model_id)


# -- Llama's three spellings ---------------------------------------------------------------------

START, FUNC_NAME, FUNC_OPEN, FUNC_ARGS, FUNC_END = "start", "func_name", "func_open", "func_args", "func_end"
PY_OPEN, PY_LIST, TAG_OPEN, TAG_JSON = "py_open", "py_list", "tag_open", "tag_json"


class LlamaCallsLexer(BlockLexer):
    """States, and what moves between them:

        TEXT       --function-->  FUNC_NAME  --name characters, then `>` (`">`)-->  FUNC_OPEN
        FUNC_OPEN  --whitespace, then `{`-->  FUNC_ARGS;  --function_end-->  AFTER (verdict: `{}`)
        FUNC_ARGS  --the object closes-->  FUNC_END  --whitespace, then function_end-->  AFTER (verdict)
        FUNC_END   --function opener-->  AFTER (verdict as if closed; AFTER reads the tag)
        TEXT       --python-->  PY_OPEN  --whitespace, then `[`-->  PY_LIST  --the list closes-->  AFTER
        TEXT       --tagged-->  TAG_OPEN  --whitespace, then `{`-->  TAG_JSON  --the object closes-->  AFTER
        AFTER      --`{` after the separator (tagged)-->  TAG_JSON (the next call)
        START (`bare_json`: Llama 3.x's call objects without the tag, only at the very start of
               the text, as vLLM reads them)  --whitespace, then `{`-->  TAG_OPEN;  --else-->  TEXT
        anything else where the table expects something, a value cut short by a tag outside its
        strings: TEXT (released)
        finish: FUNC_END gets its verdict as if closed (a half-written end tag goes with it);
        anything else still open is text."""

    _LIVE = True

    def __init__(self, spec: Spec, scope: CallScope, *, max_held: int = 1 << 20, bare_json: bool = False) -> None:
        self._bare_json = bare_json
        super().__init__(spec, scope, max_held=max_held)

    def _step_table(self) -> dict[str, Step]:
        b: LlamaCalls = self._body  # type: ignore[assignment]
        self._json = JsonScanner(stops="<")
        self._python = PythonScanner()
        self._func_cut = (b.function_end, b.function[0])
        self._py_cut = (b.python[1], b.python[0], b.tagged)
        self._tag_cut = (b.tagged,) + b.tagged_ends
        return {
            START: self._step_start,
            FUNC_NAME: self._step_name,
            FUNC_OPEN: self._step_func_open,
            FUNC_ARGS: lambda buf, i, limit, out: self._follow(buf, i, out, self._json, self._func_cut, self._value_closed),
            FUNC_END: self._step_func_end,
            PY_OPEN: self._opener("[", PY_LIST),
            PY_LIST: lambda buf, i, limit, out: self._follow(buf, i, out, self._python, self._py_cut, self._close),
            TAG_OPEN: self._opener("{", TAG_JSON),
            TAG_JSON: lambda buf, i, limit, out: self._follow(buf, i, out, self._json, self._tag_cut, self._close),
        }

    def _reset(self) -> None:
        super()._reset()
        if self._bare_json:
            self._state = START

    def _reset_body(self) -> None:
        self._quoted = False
        self._name = ""
        self._value_at = 0  # where the value begins in the block
        self._value_end = -1  # FUNC_END: where it ended
        self._json.reset()
        self._python.reset()

    def _begin(self, kind: str) -> None:
        self._quoted = kind == NAMED
        self._state = {FUNCTION: FUNC_NAME, NAMED: FUNC_NAME, PYTHON: PY_OPEN, TAGGED: TAG_OPEN}[kind]

    def _continues(self, c: str) -> str | None:
        # Llama 3.x's calls follow one another after `;` (its template writes `; `), a newline,
        # any whitespace or nothing at all (vLLM PR #49923 skips any run of `; \t\n`).
        if self._section == TAGGED and c == "{" and self._after_call:
            return TAG_JSON
        return None

    def _separators(self) -> str:
        return self._body.separator if self._section == TAGGED else ""

    def _end_block(self, out: list[Segment]) -> None:
        if self._state == FUNC_END:  # vLLM and llama.cpp accept a tag left open at the end
            self._close(out, 0, implied=True)
        else:
            self._release(out)

    def _step_start(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """START: whitespace alone decides nothing; a `{` first is a tagged call without its tag."""
        end = _WS.match(buf, i).end()
        if end == len(buf) and not self._final:
            self._tail = buf[i:]
            return None
        self._state = TEXT
        if end == len(buf) or buf[end] != "{":  # the text ended, or began otherwise: TEXT reads it
            return i
        self._section = TAGGED
        self._begin(TAGGED)
        self._take(buf, i, end)
        return end

    def _step_name(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """FUNC_NAME: name characters up to `>`; anything else (a code sample) is text."""
        n = len(buf)
        end = _NAME_RUN.match(buf, i, min(self._room(i, n), i + MAX_CALL_NAME - len(self._name) + 1)).end()
        self._take(buf, i, end)
        self._name += buf[i:end]
        if self._over_cap(out):
            return end
        if len(self._name) > MAX_CALL_NAME:
            return self._reject(out, end)
        if end == n:
            return None
        close = '">' if self._quoted else ">"
        if self._name and buf.startswith(close, end):
            self._take(buf, end, end + len(close))
            self._state = FUNC_OPEN
            return end + len(close)
        if self._name and not self._final and close.startswith(buf[end:]):  # `"` at the end: the `>` may follow
            self._tail = buf[end:]
            return None
        return self._reject(out, end)

    def _step_func_open(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """FUNC_OPEN: whitespace, then the arguments object or the end tag."""
        end = _WS.match(buf, i, self._room(i, len(buf))).end()
        self._take(buf, i, end)
        if self._over_cap(out):
            return end
        if end == len(buf):
            return None
        if buf[end] == "{":
            self._state = FUNC_ARGS
            self._value_at = self._size
            return end
        tag = self._tag(buf, end, (self._body.function_end,))
        if tag is _PARTIAL:
            self._tail = buf[end:]
            return None
        if tag is None:
            return self._reject(out, end)
        self._take(buf, end, end + len(tag))
        return self._close(out, end + len(tag))

    def _value_closed(self, out: list[Segment], j: int) -> int:
        self._state = FUNC_END
        self._value_end = self._size
        return j

    def _step_func_end(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """FUNC_END: whitespace, then the end tag (or the next tag: the end tag is missing)."""
        b: LlamaCalls = self._body  # type: ignore[assignment]
        end = _WS.match(buf, i, self._room(i, len(buf))).end()
        self._take(buf, i, end)
        if self._over_cap(out):
            return end
        if end == len(buf):
            return None
        tag = match_tag(buf, end, len(buf), self._func_cut)
        if tag is _PARTIAL:
            if not self._final:
                self._tail = buf[end:]
                return None
            if b.function_end.startswith(buf[end:]):  # a half-written end tag at the end
                self._take(buf, end, len(buf))
                self._close(out, len(buf))
                return None
        if tag == b.function_end:
            self._take(buf, end, end + len(tag))
            return self._close(out, end + len(tag))
        if tag == b.function[0]:  # AFTER reads the next tag
            return self._close(out, end, implied=True)
        return self._reject(out, end)  # a value followed by prose is not a call

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
_IN_SINGLE = re.compile(r"['\\]")
_IN_DOUBLE = re.compile(r'["\\]')


class PythonScanner:
    """`JsonScanner`'s contract for a Python list: strings (`'`, `"`, triple-quoted), escapes and
    brackets; a `<` outside strings is a STOP. WAIT: a quote at the end of the text may still
    begin a triple quote."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.depth = 0
        self.quote = ""  # the open string's quote, "" outside strings
        self.escape = False

    def scan(self, buf: str, pos: int, limit: int, final: bool = False) -> tuple[int, str]:
        n = len(buf)
        i = pos
        while i < limit:
            if self.quote:
                if self.escape:
                    self.escape = False
                    i += 1
                    continue
                stop = (_IN_SINGLE if self.quote[0] == "'" else _IN_DOUBLE).search(buf, i, limit)
                if stop is None:
                    return limit, MORE
                j = stop.start()
                if buf[j] == "\\":
                    self.escape = True
                    i = j + 1
                elif len(self.quote) == 1 or buf.startswith(self.quote, j):
                    i = j + len(self.quote)
                    self.quote = ""
                elif not final and n - j < 3 and self.quote.startswith(buf[j:]):
                    return j, WAIT
                else:  # a lone quote inside a triple-quoted string
                    i = j + 1
                continue
            stop = _PY_STOP.search(buf, i, limit)
            if stop is None:
                return limit, MORE
            j = stop.start()
            c = buf[j]
            if c == "<":
                return j, STOP
            if c in "'\"":
                if buf.startswith(c * 3, j):
                    self.quote = c * 3
                elif not final and n - j < 3 and (c * 3).startswith(buf[j:]):
                    return j, WAIT
                else:
                    self.quote = c
                i = j + len(self.quote)
                continue
            if self.take(c):
                return j + 1, CLOSED
            i = j + 1
        return i, MORE  # `i` may pass `limit` by the rest of a triple quote

    def take(self, c: str) -> bool:
        """Read one character outside strings; True when it closes the list."""
        if c in "([{":
            self.depth += 1
        elif c in ")]}" and self.depth:
            self.depth -= 1
            return self.depth == 0
        return False
