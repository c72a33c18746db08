"""Tool-call markup of the XML-like dialects: Qwen3-Coder / Qwen3.5, GLM-4.5 to 4.7, MiniMax-M2.

    Qwen3-Coder, Qwen3.5 (`QwenXmlLexer`)    GLM-4.5 / 4.6 (`GlmLexer`)    MiniMax-M2 (`MiniMaxLexer`)
      <tool_call>                              <tool_call>get_weather         <minimax:tool_call>
      <function=get_weather>                   <arg_key>city</arg_key>        <invoke name="get_weather">
      <parameter=city>                         <arg_value>Oslo</arg_value>    <parameter name="city">Oslo</parameter>
      Oslo                                     </tool_call>                   </invoke>
      </parameter>                                                            </minimax:tool_call>
      </function>                            GLM-4.7 writes the same without
      </tool_call>                           the newlines; `<tool_call>NAME\n</tool_call>` is `{}`.

Accepted as well: Qwen's `<function=...>` without the `<tool_call>` wrapper, several functions in
one wrapper, a `</parameter>` left out (the next `<parameter=` opening a line, or `</function>`,
closes the value); several `<invoke>` in one MiniMax block; a wrapper left open when the next
block begins or the text ends after a complete function.

Values are raw text, typed by the tool's JSON Schema for that property (`coerce_value`); Qwen and
MiniMax values lose one leading and one trailing newline, GLM values are taken as written. The
arguments are compact JSON of the object built, keys in order of appearance.

Rules shared with the `<tool_call>` JSON dialect (hermes.py): text outside blocks streams live
(only a possible beginning of a marker is held); a block is held until it closes and then judged
as a whole: it becomes calls only when every name is a declared tool, strict tools' arguments
validate against their parameters (STRICT_FAILURE otherwise; non-strict: SCHEMA_MISMATCH, emitted
anyway) and `scope.admit_all` agrees; otherwise the block is shown as text exactly as written.
Whitespace follows hermes.py's padding rules: whitespace before a block that is unsent when the
block's marker is read, and whitespace between blocks that became calls, is dropped with them;
around text it is kept exactly. Without declared tools the lexers pass everything through.

Sharing `<tool_call>` (Hermes JSON, Qwen XML and GLM all open with it). Each lexer decides at the
first character after the tag and its whitespace, and when it is not its own it releases the tag
and what it held as Text at once, exactly as written, then reads on as text:

    Hermes (HermesLexer): `{` or `[`    Qwen: `<function=`    GLM: a name character
    (letter, digit, `_ . : / -`).

The three sets are disjoint, so in a `ChainLexer` each block reaches the lexer that owns it
intact, in any order, and a lexer never holds another dialect's block longer than its tag plus
whitespace. The recommended order still puts HermesLexer first: the XML lexers do not follow
JSON strings, and a JSON string of a Hermes block could hold markup that looks like an XML call
(the reverse, a Qwen value holding a whole Hermes block, is the same rare hazard the other way).

Qwen and MiniMax (`_ElementLexer`), states (`_state`) and what moves between them:

    TEXT   --wrapper tag (`<tool_call>`, `<minimax:tool_call>`)-->  WRAP
    TEXT   --`<function=` (Qwen only: no wrapper, "bare")------->  NAME (of the function)
    WRAP   --whitespace-->  WRAP;  --function tag-->  NAME;  --wrapper end, calls made-->  TEXT (verdict)
    WRAP   --next wrapper tag, calls made-->  TEXT (verdict as if closed; the next block begins)
    WRAP   --anything else-->  TEXT (the block is released as text at once)
    NAME   --`>`-->  BODY (a function) / VALUE (a parameter);  --a character no name has-->  TEXT (released)
    BODY   --whitespace-->  BODY;  --parameter tag-->  NAME;  --function end-->  WRAP (bare: TEXT, verdict)
    BODY   --anything else-->  TEXT (released: `use <function=NAME> tags` is prose)
    VALUE  --`</parameter>`-->  PEND (after-parameter);  --`</function>`-->  PEND (after-function)
    VALUE  --`<parameter=` opening a line-->  NAME (implicit; see below)
    PEND   --whitespace-->  PEND
    PEND   --a tag that may follow the closer-->  confirmed: the value ends where the closer began
    PEND   --anything else-->  VALUE (the closer was part of the value)
    VALUE, NAME, BODY, WRAP, PEND  --more than `max_held` characters held-->  TEXT (released)
    finish: WRAP after a complete function, or PEND after `</function>`: verdict; else text.

Values are not escaped, so a value may hold the dialect's own tags (a file being written that
documents them). A closer counts only when what follows it fits: `</parameter>` then whitespace
then `<parameter=`, `</function>` or the wrapper end; `</function>` then the wrapper end, the next
function or the next wrapper (bare: at once). Opening tags that begin a line inside a value open
literal elements, counted per kind, whose closers are literal too: a whole example call inside a
value stays in the value, and a stray literal `<parameter=` line cannot hide the real
`</function>` (the `</parameter>` it swallowed is then trimmed off the value, as vLLM does). A
`<parameter=NAME>` beginning a line outside literal elements closes the value (the missing
`</parameter>`) when NAME is a property of the tool not yet given (any name not yet given when the
tool has no properties); otherwise it opens a literal element. Every character is scanned once,
plus a look-ahead of at most one tag (20 characters) at `<`; names are read incrementally.

GLM (`GlmLexer`):

    TEXT   --`<tool_call>`-->  HEAD  --whitespace-->  HEAD;  --name character-->  NAME;  --else-->  TEXT (released)
    NAME   --name characters-->  NAME;  --anything else-->  AFTER_NAME
    AFTER_NAME  --whitespace-->  AFTER_NAME;  --`<arg_key>`-->  KEY;  --`</tool_call>`-->  TEXT (verdict, `{}`)
    AFTER_NAME  --anything else-->  TEXT (released)
    KEY    --text-->  KEY;  --`</arg_key>`-->  KV;  --any other `<`-->  TEXT (released)
    KV     --whitespace-->  KV;  --`<arg_value>`-->  VALUE;  --else-->  TEXT (released)
    VALUE  --`</arg_value>`-->  PEND
    PEND   --whitespace-->  PEND;  --`<arg_key>`-->  KEY;  --`</tool_call>`-->  TEXT (verdict)
    PEND   --`<tool_call>`-->  TEXT (verdict as if closed; the next block begins)
    PEND   --anything else-->  VALUE (the `</arg_value>` was part of the value)
    finish: PEND (every value closed): verdict; else text.  Cap as above.

Cap: `max_held` counts every character of a block, tags included; the block is released at the
same character however the text was split (the scan never runs past the cap).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..calls import SCHEMA_MISMATCH, STRICT_FAILURE, UNKNOWN_NAME, CallScope
from .base import CallArgs, CallBegin, CallEnd, Marker, Segment, Text, excerpt, find_marker
from ..judge import ToolCallJudge, _properties, coerce_value, compact_json

MAX_NAME = 256  # a function, parameter or key name longer than this is not a name

TEXT = "text"
_WS = re.compile(r"\s*")


# -- what every block dialect shares ------------------------------------------------------------


_PARTIAL = object()  # what `_match_tag` returns when more text is needed to tell


def _match_tag(buf: str, j: int, limit: int, tags: tuple[str, ...]) -> Any:
    """The tag of `tags` at `buf[j]` (before `limit`), `_PARTIAL`, or None."""
    for tag in tags:
        if buf.startswith(tag, j, limit):
            return tag
    available = limit - j
    for tag in tags:
        if available < len(tag) and buf.startswith(tag[:available], j, limit):
            return _PARTIAL
    return None


@dataclass(slots=True)
class _Param:
    """A parameter of a call: its name and where its value lies in the block's text."""

    name: str
    start: int
    end: int
    trim_close: bool = False  # ended by `</function>`: a `</parameter>` just before it is markup


