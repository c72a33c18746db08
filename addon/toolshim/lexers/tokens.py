"""What the special-token dialects (Kimi, DeepSeek, Harmony) share: a state machine over markers.

Each state looks for its own markers (`_markers`); the text between them goes to `_take`, each
marker to `_on_marker`. Only a possible beginning of a marker is held unread. Shared services:
whitespace held until what follows says whose it is (`_hold`, `_take_ws`, and the lead policy
of TEXT: KEEP it, HOLD it for the prose that follows, DROP it), live arguments (`_args_text`:
no whitespace at either end, trailing whitespace held until more arguments come), markup held
as written (`_raw_add`) and held calls judged (`_judged`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ..calls import CallScope
from ..judge import ToolCallJudge
from ..schema import compact_json
from .base import CallArgs, CallBegin, CallEnd, Marker, Reporting, Segment, Text, find_marker, is_marker_fragment

TEXT = "text"
KEEP, HOLD, DROP = "keep", "hold", "drop"  # what happens to whitespace at the start of TEXT
_NOT_SPACE = re.compile(r"\S")


class TokenLexer(Reporting):
    """The machinery of one channel's special-token lexer; subclasses give the states."""

    # States read character by character rather than marker by marker: state -> reader(buf, pos,
    # out), which returns where reading goes on, or None (everything was read).
    _readers: dict[str, Callable[[str, int, list[Segment]], int | None]] = {}

    def __init__(self, scope: CallScope, *, max_held: int = 1 << 20) -> None:
        self._scope = scope
        self.judge = ToolCallJudge(scope)
        self._max_held = max_held

    def _reset_tokens(self) -> None:
        self._state = TEXT
        self._buf = ""  # unread text: at most a possible beginning of a marker
        self._lead = KEEP
        # Whitespace held: the start of a run that may yet prove to be padding, or the end of
        # live arguments. Kept as parts so that a flood of spaces in small pieces costs linear
        # time; over max_held it is released.
        self._ws: list[str] = []
        self._ws_len = 0
        self._raw: list[str] = []  # the markup of the current call or message, as written
        self._raw_len = 0
        self._args_sent = False

    def _markers(self) -> tuple[Marker, ...]:
        raise NotImplementedError

    def _take(self, text: str, out: list[Segment]) -> None:
        raise NotImplementedError

    def _on_marker(self, marker: Marker, out: list[Segment]) -> None:
        raise NotImplementedError

    def _idle_now(self) -> bool:
        return self._state == TEXT and not self._buf and not self._ws and self._lead == KEEP

    def _report_idle(self) -> None:
        idle = self._idle_now()
        if idle != self.idle:  # reported on change only
            self._report(idle)

    def feed(self, text: str) -> list[Segment]:
        self._buf += text
        out = self._run(final=False)
        idle = self._state == TEXT and not self._buf and not self._ws and self._lead == KEEP  # `_idle_now`, inline
        if idle != self.idle:
            self._report(idle)
        return out

    def _run(self, final: bool) -> list[Segment]:
        out: list[Segment] = []
        buf, pos = self._buf, 0
        while True:
            state = self._state
            reader = self._readers.get(state)
            if reader is not None:
                stopped = reader(buf, pos, out)
                if stopped is None:
                    pos = len(buf)
                    break
                pos = stopped
                continue
            match = find_marker(buf, pos, self._markers(), final)
            end = len(buf) if match is None else match.pos
            if end > pos:
                self._take(buf[pos:end], out)
                pos = end
                if self._state != state:
                    continue  # a cap released the call: what follows is read with the new state's markers
            if match is None or match.marker is None:
                break
            pos += len(match.marker.text)
            self._on_marker(match.marker, out)
        self._buf = buf[pos:]
        return out

    def _cut_at_end(self, markers: tuple[Marker, ...]) -> tuple[str, str]:
        """finish(): the unread text, and the part of it that is a marker cut in half at the end
        inside markup (markup, not text)."""
        cut, self._buf = self._buf, ""
        if self._state != TEXT and is_marker_fragment(cut, markers):
            return "", cut
        return cut, ""

    # -- whitespace ----------------------------------------------------------------------------

    def _hold(self, ws: str) -> bool:
        """Hold whitespace; True when more than max_held is held (the caller releases it)."""
        self._ws.append(ws)
        self._ws_len += len(ws)
        return self._ws_len > self._max_held

    def _take_ws(self) -> str:
        ws = "".join(self._ws)
        self._ws = []
        self._ws_len = 0
        return ws

    def _lead_text(self, text: str, out: list[Segment]) -> None:
        """Text in TEXT, after the lead policy: HOLD gives held whitespace back to the prose that
        follows (whitespace alone stays held); DROP starts the text at its first non-space."""
        if self._lead == KEEP:
            if text:
                out.append(Text(text))
            return
        start = _NOT_SPACE.search(text)
        if start is None:  # whitespace only, so far
            if self._lead == HOLD and self._hold(text):
                self._lead = KEEP  # a flood of whitespace is not padding
                out.append(Text(self._take_ws()))
            return
        text = self._take_ws() + text if self._lead == HOLD else text[start.start() :]
        self._lead = KEEP
        out.append(Text(text))

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
        """The live call ends (`{}` when no argument came)."""
        if not self._args_sent:
            out.append(CallArgs("{}"))
        out.append(CallEnd())

    # -- held markup ---------------------------------------------------------------------------

    def _raw_add(self, text: str) -> None:
        self._raw.append(text)
        self._raw_len += len(text)

    def _raw_text(self, start: int = 0) -> str:
        return "".join(self._raw[start:])

    def _judged(self, out: list[Segment], name: str, arguments: str) -> bool:
        """Ask the judge about a held call; emit it if it is one."""
        calls = self.judge.verdict(compact_json({"name": name, "arguments": arguments}))
        for call in calls or ():
            out.append(CallBegin(self._scope.mint_call_id(), call.name))
            out.append(CallArgs(call.arguments))
            out.append(CallEnd())
        return bool(calls)

    def _show(self, out: list[Segment], text: str) -> None:
        if text:
            out.append(Text(text))
