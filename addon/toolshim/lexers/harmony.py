"""gpt-oss (Harmony) messages left in the text: reasoning, content and tool calls.

    <|channel|>analysis<|message|>reasoning…<|end|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{json}<|call|>
    <|start|>assistant<|channel|>final<|message|>the answer<|return|>

A message is a header (role, `<|channel|>` and its name, an optional recipient `to=…`, an
optional `<|constrain|>json`), `<|message|>`, a body, and `<|end|>`, `<|call|>` or `<|return|>`
(stop tokens, often missing: a message also ends where the next begins, or at the end). The
first message has no `<|start|>assistant` (the prompt ended with it), so with `lead_recipient`
(set for models named gpt-oss) the very start of the text may be the rest of that role header,
` to=functions.NAME<|channel|>…`: held until that is decided, at most MAX_HEADER long.

* `analysis` is reasoning: its body streams live as `ReasoningText`.
* A recipient `to=functions.NAME` (in the channel or the role header) on any channel (vLLM's
  Harmony parsing) makes the message a call, as tokens.py says; any other recipient (undeclared,
  or a built-in such as `browser.search`) keeps the whole message as text, exactly as written.
* `final`, `commentary` without a recipient (a preamble for the user) and other channels are
  content: the body streams live as `Text`, after one `ReasoningEnd` before the first such
  body (a reasoning channel carrying Harmony text puts the answer in content).
* The header is markup, dropped once the message is recognised. Whitespace after a message
  that was markup (any but VISIBLE) and `finish()` follow tokens.py; a cut-off body stays.

States (`_state`), and what moves between them:

    TEXT   --`<|start|>` or `<|channel|>`--> HEADER --`<|channel|>`, `<|constrain|>`--> HEADER
    HEADER --`<|message|>`--> ARGS, HELD or VISIBLE (a recipient, as above; VISIBLE also when
           not admitted), REASONING (channel analysis), CONTENT (anything else)
    HEADER --end token, or over MAX_HEADER--> TEXT (the header is shown as text)
    REASONING, CONTENT, ARGS, HELD, VISIBLE --end token, or (an implied end) `<|start|>` or
           `<|channel|>`--> TEXT or HEADER;  HELD --more than max_held held--> VISIBLE

Markup whose special tokens were stripped (`commentary to=functions.x json{…}`, from upstreams
decoding with `skip_special_tokens`) is not read: it is a guess, and prose quoting the syntax
would become a call.
"""

from __future__ import annotations

import re

from ..calls import CallScope
from .base import Marker, ReasoningEnd, ReasoningText, Segment, Text
from .tokens import ARGS, HELD, HOLD, KEEP, MAX_HEADER, TEXT, VISIBLE, TokenLexer

START, END, MESSAGE, CHANNEL, CONSTRAIN = "start", "end", "message", "channel", "constrain"

_START = Marker("<|start|>", START)
_MESSAGE = Marker("<|message|>", MESSAGE)
_CHANNEL = Marker("<|channel|>", CHANNEL)
_CONSTRAIN = Marker("<|constrain|>", CONSTRAIN)
_END_TOKENS = (Marker("<|end|>", END), Marker("<|return|>", END), Marker("<|call|>", END))  # the stop tokens
_ALL = (_START, _MESSAGE, _CHANNEL, _CONSTRAIN) + _END_TOKENS

_TEXT_MARKERS = (_START, _CHANNEL)
_BODY_MARKERS = _END_TOKENS + _TEXT_MARKERS

HEADER, REASONING, CONTENT = "header", "reasoning", "content"
ROLE_PART, CHANNEL_PART, CONSTRAIN_PART = "role", "channel", "constrain"

_RECIPIENT = re.compile(r"(?:^|\s)to=(\S+)")
# The start of an output that may be the rest of a role header: whitespace, `to=`, a recipient,
# whitespace (group 1: the whole `to=RECIPIENT`, once complete). Matches any prefix of it too.
_LEAD = re.compile(r"\s*(?:(to=[^\s<]+)\s*|t(?:o(?:=[^\s<]*)?)?$)?")


