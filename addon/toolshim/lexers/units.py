"""Held units: the machinery shared by the dialects whose markup is read whole before a verdict
(Mistral's `[TOOL_CALLS]`, Llama's tags and JSON): text streams live, a unit of markup is held
until it closes, then judged (`ToolCallJudge`: declared name, strict schema, repair) and sent as
calls or released as the text it was; padding after calls is markup. `JsonScanner` follows JSON
strings and depth incrementally; `judge_entries` reads call objects or lists.
"""

from __future__ import annotations

import re
from typing import Callable

from ..calls import CallScope
from .base import CLOSED, MORE, STOP, WAIT, CallArgs, CallBegin, CallEnd, JsonScanner, Marker, Reporting, Segment, Text, find_marker  # noqa: F401 (re-exported)
from ..judge import Calls, ToolCallJudge

TEXT, AFTER = "text", "after"

MAX_NAME = 64  # OpenAI's limit: a longer run of name characters is prose, not a name
MAX_ID = 64
_NAME_CHAR = re.compile(r"[A-Za-z0-9_.\-]")
_NAME_RUN = re.compile(r"[A-Za-z0-9_.\-]*")
_ID_RUN = re.compile(r"[A-Za-z0-9_\-]*")
_MODEL_ID = re.compile(r"[A-Za-z0-9_\-]{1,64}")  # a model id we pass on (Mistral's: 9 alphanumerics)
_WS = re.compile(r"\s*")
_CALLS_PAD = re.compile(r"[\s\u2581]*")  # `▁`: SentencePiece's space, decoded after the token

PARTIAL = "partial"  # what `marker_at` returns for a possible beginning of a marker



def marker_at(buf: str, i: int, markers: tuple[Marker, ...]) -> Marker | str | None:
    """The marker that starts at `buf[i]`, `PARTIAL` if the text ends inside one, or None."""
    rest_len = len(buf) - i
    partial = False
    for marker in markers:
        if buf.startswith(marker.text, i):
            return marker
        if rest_len < len(marker.text) and marker.text.startswith(buf[i:]):
            partial = True
    return PARTIAL if partial else None


# -- the shared engine ------------------------------------------------------------------------


