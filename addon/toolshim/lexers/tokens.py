"""What the special-token dialects (Kimi, DeepSeek, Harmony) share: a state machine over markers.

Each state looks for its own markers (`_markers`); the text between them goes to `_take` in
whatever pieces it comes, each marker to `_on_marker`; only a possible beginning of a marker is
held unread (`_text_end` may leave more). The rules the three keep, stated here once:

* A header naming a declared non-strict tool, admitted, streams its call live; a strict tool's
  call is held and judged when it ends (`_begin`, `_judged`). A call that does not become one
  (undeclared, not admitted, strict failure, cut off, over `max_held`) is text as written
  (`_markup_add`, `_release`).
* Live arguments have no whitespace at either end: trailing whitespace is held until more
  arguments come (`_args_text`). Other whitespace is held until what follows says whose it is
  (`_hold`, `_take_ws`); the lead policy of TEXT: KEEP it, HOLD it for the prose that follows
  (as after markup: the next markup and the end drop it), DROP it (text starts at its first word).
* `finish()`: a marker cut in half inside markup is markup, dropped; a live call is closed (`{}`
  when no argument came), a held call is judged if complete, anything else held is text; the
  lexer is then as new.
"""

from __future__ import annotations

import re

from ..calls import UNKNOWN_NAME, CallScope
from ..judge import ToolCallJudge
from ..schema import compact_json
from .base import CallArgs, CallBegin, CallEnd, Marker, Match, Reporting, Segment, Text, excerpt, find_marker, is_marker_fragment

TEXT, ARGS, HELD, VISIBLE = "text", "args", "held", "visible"  # the states every dialect has
KEEP, HOLD, DROP = "keep", "hold", "drop"  # what happens to whitespace at the start of TEXT
MAX_HEADER = 256  # a call or message header longer than this is not a header: it stays text
THINK_END = Marker("</think>", "think_end")  # the reasoning's end, where a dialect reads it after calls
_NOT_SPACE = re.compile(r"\S")