class HarmonyLexer(TokenLexer):
    _all_markers = _ALL

    def __init__(self, scope: CallScope, *, max_held: int = 1 << 20, lead_recipient: bool = False) -> None:
        super().__init__(scope, max_held=max_held)
        self._lead_recipient = lead_recipient
        self._reset()
        if self._at_start:
            self._report(False)  # the start must be read, even with no marker in it

    def _reset(self) -> None:
        super()._reset()
        self._content_begun = False  # ReasoningEnd has been emitted
        self._at_start = self._lead_recipient  # the very start may be the rest of a role header

    def _reset_call(self) -> None:
        super()._reset_call()
        self._parts = {ROLE_PART: "", CHANNEL_PART: "", CONSTRAIN_PART: ""}
        self._part = ROLE_PART

    def _idle_now(self) -> bool:
        return super()._idle_now() and not self._at_start

    def _finish(self, fragment: str, out: list[Segment]) -> None:
        if self._state in (ARGS, HELD, VISIBLE):
            self._close_message(out, "", rest=fragment)
        elif self._state == HEADER:  # cut off before it was complete
            self._show(out, self._raw_text() + fragment)
        # REASONING, CONTENT: only the marker fragment goes.

    def _markers(self) -> tuple[Marker, ...]:
        if self._state == TEXT:
            return _TEXT_MARKERS
        return _ALL if self._state == HEADER else _BODY_MARKERS

    def _run(self, final: bool) -> list[Segment]:
        if self._at_start:
            pos = self._read_lead(self._buf)
            if pos is None:
                return []  # it may still be a role header: more text decides
            self._buf = self._buf[pos:]
        return super()._run(final)

    def _read_lead(self, buf: str) -> int | None:
        """The very start (`lead_recipient`: the rest of a role header, see the module docstring):
        where reading goes on (past `<|channel|>` when it is one), or None: more text decides."""
        found = _LEAD.match(buf)
        rest = buf[found.end() :]
        if found.group(1) and rest.startswith(_CHANNEL.text):
            self._at_start = False
            self._open(_CHANNEL, found.group())  # the role header's rest, written before the channel
            self._parts[ROLE_PART] = found.group()
            self._header = found.group()
            return found.end() + len(_CHANNEL.text)
        if (found.end() == len(buf) or (found.group(1) and _CHANNEL.text.startswith(rest))) and len(buf) <= MAX_HEADER:
            return None
        self._at_start = False  # not a role header: read as any text
        return 0

    def _take(self, text: str, out: list[Segment]) -> None:
        if not text:
            return
        state = self._state
        if state == TEXT:
            self._lead_text(text, out)  # held whitespace separates this prose from what came before
        elif state == REASONING:
            out.append(ReasoningText(text))
        elif state in (CONTENT, VISIBLE):
            out.append(Text(text))
        elif state == ARGS:
            self._args_text(text, out)
        elif state == HEADER:
            self._parts[self._part] += text
            self._markup_add(text, out, TEXT, header=True)
        else:  # HELD
            self._markup_add(text, out)

    def _on_marker(self, marker: Marker, out: list[Segment]) -> None:
        kind, state = marker.kind, self._state
        padding = self._take_ws()  # whitespace after a message, or after live arguments
        if state == TEXT:
            self._lead = KEEP
            self._open(marker, padding)
        elif state == HEADER:
            if kind == MESSAGE:
                self._raw_add(marker.text)
                self._open_body(out)
            elif kind in (CHANNEL, CONSTRAIN):
                self._raw_add(marker.text)
                self._part = CHANNEL_PART if kind == CHANNEL else CONSTRAIN_PART
                self._parts[self._part] = ""  # a second channel token: the last one counts
            elif kind == START:  # a header cut short by the next message: it stays text
                self._release(out, TEXT)
                self._open(marker, "")
            else:  # an end token before any `<|message|>`: not a message
                self._release(out, TEXT, marker.text)
        else:  # a body: REASONING, CONTENT, ARGS, HELD, VISIBLE
            self._close_message(out, closing=marker.text if kind == END else "")
            if kind in (START, CHANNEL):  # the next message begins without an end token
                self._open(marker, "")

    def _open(self, marker: Marker, padding: str) -> None:
        self._reset_call()
        self._raw_add(padding + marker.text)  # the padding is shown with the message if it stays text
        self._state = HEADER
        self._part = ROLE_PART if marker.kind == START else CHANNEL_PART

    def _open_body(self, out: list[Segment]) -> None:
        """`<|message|>`: the header says what the body is."""
        self._body_start = len(self._raw)
        recipient = _RECIPIENT.search(self._parts[ROLE_PART]) or _RECIPIENT.search(self._parts[CHANNEL_PART])
        if recipient is not None:
            self._state = self._begin(out, recipient.group(1).removeprefix("functions."), recipient.group(1))
        elif self._parts[CHANNEL_PART].split()[:1] == ["analysis"]:
            self._state = REASONING
        else:
            if not self._content_begun:
                out.append(ReasoningEnd())
                self._content_begun = True
            self._state = CONTENT

    def _close_message(self, out: list[Segment], closing: str, rest: str = "") -> None:
        """The body ends (by `closing`, or by what follows it)."""
        state = self._state
        self._lead = HOLD
        if state == ARGS:
            self._close_args(out)
        elif state == VISIBLE or (state == HELD and not self._judged(out, self._name, self._raw_text(self._body_start).strip())):
            self._show(out, self._raw_text() + rest + closing)  # as written (VISIBLE: the rest of it)
            self._lead = KEEP
        self._state = TEXT
        self._reset_call()

