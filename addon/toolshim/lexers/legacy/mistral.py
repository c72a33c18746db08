"""Mistral tool-call markup, after the `[TOOL_CALLS]` control token; the format depends on the
tokenizer version:

    v3 / v7   [TOOL_CALLS][{"name": "add", "arguments": {"a": 1}, "id": "abcDEF123"}]
    v11       [TOOL_CALLS]add[CALL_ID]abcDEF123[ARGS]{"a": 1}[TOOL_CALLS]mul[CALL_ID]…
    v13+      [TOOL_CALLS]add[ARGS]{"a": 1}mul[ARGS]{"b": 2}

Accepted as well: a SentencePiece `▁` or spaces after `[TOOL_CALLS]`, and `NAME{json}` with
`[ARGS]` gone (what vLLM's Mistral tokenizer leaves when it strips all control tokens but
`[TOOL_CALLS]`). There is no end marker: the model stops after its calls, so a call is complete
when its JSON value closes, and is judged then.

A *unit* is what one verdict decides: a JSON list of call objects, or one `NAME…{json}` call.
States (`_state`), and what moves between them:

    TEXT       --`[TOOL_CALLS]`-------------------------->  CALLS      (the token is held)
    CALLS      --whitespace, `▁`------------------------->  CALLS      (held)
    CALLS      --`[`------------------------------------->  LIST_OPEN
    LIST_OPEN  --whitespace, then `{`-------------------->  LIST       (a JSON list of objects is scanned)
    CALLS      --a name character------------------------>  NAME
    NAME       --`[CALL_ID]`----------------------------->  CALL_ID    (the model's id follows)
    NAME       --`[ARGS]`-------------------------------->  ARGS_OPEN
    NAME       --`{`------------------------------------->  ARGS       (`[ARGS]` stripped upstream)
    CALL_ID    --`[ARGS]`-------------------------------->  ARGS_OPEN
    ARGS_OPEN  --whitespace------------------------------>  ARGS_OPEN  (held)
    ARGS_OPEN  --`{`------------------------------------->  ARGS       (a JSON object is scanned)
    LIST, ARGS --the value closes------------------------>  AFTER      (verdict on the unit)
    AFTER      --whitespace------------------------------>  AFTER      (held, see below)
    AFTER      --`[TOOL_CALLS]`-------------------------->  CALLS      (v11: the next call)
    AFTER      --a name character------------------------>  NAME       (v13+: the next call)
    AFTER      --anything else--------------------------->  TEXT
    CALLS, LIST_OPEN, NAME, CALL_ID, ARGS_OPEN
               --anything else--------------------------->  TEXT       (not a call: released at once)
    LIST, ARGS --`[TOOL_CALLS]` outside strings---------->  TEXT       (cut short: released, TEXT reads the token)
    any state but TEXT, AFTER --more than `max_held` held-> TEXT       (released as text)
    finish: a unit still open is incomplete (its value never closed): text.

`[THINK]…[/THINK]` (v13+ reasoning) is not handled here: it passes as text.

The machinery shared with the Llama dialects (`UnitLexer`, `JsonScanner`, `judge_entries`) is in
`units.py`.
"""

from __future__ import annotations

from typing import Callable

from ...calls import CallScope
from .base import Marker, Segment
from .units import (
    MAX_NAME,
    MAX_ID,
    PARTIAL,
    JsonScanner,
    UnitLexer,
    judge_call,
    judge_entries,
    marker_at,
    _NAME_CHAR,
    _NAME_RUN,
    _ID_RUN,
    _WS,
    _CALLS_PAD,
)

CALLS, LIST_OPEN, LIST, NAME, CALL_ID, ARGS_OPEN, ARGS = "calls", "list_open", "list", "name", "call_id", "args_open", "args"

TOOL_CALLS = Marker("[TOOL_CALLS]", "tool_calls")
_ARGS = Marker("[ARGS]", "args")
_CALL_ID = Marker("[CALL_ID]", "call_id")
_INNER = (_ARGS, _CALL_ID, TOOL_CALLS)