class UnitLexer(Reporting):
    """Text streams live; a unit of markup is held until a verdict makes it calls or text.

    Subclasses give `markers` (what opens a section in TEXT), a handler per state of theirs,
    the state each marker opens (`_opens`), what continues a section after a unit
    (`_continues`), and what a unit still open at `finish()` becomes (`_end_unit`).

    Whitespace after a unit is held in AFTER. After calls it is padding: dropped when more
    calls follow or the text ends, given back in front of anything else. After a unit that
    stayed text it is shown as it was. Whitespace before a marker is text and streams live
    (it was the model's prose), so the output does not depend on how the text was split.
    Text outside units, and every unit that does not become calls, reaches the output as Text,
    in order, character for character. Without declared tools everything passes at once.
    """

    markers: tuple[Marker, ...] = ()
    trailers: dict[str, tuple[Marker, ...]] = {}  # section kind -> end tokens swallowed after its calls
    separators: dict[str, str] = {}  # section kind -> characters that separate its units, held as padding

    def __init__(self, scope: CallScope, *, max_held: int = 1 << 20) -> None:
        self._scope = scope
        self.judge = ToolCallJudge(scope)
        self._max_held = max_held
        # Without declared tools no markup can be a call: nothing is held, nothing is scanned.
        self._pass_through = not scope.tools
        self._handlers: dict[str, Callable[[str, int, list[Segment], bool], int | None]] = {
            TEXT: self._scan_text,
            AFTER: self._scan_after,
            **self._dialect_handlers(),
        }
        self._reset()
        idle = self._idle_now()
        if idle != self.idle:
            self._report(idle)

    # -- what subclasses give ------------------------------------------------------------------

    def _dialect_handlers(self) -> dict[str, Callable[[str, int, list[Segment], bool], int | None]]:
        raise NotImplementedError

    def _opens(self, marker: Marker) -> str:
        """The state a section marker leads to."""
        raise NotImplementedError

    def _continues(self, c: str) -> str | None:
        """In AFTER, the state `c` begins when it continues the section (None: it does not)."""
        return None

    def _reset_unit(self) -> None:
        """Forget the current unit's parsed parts."""

    def _end_unit(self, out: list[Segment]) -> None:
        """finish() in a dialect state: by default the unit is incomplete, so it is text."""
        self._release(out)

    # -- the protocol --------------------------------------------------------------------------

    def _reset(self) -> None:
        self._state = TEXT
        self._tail = ""  # unread text: a possible beginning of a marker
        self._section = ""  # kind of the marker that opened the current section
        self._pad = ""  # AFTER: whitespace (and separators) after a unit
        self._after_call = False  # the last unit became calls: the padding is markup
        self._trailers: tuple[Marker, ...] = ()  # end tokens that may still follow the calls
        self._clear_unit()

    def _clear_unit(self) -> None:
        self._lead = ""  # padding in front of the unit: shown if it stays text, dropped if calls
        self._held: list[str] = []  # the unit as written
        self._size = 0
        self._reset_unit()

    def _idle_now(self) -> bool:
        return self._state == TEXT and not self._tail

    def feed(self, text: str) -> list[Segment]:
        if self._pass_through:
            return [Text(text)] if text else []
        out: list[Segment] = []
        buf, self._tail = self._tail + text, ""
        self._run(buf, out, final=False)
        idle = self._idle_now()
        if idle != self.idle:
            self._report(idle)
        return out

    def finish(self) -> list[Segment]:
        out: list[Segment] = []
        if not self._pass_through:
            tail, self._tail = self._tail, ""
            self._run(tail, out, final=True)  # with `final`, no handler keeps a tail
            if self._state not in (TEXT, AFTER):
                self._end_unit(out)
            if self._state == AFTER and not self._after_call:
                self._emit(out, self._pad)
        self._reset()
        idle = self._idle_now()
        if idle != self.idle:
            self._report(idle)
        return out

    def _run(self, buf: str, out: list[Segment], final: bool) -> None:
        pos: int | None = 0
        while pos is not None:
            pos = self._handlers[self._state](buf, pos, out, final)

    # -- TEXT and AFTER ------------------------------------------------------------------------

    def _scan_text(self, buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
        """TEXT: pass text on; stop at a marker, or hold what may still become one."""
        match = find_marker(buf, pos, self.markers, final)
        if match is None:
            self._emit(out, buf[pos:])
            return None
        self._emit(out, buf[pos : match.pos])
        if match.marker is None:
            self._tail = buf[match.pos :]
            return None
        self._open(match.marker)
        return match.pos + len(match.marker.text)

    def _open(self, marker: Marker) -> None:
        self._section = marker.kind
        self._take(marker.text)
        self._state = self._opens(marker)

    def _scan_after(self, buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
        """AFTER: hold whitespace; what follows it decides whose it is."""
        n = len(buf)
        seps = self.separators.get(self._section, "")
        end = pos
        while end < n and (buf[end].isspace() or buf[end] in seps):
            end += 1
        self._pad += buf[pos:end]
        if not self._after_call and self._pad:
            # after a unit shown as text its padding is text whatever follows: send it now
            self._emit(out, self._pad)
            self._pad = ""
        if len(self._pad) > self._max_held:  # a flood of whitespace is not padding
            self._to_text(out)
            return end
        if end == n:
            return None
        if self._after_call and self._trailers:
            found = marker_at(buf, end, self._trailers)
            if found == PARTIAL:
                if final:  # an end token cut in half at the end is part of the markup
                    self._trailers = ()
                    return None
                self._tail = buf[end:]
                return None
            if isinstance(found, Marker):  # the end token of the calls: markup, not text
                self._trailers = ()
                return end + len(found.text)
        found = marker_at(buf, end, self.markers)
        if found == PARTIAL and not final:
            self._tail = buf[end:]
            return None
        if isinstance(found, Marker):
            self._begin_unit(out)
            self._open(found)
            return end + len(found.text)
        state = self._continues(buf[end])
        if state is not None:
            self._begin_unit(out)
            self._state = state
            return end
        self._to_text(out)
        return end

    def _begin_unit(self, out: list[Segment]) -> None:
        """A unit follows a unit: after calls the padding goes with it, else it is shown."""
        if self._after_call:
            self._lead = self._pad
        else:
            self._emit(out, self._pad)
        self._pad = ""
        self._trailers = ()

    def _to_text(self, out: list[Segment]) -> None:
        """Prose follows: the padding is given back in front of it."""
        self._emit(out, self._pad)
        self._pad = ""
        self._after_call = False
        self._trailers = ()
        self._state = TEXT

    # -- units ---------------------------------------------------------------------------------

    def _room(self, pos: int, n: int) -> int:
        """Where scanning must stop so that the cap falls at the same character however split."""
        return min(n, pos + max(0, self._max_held - self._size) + 1)

    def _take(self, text: str) -> None:
        if text:
            self._held.append(text)
            self._size += len(text)

    def _over_cap(self, out: list[Segment]) -> bool:
        if self._size > self._max_held:
            self._release(out)
            return True
        return False

    def _held_text(self) -> str:
        text = "".join(self._held)
        self._held = [text]
        return text

    def _verdict(self, calls: Calls | None, out: list[Segment], trailers: tuple[Marker, ...] = (), keep: int | None = None) -> None:
        """The unit is complete: its calls, or its text. `keep`: held text past it is padding."""
        held = self._held_text()
        pad = ""
        if keep is not None:
            held, pad = held[:keep], held[keep:]
        if calls:
            for name, arguments, model_id in calls:
                out.append(CallBegin(self._call_id(model_id), name))
                out.append(CallArgs(arguments))
                out.append(CallEnd())
            self._after_call = True
            self._trailers = trailers
        else:
            self._emit(out, self._lead + held)
            self._after_call = False
            self._trailers = ()
        self._clear_unit()
        self._pad = pad
        self._state = AFTER

    def _release(self, out: list[Segment], rest: str = "") -> None:
        """The unit is not a call: everything held goes out as text, nothing lost."""
        self._emit(out, self._lead + self._held_text() + rest)
        self._clear_unit()
        self._after_call = False
        self._trailers = ()
        self._state = TEXT

    def _scan_value(
        self,
        buf: str,
        pos: int,
        out: list[Segment],
        final: bool,
        scanner: JsonScanner,
        cut_by: tuple[Marker, ...],
        close: Callable[[list[Segment]], None],
    ) -> int | None:
        """Follow a value from where the last piece stopped; `close` it, or release it when one
        of `cut_by` appears outside its strings (the value was cut short; TEXT reads the marker).
        """
        limit = self._room(pos, len(buf))
        i = pos
        while True:
            j, what = scanner.scan(buf, i, limit, final)
            if what == CLOSED:
                self._take(buf[pos:j])
                close(out)
                return j
            if what == MORE:
                self._take(buf[pos:j])
                return j if self._over_cap(out) else None
            self._take(buf[pos:j])
            if what == WAIT:  # the scanner needs more text to read `buf[j:]`
                self._tail = buf[j:]
                return None
            found = marker_at(buf, j, cut_by)  # STOP: `buf[j]` may begin a marker
            if found == PARTIAL and not final:
                self._tail = buf[j:]
                return None
            if isinstance(found, Marker):
                self._release(out)
                return j
            scanner.take(buf[j])
            self._take(buf[j])
            pos = i = j + 1

    def _call_id(self, model_id: str | None) -> str:
        """The model's id when it is usable and not taken in this scope, else a minted one."""
        if model_id and _MODEL_ID.fullmatch(model_id) and not self._scope.id_taken(model_id):
            return self._scope.claim_id(model_id)
        return self._scope.mint_call_id()

    def _note(self, problem: str, detail: str) -> None:
        self._scope.note(problem, detail)

    @staticmethod
    def _emit(out: list[Segment], text: str) -> None:
        if text:
            out.append(Text(text))


# -- Mistral ----------------------------------------------------------------------------------