@dataclass(slots=True)
class _Call:
    name: str
    params: list[_Param] = field(default_factory=list)


Step = Callable[[str, int, int, list[Segment]], "int | None"]


class _BlockLexer:
    """Text streaming, padding, holding a block and judging it: everything but the grammar.

    A dialect gives its opening markers (`_OPENERS`), starts a block in `_begin_block`, and
    scans it with one step per state (`_steps`). A step reads `buf` from a position up to
    `limit` (the cap) and returns where scanning goes on: in the block (the state changed), in
    TEXT (the block was closed or released), or None: it waits for more text (`_wait`).
    """

    _OPENERS: tuple[Marker, ...] = ()
    _STRIP_NEWLINES = True  # one leading and one trailing newline of each value are markup
    _PARAM_CLOSE = ""  # trimmed off values ended by an implicit close (see `_Param.trim_close`)

    def __init__(self, scope: CallScope, *, max_held: int = 1 << 20) -> None:
        self._scope = scope
        self._judge = ToolCallJudge(scope)  # its validator cache and INVALID_SCHEMA notes
        self._max_held = max_held
        # Without declared tools no block can be a call: nothing is held, nothing is scanned.
        self._pass_through = not scope.tools
        self._steps: dict[str, Step] = self._step_table()
        self._reset()

    def _step_table(self) -> dict[str, Step]:
        raise NotImplementedError

    def _begin_block(self, kind: str) -> None:
        raise NotImplementedError

    def _complete_at_end(self) -> bool:
        """At `finish()`: are the block's calls complete enough to be judged?"""
        raise NotImplementedError

    def _reset_grammar(self) -> None:
        raise NotImplementedError

    def _reset(self) -> None:
        self._state = TEXT
        self._tail = ""  # unread text: a possible beginning of a marker or tag
        self._pad = ""  # whitespace held in TEXT (hermes.py's padding rules)
        self._after_call = False  # the last thing out was a call: whitespace is held
        self._reset_block()

    def _reset_block(self) -> None:
        self._block_pad = ""  # the padding in front of the current block's marker
        self._raw: list[str] = []  # the block as written, marker included
        self._size = 0  # its length: offsets of values are counted in it
        self._last = ""  # its last character (does a tag open a line?)
        self._calls: list[_Call] = []
        self._reset_grammar()

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
        elif self._complete_at_end():
            # vLLM accepts a block left open at the end. A tag cut short at the end is part of
            # the markup: it goes with the block (dropped with its calls, shown with its text).
            self._take(tail, 0, len(tail))
            self._close(out, 0)
        else:  # nothing complete was a call: everything held is text, nothing lost
            self._release(out, tail)
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
                continue
            # Never read past the cap: the block is released at the same character of the
            # block however the text was split. `pos - size` is where the block began.
            limit = min(len(buf), max(pos, pos + self._max_held - self._size))
            while self._state != TEXT and pos is not None:
                pos = self._steps[self._state](buf, pos, limit, out)

    def _scan_text(self, buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
        """TEXT: pass text on; stop at an opening marker, or hold what may still become one."""
        match = find_marker(buf, pos, self._OPENERS, final)
        if match is None:
            self._take_text(buf[pos:], out, before_tag=False)
            return None
        self._take_text(buf[pos : match.pos], out, before_tag=True)
        if match.marker is None:
            self._tail = buf[match.pos :]
            return None
        self._block_pad, self._pad = self._pad, ""
        end = match.pos + len(match.marker.text)
        self._take(buf, match.pos, end)
        self._begin_block(match.marker.kind)
        return end

    def _take_text(self, text: str, out: list[Segment], before_tag: bool) -> None:
        """Text outside blocks; `before_tag`: a marker (or a possible one) follows it."""
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

    # -- leaving a block -----------------------------------------------------------------------

    def _close(self, out: list[Segment], pos: int) -> int:
        """The block ended: its calls if the verdict allows them, else its text. TEXT at `pos`."""
        text = "".join(self._raw)
        calls = self._verdict(text) if self._calls else None
        if calls:
            for name, arguments in calls:
                out.append(CallBegin(self._scope.mint_call_id(), name))
                out.append(CallArgs(arguments))
                out.append(CallEnd())
            self._after_call = True
        else:
            self._emit(out, self._block_pad + text)
            self._after_call = False
        self._state = TEXT
        self._reset_block()
        return pos

    def _release(self, out: list[Segment], rest: str = "") -> None:
        """The block is not a call: everything held goes out as text, nothing lost."""
        self._emit(out, self._block_pad + "".join(self._raw) + rest)
        self._after_call = False
        self._state = TEXT
        self._reset_block()

    def _reject(self, out: list[Segment], pos: int) -> int:
        """Not this dialect's block after all: release it at once, read on as text at `pos`."""
        self._release(out)
        return pos

    @staticmethod
    def _emit(out: list[Segment], text: str) -> None:
        if text:
            out.append(Text(text))

    # -- the verdict ---------------------------------------------------------------------------

    def _verdict(self, text: str) -> list[tuple[str, str]] | None:
        """(name, arguments JSON) of every call of the block, admitted; None: the block is text.

        All or nothing, like a list in a `<tool_call>` JSON block: a block shown as text cannot
        lose a part of itself. Problems are noted as the JSON dialect notes them.
        """
        tools = self._scope.tools
        for call in self._calls:
            if call.name not in tools:
                self._scope.note(UNKNOWN_NAME, f"{excerpt(call.name)} is not a declared tool")
                return None
        built: list[tuple[str, str]] = []
        notes: list[tuple[str, str]] = []
        for call in self._calls:
            spec = tools[call.name]
            properties = _properties(spec) or {}
            arguments: dict[str, Any] = {}
            for param in call.params:
                arguments[param.name] = coerce_value(self._value_text(text, param), properties.get(param.name))
            error = self._judge.schema_error(spec, arguments)
            if error is not None:
                if spec.strict:
                    self._scope.note(STRICT_FAILURE, f"{call.name}: {error}")
                    return None
                notes.append((SCHEMA_MISMATCH, f"{call.name}: {error}"))
            built.append((call.name, compact_json(arguments)))
        if not self._scope.admit_all([name for name, _ in built]):
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


# -- Qwen3-Coder and MiniMax: function elements holding parameter elements ------------------------

WRAP, NAME, BODY, VALUE, PEND = "wrap", "name", "body", "value", "pend"
FUNC, PARAM, IMPLICIT = "function", "parameter", "implicit"  # whose name NAME reads


class _ElementLexer(_BlockLexer):
    """Qwen3-Coder's and MiniMax's grammar, one spelling per subclass (module docstring)."""

    _WRAP_OPEN = _WRAP_CLOSE = _FUNC_OPEN = _FUNC_CLOSE = _PARAM_OPEN = ""
    _FUNC_NAME_STOP: re.Pattern[str]  # characters that end (`>`) or spoil a function name
    _PARAM_NAME_STOP: re.Pattern[str]

    def __init__(self, scope: CallScope, *, max_held: int = 1 << 20) -> None:
        self._wrap_tags = (self._FUNC_OPEN, self._WRAP_CLOSE, self._WRAP_OPEN)
        self._body_tags = (self._PARAM_OPEN, self._FUNC_CLOSE)
        self._value_tags = (self._PARAM_CLOSE, self._FUNC_CLOSE, self._WRAP_CLOSE, self._PARAM_OPEN, self._FUNC_OPEN, self._WRAP_OPEN)
        # What may follow a closer for it to count (see the module docstring).
        self._after_param_wrapped = (self._PARAM_OPEN, self._FUNC_CLOSE, self._WRAP_CLOSE)
        self._after_param_bare = (self._PARAM_OPEN, self._FUNC_CLOSE)
        self._after_function = (self._WRAP_CLOSE, self._FUNC_OPEN, self._WRAP_OPEN)
        super().__init__(scope, max_held=max_held)

    def _step_table(self) -> dict[str, Step]:
        return {WRAP: self._step_wrap, NAME: self._step_name, BODY: self._step_body, VALUE: self._step_value, PEND: self._step_pend}

    def _reset_grammar(self) -> None:
        self._wrapped = False
        self._properties: dict[str, Any] | None = None  # of the current function's tool
        self._seen: set[str] = set()  # parameters the current function has given
        self._name_for = FUNC
        self._name_chars = ""
        self._param_name = ""
        self._value_start = 0
        # Elements of the dialect opened literally inside the current value, per kind: their
        # closers are literal too. Kept apart so that a stray literal `<parameter=` cannot hide
        # the real `</function>` (vLLM falls back on it the same way).
        self._open_params = self._open_functions = self._open_wraps = 0
        self._pend_kind = PARAM  # which closer PEND is confirming
        self._pend_at = 0  # where that closer began: the value's end if it counts

    def _begin_block(self, kind: str) -> None:
        self._wrapped = kind == "wrap"
        if self._wrapped:
            self._state = WRAP
        else:
            self._read_name(FUNC)

    def _complete_at_end(self) -> bool:
        if self._state == WRAP:
            return bool(self._calls)  # every function in it is closed
        if self._state == PEND and self._pend_kind == FUNC:  # the end of the text confirms it
            self._end_param(trim_close=True)
            return True
        return False

    def _parse_name(self, raw: str) -> str | None:
        raise NotImplementedError

    # -- states --------------------------------------------------------------------------------

    def _step_wrap(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """WRAP: between the functions of a wrapper."""
        j = self._skip_ws(buf, i, limit)
        if j == limit:
            return self._wait(buf, j, limit, out)
        tag = _match_tag(buf, j, limit, self._wrap_tags)
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
        # `<tool_call>{` (Hermes), `<tool_call>name` (GLM), prose: not ours, shown at once.
        return self._reject(out, j)

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
            # lacked its `</parameter>` (vLLM tolerates this).
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
        if not self._wrapped:  # a bare function is the whole block
            return self._close(out, pos)
        self._state = WRAP
        return pos

    def _step_body(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """BODY: right after `<function=NAME>`: a parameter or the end of the function."""
        j = self._skip_ws(buf, i, limit)
        if j == limit:
            return self._wait(buf, j, limit, out)
        tag = _match_tag(buf, j, limit, self._body_tags)
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
            tag = _match_tag(buf, j, limit, self._value_tags)
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
                    # missing `</parameter>` (decided once its name is read)
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
        tag = _match_tag(buf, j, limit, tags)
        if tag is _PARTIAL:
            return self._wait(buf, j, limit, out)
        if tag is None:  # the closer and the whitespace after it are part of the value
            self._state = VALUE
            return j
        n = j + len(tag)
        self._end_param(trim_close=self._pend_kind == FUNC)
        if tag == self._WRAP_OPEN:  # `</function>`, then the next block: this one is complete
            return self._close(out, j)
        self._take(buf, j, n)
        if tag == self._PARAM_OPEN:
            self._read_name(PARAM)
            return n
        if tag == self._FUNC_OPEN:
            self._read_name(FUNC)
            return n
        if tag == self._WRAP_CLOSE:  # `</function>` was missing, or confirmed
            return self._close(out, n)
        return self._end_function(out, n)  # `</parameter>` then `</function>`


class QwenXmlLexer(_ElementLexer):
    """Qwen3-Coder / Qwen3.5 / Qwen3.6 `<function=NAME><parameter=P>` markup, wrapped or bare."""

    _WRAP_OPEN, _WRAP_CLOSE = "<tool_call>", "</tool_call>"
    _FUNC_OPEN, _FUNC_CLOSE = "<function=", "</function>"
    _PARAM_OPEN, _PARAM_CLOSE = "<parameter=", "</parameter>"
    _OPENERS = (Marker("<tool_call>", "wrap"), Marker("<function=", "bare"))
    # A function name has no whitespace, quotes or braces (vLLM: an unrendered Jinja
    # `<function={{ name }}>` is not a call); a parameter name ends at `>`, on one line.
    _FUNC_NAME_STOP = re.compile(r"""[<>\s{}"']""")
    _PARAM_NAME_STOP = re.compile(r"[<>\n]")

    def _parse_name(self, raw: str) -> str | None:
        return raw or None


class MiniMaxLexer(_ElementLexer):
    """MiniMax-M2 `<minimax:tool_call><invoke name="NAME"><parameter name="P">` markup."""

    _WRAP_OPEN, _WRAP_CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
    _FUNC_OPEN, _FUNC_CLOSE = "<invoke name=", "</invoke>"
    _PARAM_OPEN, _PARAM_CLOSE = "<parameter name=", "</parameter>"
    _OPENERS = (Marker("<minimax:tool_call>", "wrap"),)
    _FUNC_NAME_STOP = _PARAM_NAME_STOP = re.compile(r"[<>\n]")

    def _parse_name(self, raw: str) -> str | None:
        """`"NAME"`, `'NAME'` or a bare NAME."""
        name = raw.strip()
        if len(name) >= 2 and name[0] == name[-1] and name[0] in "\"'":
            name = name[1:-1]
        return name or None


# -- GLM: a name, then key / value pairs --------------------------------------------------------

HEAD, GLM_NAME, AFTER_NAME, KEY, KV, GLM_VALUE, GLM_PEND = "head", "glm_name", "after_name", "key", "kv", "glm_value", "glm_pend"

_GLM_NAME_CHAR = re.compile(r"[\w.:/-]")
_GLM_NAME_RUN = re.compile(r"[\w.:/-]*")


class GlmLexer(_BlockLexer):
    """GLM-4.5 / 4.6 / 4.7 `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>` markup."""

    _OPEN, _CLOSE = "<tool_call>", "</tool_call>"
    _KEY_OPEN, _KEY_CLOSE = "<arg_key>", "</arg_key>"
    _VALUE_OPEN, _VALUE_CLOSE = "<arg_value>", "</arg_value>"
    _OPENERS = (Marker("<tool_call>", "call"),)
    _STRIP_NEWLINES = False  # the template writes values as they are

    def _step_table(self) -> dict[str, Step]:
        return {
            HEAD: self._step_head,
            GLM_NAME: self._step_name,
            AFTER_NAME: self._step_after_name,
            KEY: self._step_key,
            KV: self._step_kv,
            GLM_VALUE: self._step_value,
            GLM_PEND: self._step_pend,
        }

    def _reset_grammar(self) -> None:
        self._name_chars = ""
        self._key_chars = ""
        self._value_start = 0
        self._pend_at = 0

    def _begin_block(self, kind: str) -> None:
        self._state = HEAD

    def _complete_at_end(self) -> bool:
        if self._state == GLM_PEND:  # every value closed; only `</tool_call>` is missing
            self._end_pair()
            return True
        return False

    def _step_head(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """HEAD: whitespace, then the first character of a name, or not GLM at all."""
        j = self._skip_ws(buf, i, limit)
        if j == limit:
            return self._wait(buf, j, limit, out)
        if not _GLM_NAME_CHAR.match(buf, j):  # `{` (Hermes), `<function=` (Qwen), prose
            return self._reject(out, j)
        self._state = GLM_NAME
        return j

    def _step_name(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        room = MAX_NAME - len(self._name_chars)
        j = _GLM_NAME_RUN.match(buf, i, min(limit, i + room + 1)).end()
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
        j = self._skip_ws(buf, i, limit)
        if j == limit:
            return self._wait(buf, j, limit, out)
        tag = _match_tag(buf, j, limit, (self._KEY_OPEN, self._CLOSE))
        if tag is _PARTIAL:
            return self._wait(buf, j, limit, out)
        if tag is None:  # `<tool_call> tags, like...`: prose, shown at once
            return self._reject(out, j)
        self._take(buf, j, j + len(tag))
        if tag == self._CLOSE:
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
        tag = _match_tag(buf, j, limit, (self._KEY_CLOSE,))
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
        j = self._skip_ws(buf, i, limit)
        if j == limit:
            return self._wait(buf, j, limit, out)
        tag = _match_tag(buf, j, limit, (self._VALUE_OPEN,))
        if tag is _PARTIAL:
            return self._wait(buf, j, limit, out)
        if tag is None:
            return self._reject(out, j)
        self._take(buf, j, j + len(tag))
        self._value_start = self._size
        self._state = GLM_VALUE
        return j + len(tag)

    def _step_value(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        while True:
            j = buf.find("<", i, limit)
            if j < 0:
                self._take(buf, i, limit)
                return self._wait(buf, limit, limit, out)
            self._take(buf, i, j)
            tag = _match_tag(buf, j, limit, (self._VALUE_CLOSE,))
            if tag is _PARTIAL:
                return self._wait(buf, j, limit, out)
            if tag is None:
                self._take(buf, j, j + 1)
                i = j + 1
                continue
            self._pend_at = self._size
            self._take(buf, j, j + len(tag))
            self._state = GLM_PEND
            return j + len(tag)

    def _step_pend(self, buf: str, i: int, limit: int, out: list[Segment]) -> int | None:
        """GLM_PEND: `</arg_value>` counts when the next key or the end of the call follows."""
        j = self._skip_ws(buf, i, limit)
        if j == limit:
            return self._wait(buf, j, limit, out)
        tag = _match_tag(buf, j, limit, (self._KEY_OPEN, self._CLOSE, self._OPEN))
        if tag is _PARTIAL:
            return self._wait(buf, j, limit, out)
        if tag is None:  # part of the value, like the whitespace after it
            self._state = GLM_VALUE
            return j
        self._end_pair()
        if tag == self._OPEN:  # the end tag is missing: the next block begins
            return self._close(out, j)
        self._take(buf, j, j + len(tag))
        if tag == self._CLOSE:
            return self._close(out, j + len(tag))
        self._key_chars = ""
        self._state = KEY
        return j + len(tag)

    def _end_pair(self) -> None:
        self._calls[0].params.append(_Param(self._key_chars, self._value_start, self._pend_at))