class MistralLexer(UnitLexer):
    """Incremental lexer for Mistral's `[TOOL_CALLS]` markup (see the module docstring)."""

    markers = (TOOL_CALLS,)

    def __init__(self, scope: CallScope, *, max_held: int = 1 << 20) -> None:
        self._scanner = JsonScanner(stops="[")  # a `[` may begin `[TOOL_CALLS]`
        super().__init__(scope, max_held=max_held)

    def _dialect_handlers(self) -> dict[str, Callable[[str, int, list[Segment], bool], int | None]]:
        return {
            CALLS: self._scan_calls,
            LIST_OPEN: self._scan_list_open,
            NAME: self._scan_name,
            CALL_ID: self._scan_call_id,
            ARGS_OPEN: self._scan_args_open,
            LIST: self._scan_json,
            ARGS: self._scan_json,
        }

    def _opens(self, marker: Marker) -> str:
        return CALLS

    def _continues(self, c: str) -> str | None:
        # v13+ writes the next call's name right after the previous arguments.
        return NAME if _NAME_CHAR.match(c) else None

    def _reset_unit(self) -> None:
        self._name = ""
        self._model_id: str | None = None
        self._value_at = 0  # where the JSON value begins in the held text
        self._scanner.reset()

    def _scan_calls(self, buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
        """CALLS: spaces and `▁` after the token are held; the next character decides."""
        end = _CALLS_PAD.match(buf, pos, self._room(pos, len(buf))).end()
        self._take(buf[pos:end])
        if self._over_cap(out):
            return end
        if end == len(buf):
            return None
        c = buf[end]
        if c == "[":
            found = marker_at(buf, end, (TOOL_CALLS,))
            if found == PARTIAL and not final:
                self._tail = buf[end:]
                return None
            if found == TOOL_CALLS:  # the token twice: the first is text, TEXT reads the second
                self._release(out)
                return end
            self._value_at = self._size
            self._take("[")
            self._scanner.take("[")
            self._state = LIST_OPEN
            self._over_cap(out)
            return end + 1
        if _NAME_CHAR.match(c):
            self._state = NAME
        else:  # e.g. the token quoted in prose: shown at once, so the prose streams live
            self._release(out)
        return end

    def _scan_list_open(self, buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
        """LIST_OPEN: a list of calls holds objects; `[TOOL_CALLS] [see below]` is prose, shown at once."""
        end = _WS.match(buf, pos, self._room(pos, len(buf))).end()
        self._take(buf[pos:end])
        if self._over_cap(out):
            return end
        if end == len(buf):
            return None
        if buf[end] == "{":
            self._state = LIST
        else:
            self._release(out)
        return end

    def _scan_name(self, buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
        """NAME: name characters, then `[CALL_ID]`, `[ARGS]` or `{`."""
        n = len(buf)
        limit = min(self._room(pos, n), pos + MAX_NAME - len(self._name) + 1)
        end = _NAME_RUN.match(buf, pos, limit).end()
        self._take(buf[pos:end])
        self._name += buf[pos:end]
        if self._over_cap(out):
            return end
        if len(self._name) > MAX_NAME:
            self._release(out)
            return end
        if end == n:
            return None
        if buf[end] == "{":
            self._state = ARGS
            self._value_at = self._size
            return end
        return self._inner_marker(buf, end, out, final, {_ARGS: ARGS_OPEN, _CALL_ID: CALL_ID})

    def _scan_call_id(self, buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
        """CALL_ID: the model's id, then `[ARGS]`."""
        n = len(buf)
        so_far = len(self._model_id or "")
        limit = min(self._room(pos, n), pos + MAX_ID - so_far + 1)
        end = _ID_RUN.match(buf, pos, limit).end()
        self._take(buf[pos:end])
        self._model_id = (self._model_id or "") + buf[pos:end]
        if self._over_cap(out):
            return end
        if len(self._model_id) > MAX_ID:
            self._release(out)
            return end
        if end == n:
            return None
        return self._inner_marker(buf, end, out, final, {_ARGS: ARGS_OPEN})

    def _inner_marker(self, buf: str, i: int, out: list[Segment], final: bool, moves: dict[Marker, str]) -> int | None:
        """At `buf[i]`: one of the markers in `moves` goes on; anything else is not a call."""
        found = marker_at(buf, i, _INNER)
        if found == PARTIAL and not final:
            self._tail = buf[i:]
            return None
        if isinstance(found, Marker) and found in moves:
            self._take(found.text)
            if self._over_cap(out):
                return i + len(found.text)
            self._state = moves[found]
            return i + len(found.text)
        self._release(out)  # a `[TOOL_CALLS]` here is read again by TEXT
        return i

    def _scan_args_open(self, buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
        """ARGS_OPEN: whitespace after `[ARGS]` is held; the arguments must be an object."""
        end = _WS.match(buf, pos, self._room(pos, len(buf))).end()
        self._take(buf[pos:end])
        if self._over_cap(out):
            return end
        if end == len(buf):
            return None
        if buf[end] == "{":
            self._state = ARGS
            self._value_at = self._size
        else:
            self._release(out)
        return end

    def _scan_json(self, buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
        """LIST, ARGS: follow the value to its close; a `[TOOL_CALLS]` outside strings cuts it."""
        return self._scan_value(buf, pos, out, final, self._scanner, (TOOL_CALLS,), self._close_unit)

    def _close_unit(self, out: list[Segment]) -> None:
        value = self._held_text()[self._value_at :]
        if self._state == LIST:
            calls = judge_entries(self.judge, value)
        else:
            calls = judge_call(self.judge, self._name, value, self._model_id)
        self._verdict(calls, out)

