"""Hermes / Qwen2.5 / Qwen3 / QwQ tool-call markup: a JSON value between sentinel tags.

    Let me check.<tool_call>
    {"name": "get_weather", "arguments": {"city": "NYC"}}
    </tool_call>

The value is a call object `{"name": str, "arguments": object | JSON text of an object}`
("parameters" is accepted for "arguments", missing arguments mean `{}`), or a list of them.
Whether a closed block becomes calls is decided by `ToolCallJudge` (below), which knows nothing
of streaming so that non-streaming bodies and tool emulation can reuse it.

States (`_state`), and what moves between them:

    TEXT  --`<tool_call>`---------------------------------->  OPEN  (the tag is held)
    OPEN  --whitespace--------------------------------------->  OPEN  (held with the tag)
    OPEN  --`{` or `[`--------------------------------------->  JSON  (the value is scanned)
    OPEN  --any other character------------------------------>  TEXT  (not a call: released at once)
    JSON  --`</tool_call>` outside strings------------------->  TEXT  (verdict on the block)
    JSON  --`<tool_call>` outside strings, value complete---->  OPEN  (verdict as if closed; next block)
    JSON  --`<tool_call>` outside strings, value incomplete-->  OPEN  (the block is released as text)
    OPEN, JSON  --more than `max_held` characters held------->  TEXT  (released as text)
    finish: JSON with a complete value gets its verdict as if closed; anything else held is text.

"Complete" means the top-level value has closed and only whitespace follows it; a value
followed by anything else waits for its end tag (the verdict may still repair a stray `}`), and
without one it is text. In JSON the scanner tracks strings, escapes and nesting depth, resuming
where it stopped: every character of a block is examined once, however the block is split, plus
a look-ahead of at most 12 characters at a `<` outside strings (`examined` counts them all).

Whitespace ("padding", rule of thumb: it belongs to the markup it touches):

* Whitespace right before `<tool_call>` that is still unsent when the tag is read belongs to
  the block. Unsent means it came in the same piece, or it was held: after a call, or in front
  of a possible beginning of the tag (`... <tool`). Whitespace sent earlier stays sent.
* After a block that became calls, whitespace is held: prose that follows gets it back in
  front (it separates the prose from what came before), a next block takes it as its padding,
  and the end of the text drops it.
* A block that becomes calls drops its padding; a block that stays text shows it exactly.

Text outside blocks, and every block that does not become calls, reaches the output as Text,
in order, character for character. Without declared tools the lexer passes everything through
at once. Known cost of the JSON-aware end: a block whose strings do not balance (a missing
closing quote) is held until an end tag is seen outside strings, the `max_held` cap, or
`finish()`, and is then shown as text.
"""

from __future__ import annotations

import re

from ..calls import CallScope
from ..judge import ToolCallJudge
from .base import CallArgs, CallBegin, CallEnd, Marker, Segment, Text, TextPieces, excerpt, find_marker

OPEN_TAG = "<tool_call>"
END_TAG = "</tool_call>"
_MARKERS = (Marker(OPEN_TAG, "call_begin"),)

TEXT, OPEN, JSON = "text", "open", "json"

_LEADING_WS = re.compile(r"\s*")
_STRING_STOP = re.compile(r'["\\]')  # inside a JSON string only these matter
_VALUE_STOP = re.compile(r'[{}\[\]"<]')  # outside strings: nesting, strings, and tags
_LONG_DIGITS = re.compile(r"\d{19}")  # a number orjson might read as a float (see _loads)
# A block whose own quotes are escaped (`{\"name\": …`) was written inside a JSON string: the
# model is quoting markup in prose, not calling. json_repair would unescape it into a call.
_QUOTED_BLOCK = re.compile(r'\s*(?:\[\s*)?\{\s*\\"')


# -- the lexer --------------------------------------------------------------------------------