class TokenLexer(Reporting):
    """One channel's special-token lexer; subclasses give the states (see the module docstring)."""

    _all_markers: tuple[Marker, ...] = ()  # every marker: a fragment of one at the end is markup

    def __init__(self, scope: CallScope, *, max_held: int = 1 << 20) -> None:
        self._scope = scope
        self.judge = ToolCallJudge(scope)
        self._max_held = max_held

    def _reset(self) -> None:
        self._state = TEXT
        self._buf = ""  # unread text: at most a possible beginning of a marker
        self._lead = KEEP
        # Whitespace held (padding, or the end of live arguments), in parts: a flood of spaces in
        # small pieces costs linear time; over max_held it is released.
        self._ws: list[str] = []
        self._ws_len = 0
        self._raw: list[str] = []  # the markup of the current call or message, as written
        self._reset_call()

    def _reset_call(self) -> None:
        self._raw.clear()
        self._raw_len = 0
        self._body_start = 0  # where its arguments begin in `_raw`
        self._name = ""  # a held call's tool
        self._header = ""  # the header as written: a call's name, a message's role and channel
        self._args_sent = False

    def _finish(self, fragment: str, out: list[Segment]) -> None:
        """The end: what is held is closed or shown (`fragment`: a marker cut in half, markup)."""

    def _idle_now(self) -> bool:
        return self._state == TEXT and not self._buf and not self._ws and self._lead == KEEP

    def finish(self) -> list[Segment]:
        """The end of the text (see the module docstring)."""
        out: list[Segment] = []
        fragment, self._buf = self._buf, ""
        if self._state == TEXT or not is_marker_fragment(fragment, self._all_markers):
            self._take(fragment, out)
            fragment = ""
        self._finish(fragment, out)
        self._reset()
        self._report_idle()
        return out

    def _run(self, final: bool) -> list[Segment]:
        out: list[Segment] = []
        buf, pos = self._buf, 0
        while True:
            state = self._state
            match = find_marker(buf, pos, self._markers(), final)
            end = self._text_end(buf, pos, match, final)
            if end > pos:
                self._take(buf[pos:end], out)
                pos = end
                if self._state != state:
                    continue  # a cap released the call: what follows is read with the new state's markers
            if match is None or match.marker is None:
                break
            pos = match.pos + len(match.marker.text)
            self._on_marker(match.marker, out)
        self._buf = buf[pos:]
        return out

    def _text_end(self, buf: str, pos: int, match: Match | None, final: bool) -> int:
        """Where the text before `match` ends (the rest up to it is left unread, or dropped before a marker)."""
        return len(buf) if match is None else match.pos

    def _hold(self, ws: str) -> bool:
        """Hold whitespace; True when more than max_held is held (the caller releases it)."""
        self._ws.append(ws)
        self._ws_len += len(ws)
        return self._ws_len > self._max_held

    def _take_ws(self) -> str:
        ws = "".join(self._ws)
        self._ws.clear()  # (one list for the lexer's life, as `_raw`: the collector counts each a stream holds)
        self._ws_len = 0
        return ws

    def _lead_text(self, text: str, out: list[Segment]) -> None:
        """Text in TEXT, after the lead policy (module docstring; whitespace alone stays held)."""
        if self._lead == KEEP:
            self._show(out, text)
            return
        start = _NOT_SPACE.search(text)
        if start is None:  # whitespace only, so far
            if self._lead == HOLD and self._hold(text):
                self._lead = KEEP  # a flood of whitespace is not padding
                self._show(out, self._take_ws())
            return
        text = self._take_ws() + text if self._lead == HOLD else text[start.start() :]
        self._lead = KEEP
        self._show(out, text)

    def _begin(self, out: list[Segment], name: str, written: str) -> str:
        """The header names `name` (`written` so): the call goes on in ARGS (live), HELD (for the
        judge) or VISIBLE (text), as the module docstring says."""
        spec = self._scope.tools.get(name)
        if spec is None:
            self._scope.note(UNKNOWN_NAME, f"{excerpt(written)} is not a declared tool")
        elif spec.strict:
            self._name = name
            return HELD
        elif self._scope.admit(name):
            out.append(CallBegin(self._scope.mint_call_id(), name))
            return ARGS
        self._release(out)
        return VISIBLE

    def _args_text(self, text: str, out: list[Segment]) -> None:
        """Live arguments: leading whitespace dropped, trailing whitespace held until more comes."""
        if not self._args_sent:
            text = text.lstrip()
        body = text.rstrip()
        if body:
            out.append(CallArgs(self._take_ws() + body))
            self._args_sent = True
        if len(body) < len(text) and self._hold(text[len(body) :]):
            out.append(CallArgs(self._take_ws()))  # a flood of whitespace inside the arguments

    def _close_args(self, out: list[Segment]) -> None:
        """The live call ends (`{}` when no argument came); whitespace held after it is dropped."""
        self._take_ws()
        if not self._args_sent:
            out.append(CallArgs("{}"))
        out.append(CallEnd())

    def _judged(self, out: list[Segment], name: str, arguments: str) -> bool:
        """Ask the judge about a held call; emit it if it is one."""
        calls = self.judge.verdict(compact_json({"name": name, "arguments": arguments}))
        for called, arguments, _ in calls or ():
            out.extend((CallBegin(self._scope.mint_call_id(), called), CallArgs(arguments), CallEnd()))
        return bool(calls)

    def _raw_add(self, text: str) -> None:
        self._raw.append(text)
        self._raw_len += len(text)

    def _raw_text(self, start: int = 0) -> str:
        return "".join(self._raw[start:])

    def _markup_add(self, text: str, out: list[Segment], then: str = VISIBLE, header: bool = False) -> None:
        """Markup held as written (`header`: a header's text, also kept in `_header`); more than
        max_held of it, or a header longer than MAX_HEADER (none, then), is released, then `then`."""
        self._raw_add(text)
        if header:
            self._header += text
        if (len(self._header) > MAX_HEADER) if header else self._raw_len > self._max_held:
            self._release(out, then)

    def _release(self, out: list[Segment], state: str = VISIBLE, closing: str = "") -> None:
        """The current call cannot become one: its markup so far is shown as written (`closing`
        after it), and reading goes on in `state`."""
        self._show(out, self._raw_text() + closing)
        self._reset_call()
        self._state = state

    def _show(self, out: list[Segment], text: str) -> None:
        if text:
            out.append(Text(text))