class HermesLexer:
    """Incremental lexer for one channel of one choice (see the module docstring)."""

    def __init__(self, scope: CallScope, *, max_held: int = 1 << 20) -> None:
        self._scope = scope
        self.judge = ToolCallJudge(scope)
        self._max_held = max_held
        # Without declared tools no block can be a call: nothing is held, nothing is scanned.
        self._pass_through = not scope.tools
        self.examined = 0  # characters of blocks examined by the scanner, over the lexer's life
        self._reset()

    def _reset(self) -> None:
        self._state = TEXT
        self._tail = ""  # unread text: a possible beginning of a tag
        self._pad = ""  # whitespace held in TEXT (see the module docstring)
        self._after_call = False  # the last thing out was a call: whitespace is held
        self._reset_block()

    def _reset_block(self) -> None:
        self._block_pad = ""  # the padding in front of the current block's tag
        self._content = TextPieces()  # the block after its tag, as scanned
        self._size = 0  # characters held by the block, tag included
        self._depth = 0
        self._in_string = False
        self._escape = False  # the string's last character read was a backslash
        self._value_end = -1  # size at which the top-level value closed, -1 while it is open

    @property
    def idle(self) -> bool:
        return self._state == TEXT and not self._tail and not self._pad and not self._after_call

    def feed(self, text: str) -> list[Segment]:
        if self._pass_through:
            return [Text(text)] if text else []
        out: list[Segment] = []
        buf, self._tail = self._tail + text, ""
        self._run(buf, out, final=False)
        return out

    def finish(self) -> list[Segment]:
        out: list[Segment] = []
        tail, self._tail = self._tail, ""
        if self._state == TEXT:
            self._run(tail, out, final=True)
        elif self._state == JSON and self._complete():
            # vLLM accepts a block left open until the end. A tag cut in half at the end is
            # part of the markup: it goes with the block.
            self._close_block(out, closing="", implied=True)
            if not self._after_call:
                self._emit(out, self._pad + tail)
                self._pad = ""
        else:  # OPEN, or a value cut short: nothing was a call, nothing is lost
            self._release_block(out, tail)
        if not self._after_call:
            self._emit(out, self._pad)
        self._reset()
        return out

    # -- scanning ------------------------------------------------------------------------------

    def _run(self, buf: str, out: list[Segment], final: bool) -> None:
        pos: int | None = 0
        while pos is not None:
            if self._state == TEXT:
                pos = self._scan_text(buf, pos, out, final)
            elif self._state == OPEN:
                pos = self._scan_open(buf, pos, out)
            else:
                pos = self._scan_json(buf, pos, out, final)

    def _scan_text(self, buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
        """TEXT: pass text on; stop at the tag, or hold what may still become one."""
        match = find_marker(buf, pos, _MARKERS, final)
        if match is None:
            self._take_text(buf[pos:], out, before_tag=False)
            return None
        self._take_text(buf[pos : match.pos], out, before_tag=True)
        if match.marker is None:
            self._tail = buf[match.pos :]
            return None
        self._state = OPEN
        self._block_pad, self._pad = self._pad, ""
        self._size = len(OPEN_TAG)
        return match.pos + len(OPEN_TAG)

    def _take_text(self, text: str, out: list[Segment], before_tag: bool) -> None:
        """Text outside blocks; `before_tag`: a tag (or a possible one) follows it."""
        if before_tag:
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

    def _scan_open(self, buf: str, pos: int, out: list[Segment]) -> int | None:
        """OPEN: whitespace after the tag is held; the next character decides."""
        limit = min(len(buf), pos + max(0, self._max_held - self._size) + 1)
        end = _LEADING_WS.match(buf, pos, limit).end()
        self._take_block(buf, pos, end)
        if self._size > self._max_held:
            self._release_block(out)
            return end
        if end == len(buf):
            return None
        if buf[end] in "{[":
            self._state = JSON
            return end
        # A model explaining the syntax: show the tag now, so that its prose streams live.
        self._release_block(out)
        return end

    def _scan_json(self, buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
        """JSON: follow strings, escapes and depth from where the last piece stopped."""
        n = len(buf)
        # Scanning past `limit` would hold more than `max_held`: the cap falls at the same
        # character of the block however it was split.
        limit = min(n, pos + max(0, self._max_held - self._size) + 1)
        i = pos
        while i < limit:
            if self._in_string:
                if self._escape:  # the escaped character, whatever it is
                    self._escape = False
                    self.examined += 1
                    i += 1
                    continue
                stop = _STRING_STOP.search(buf, i, limit)
                if stop is None:
                    self.examined += limit - i
                    i = limit
                    break
                j = stop.start()
                self.examined += j + 1 - i
                if buf[j] == '"':
                    self._in_string = False
                else:
                    self._escape = True
                i = j + 1
                continue
            stop = _VALUE_STOP.search(buf, i, limit)
            if stop is None:
                self.examined += limit - i
                i = limit
                break
            j = stop.start()
            self.examined += j + 1 - i
            c = buf[j]
            if c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                if self._depth:  # a stray closer after the value is left to the verdict
                    self._depth -= 1
                    if self._depth == 0 and self._value_end < 0:
                        self._value_end = self._size + j + 1 - pos
            else:  # "<" outside strings: maybe a tag
                self.examined += min(len(END_TAG), n - j) - 1
                if buf.startswith(END_TAG, j):
                    self._take_block(buf, pos, j)
                    self._close_block(out, closing=END_TAG, implied=False)
                    return j + len(END_TAG)
                if buf.startswith(OPEN_TAG, j):
                    # The end tag is missing: the next block begins (TEXT reads its tag).
                    self._take_block(buf, pos, j)
                    if self._complete():
                        self._close_block(out, closing="", implied=True)
                    else:
                        self._release_block(out, implied=True)
                    return j
                if not final and n - j < len(END_TAG) and (END_TAG.startswith(buf[j:]) or OPEN_TAG.startswith(buf[j:])):
                    self._take_block(buf, pos, j)
                    self._tail = buf[j:]
                    return None
            i = j + 1
        self._take_block(buf, pos, i)
        if self._size > self._max_held:
            self._release_block(out)
            return i
        return None

    def _take_block(self, buf: str, start: int, end: int) -> None:
        if end > start:
            self._content.append(buf[start:end])
            self._size += end - start

    def _complete(self) -> bool:
        """The top-level value has closed and only whitespace follows it."""
        if self._value_end < 0:
            return False
        content = self._content.text()
        return not content[self._value_end - len(OPEN_TAG) :].strip()

    # -- leaving a block -----------------------------------------------------------------------

    def _close_block(self, out: list[Segment], closing: str, implied: bool) -> None:
        """The block ended (by `closing`, or `implied` by what follows): calls, or text."""
        content = self._content.text()
        trailing = ""
        if implied:  # whitespace after the value pads what comes next
            body = content.rstrip()
            content, trailing = body, content[len(body) :]
        calls = self.judge.verdict(content)
        if calls:
            for call in calls:
                out.append(CallBegin(self._scope.mint_call_id(), call.name))
                out.append(CallArgs(call.arguments))
                out.append(CallEnd())
            self._after_call = True
        else:
            self._emit(out, self._block_pad + OPEN_TAG + content + closing)
            self._after_call = False
        self._state = TEXT
        self._reset_block()
        self._pad = trailing

    def _release_block(self, out: list[Segment], rest: str = "", implied: bool = False) -> None:
        """The block is not a call: everything held goes out as text, nothing lost."""
        content = self._content.text()
        trailing = ""
        if implied:
            body = content.rstrip()
            content, trailing = body, content[len(body) :]
        self._emit(out, self._block_pad + OPEN_TAG + content + rest)
        self._after_call = False
        self._state = TEXT
        self._reset_block()
        self._pad = trailing

    @staticmethod
    def _emit(out: list[Segment], text: str) -> None:
        if text:
            out.append(Text(text))
