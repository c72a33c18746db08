"""Llama tool-call markup, three spellings:

    Llama 3.1 tag     <function=get_weather>{"city": "Oslo"}</function>
    Llama 4 pythonic  <|python_start|>[get_weather(city='Oslo', days=[1, 2])]<|python_end|>
    Llama 3.x JSON    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; {…}

Accepted as well: `<function=NAME></function>` (no arguments: `{}`), a tag whose `</function>`
is missing when the next `<function=` or the end of the text follows its value, a pythonic
list without `<|python_end|>` (the list's closing `]` ends it), `"arguments"` for
`"parameters"`, and `<|eom_id|>` / `<|eot_id|>` after `<|python_tag|>` calls (swallowed with
them, as `<|python_end|>` is after pythonic calls).

Known limit: Llama 3.x JSON is recognised only after `<|python_tag|>`. Bare JSON in content is
also how Llama writes calls when the tag is stripped, but prose can hold the same JSON (vLLM
turns "Here is the result: {...}" into a call), and a proxy cannot tell them apart: it stays
text. Pythonic calls without `<|python_start|>` stay text for the same reason.

States (`_state`), and what moves between them:

    TEXT       --`<function=`------------------------->  FUNC_NAME  (the tag is held)
    FUNC_NAME  --name characters, then `>`------------>  FUNC_OPEN
    FUNC_OPEN  --whitespace--------------------------->  FUNC_OPEN  (held)
    FUNC_OPEN  --`{`---------------------------------->  FUNC_ARGS  (a JSON object is scanned)
    FUNC_OPEN  --`</function>`------------------------>  AFTER      (verdict: a call with `{}`)
    FUNC_ARGS  --the object closes-------------------->  FUNC_END
    FUNC_END   --whitespace--------------------------->  FUNC_END   (held)
    FUNC_END   --`</function>`------------------------>  AFTER      (verdict)
    FUNC_END   --`<function=`------------------------->  AFTER      (verdict as if closed; AFTER reads the tag)
    TEXT       --`<|python_start|>`------------------->  PY_OPEN
    PY_OPEN    --whitespace, then `[`----------------->  PY_LIST    (a Python list is scanned)
    PY_LIST    --the list closes---------------------->  AFTER      (verdict; `<|python_end|>` may follow)
    TEXT       --`<|python_tag|>`--------------------->  TAG_OPEN
    TAG_OPEN   --whitespace, then `{`----------------->  TAG_JSON   (a JSON object is scanned)
    TAG_JSON   --the object closes-------------------->  AFTER      (verdict; `; {` continues)
    AFTER      --whitespace (and `;` after python_tag)>  AFTER      (held, see `UnitLexer`)
    AFTER      --a marker above----------------------->  its state
    AFTER      --`{` after a `;`, python_tag---------->  TAG_JSON   (the next call)
    AFTER      --anything else------------------------>  TEXT
    any other character where the table expects something, a value cut short by a marker
    outside its strings, more than `max_held` held -->  TEXT       (released as text)
    finish: FUNC_END gets its verdict as if closed (a half-written `</function>` goes with it);
    anything else still open is text.

Pythonic calls are read with `ast.parse` and nothing is evaluated: only keyword arguments
whose values are literals (strings, numbers, True/False/None, lists, tuples, dicts with string
keys) are accepted, and become the JSON object of the arguments.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any, Callable

from ..calls import INVALID_JSON, CallScope
from .base import Marker, Segment
from ..judge import Calls, judge_call, judge_entries
from .units import (
    CLOSED,
    MAX_NAME,
    MORE,
    PARTIAL,
    STOP,
    WAIT,
    JsonScanner,
    UnitLexer,
    marker_at,
)
from ..judge import compact_json

FUNCTION = Marker("<function=", "function")
FUNCTION_NAMED = Marker('<function name="', "function")  # the drift spelling llama.cpp accepts
FUNCTION_END = Marker("</function>", "function_end")
PYTHON_START = Marker("<|python_start|>", "pythonic")
PYTHON_END = Marker("<|python_end|>", "python_end")
PYTHON_TAG = Marker("<|python_tag|>", "python_tag")
BARE_JSON = Marker("", "python_tag")  # Llama 3.x JSON at the start of the text, without the tag
EOM = Marker("<|eom_id|>", "eom")
EOT = Marker("<|eot_id|>", "eot")

FUNC_NAME, FUNC_OPEN, FUNC_ARGS, FUNC_END = "func_name", "func_open", "func_args", "func_end"
PY_OPEN, PY_LIST, TAG_OPEN, TAG_JSON = "py_open", "py_list", "tag_open", "tag_json"

_NAME_RUN = re.compile(r"[A-Za-z0-9_.\-]*")
_WS = re.compile(r"\s*")


# -- Python lists -----------------------------------------------------------------------------

_PY_STOP = re.compile(r"""[\[\](){}'"<]""")
_IN_SINGLE = re.compile(r"['\\]")
_IN_DOUBLE = re.compile(r'["\\]')


class PythonScanner:
    """Follows the strings (`'`, `"`, triple-quoted), escapes and brackets of a Python list.

    Same contract as `JsonScanner`; a `<` outside strings is a STOP. WAIT: a quote at the end
    of the text may still be the beginning of a triple quote, more text is needed.
    """

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


class _NotACall(Exception):
    pass


def pythonic_entries(source: str) -> list[dict[str, Any]]:
    """`[name(key=literal, ...), ...]` as call objects; raises `_NotACall` with the reason."""
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:  # ValueError: a NUL
        raise _NotACall(f"not a Python call list ({type(exc).__name__})") from None
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        raise _NotACall("not a list of calls")
    entries = []
    for node in tree.body.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise _NotACall("not a list of calls")
        if node.args:
            raise _NotACall(f"{node.func.id}: positional arguments have no names")
        arguments: dict[str, Any] = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                raise _NotACall(f"{node.func.id}: ** arguments")
            try:
                arguments[keyword.arg] = _literal(keyword.value)
            except RecursionError:
                raise _NotACall(f"{node.func.id}: nested too deeply") from None
        entries.append({"name": node.func.id, "arguments": arguments})
    return entries


def _literal(node: ast.expr) -> Any:
    """The JSON value of a literal; nothing is evaluated, anything else raises `_NotACall`."""
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float) and math.isfinite(value):
            return value
    elif isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(element) for element in node.elts]
    elif isinstance(node, ast.Dict):
        result = {}
        for key, value in zip(node.keys, node.values):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                raise _NotACall("a dict key that is not a string")
            result[key.value] = _literal(value)
        return result
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = node.operand
        if isinstance(operand, ast.Constant) and type(operand.value) in (int, float):
            value = -operand.value if isinstance(node.op, ast.USub) else operand.value
            if not isinstance(value, float) or math.isfinite(value):
                return value
    raise _NotACall(f"not a literal: {type(node).__name__}")


# -- the lexer --------------------------------------------------------------------------------


class LlamaLexer(UnitLexer):
    """Incremental lexer for the Llama 3.1 / 3.x / 4 tool-call markup (see the module docstring)."""

    markers = (FUNCTION, FUNCTION_NAMED, PYTHON_START, PYTHON_TAG)
    trailers = {"pythonic": (PYTHON_END,), "python_tag": (EOM, EOT)}
    separators = {"python_tag": ";"}

    def __init__(self, scope: CallScope, *, max_held: int = 1 << 20, bare_json: bool = False) -> None:
        self._json = JsonScanner(stops="<")
        self._python = PythonScanner()
        # Llama 3.x writes its JSON calls without `<|python_tag|>` too. Bare JSON is read only
        # when the model is known to be a Llama, and only at the very start of the text (vLLM's
        # llama3_json does the same): JSON later in prose is prose.
        self._bare_json = bare_json
        super().__init__(scope, max_held=max_held)

    def _reset(self) -> None:
        super()._reset()
        self._at_start = self._bare_json

    def _idle_now(self) -> bool:
        return not self._at_start and super()._idle_now()

    def _scan_text(self, buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
        if self._at_start:
            end = _WS.match(buf, pos).end()
            if end == len(buf):
                self._tail = buf[pos:]  # only whitespace so far: the start is still to come
                return None
            self._at_start = False
            if buf[end] == "{":  # as if `<|python_tag|>` came first
                self._open(BARE_JSON)
                self._take(buf[pos:end])
                return end
        return super()._scan_text(buf, pos, out, final)

    def _dialect_handlers(self) -> dict[str, Callable[[str, int, list[Segment], bool], int | None]]:
        return {
            FUNC_NAME: self._scan_func_name,
            FUNC_OPEN: self._scan_func_open,
            FUNC_ARGS: self._scan_func_args,
            FUNC_END: self._scan_func_end,
            PY_OPEN: self._opener("[", PY_LIST),
            PY_LIST: self._scan_py_list,
            TAG_OPEN: self._opener("{", TAG_JSON),
            TAG_JSON: self._scan_tag_json,
        }

    def _opens(self, marker: Marker) -> str:
        self._quoted = marker is FUNCTION_NAMED  # the name ends at `">`, not at `>`
        return {FUNCTION.kind: FUNC_NAME, PYTHON_START.kind: PY_OPEN, PYTHON_TAG.kind: TAG_OPEN}[marker.kind]

    def _continues(self, c: str) -> str | None:
        # `<|python_tag|>` calls are separated by `; `: a `{` after the `;` is the next one.
        if self._section == PYTHON_TAG.kind and c == "{" and ";" in self._pad:
            return TAG_JSON
        return None

    def _reset_unit(self) -> None:
        self._quoted = False
        self._name = ""
        self._value_at = 0  # where the value begins in the held text
        self._value_end = -1  # FUNC_END: where it ended
        self._json.reset()
        self._python.reset()

    def _end_unit(self, out: list[Segment]) -> None:
        if self._state == FUNC_END:  # vLLM and llama.cpp accept a tag left open at the end
            self._verdict(self._function_call(), out, keep=self._value_end)
        else:
            self._release(out)

    # -- `<function=NAME>{json}</function>` ----------------------------------------------------

    def _scan_func_name(self, buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
        """FUNC_NAME: name characters up to `>`; anything else (a code sample) is text."""
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
        close = '">' if self._quoted else ">"
        if self._name and buf.startswith(close, end):
            self._take(close)
            self._state = FUNC_OPEN
            return end + len(close)
        if self._name and close.startswith(buf[end:]):  # `"` at the end: the `>` may follow
            self._tail = buf[end:]
            return None
        self._release(out)
        return end

    def _scan_func_open(self, buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
        """FUNC_OPEN: whitespace, then the arguments object or `</function>`."""
        end = _WS.match(buf, pos, self._room(pos, len(buf))).end()
        self._take(buf[pos:end])
        if self._over_cap(out):
            return end
        if end == len(buf):
            return None
        if buf[end] == "{":
            self._state = FUNC_ARGS
            self._value_at = self._size
            return end
        found = marker_at(buf, end, (FUNCTION_END,))
        if found == PARTIAL and not final:
            self._tail = buf[end:]
            return None
        if found == FUNCTION_END:
            self._take(FUNCTION_END.text)
            self._verdict(judge_call(self.judge, self._name, "{}"), out)
            return end + len(FUNCTION_END.text)
        self._release(out)
        return end

    def _scan_func_args(self, buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
        return self._scan_value(buf, pos, out, final, self._json, (FUNCTION_END, FUNCTION), self._value_closed)

    def _value_closed(self, out: list[Segment]) -> None:
        self._state = FUNC_END
        self._value_end = self._size

    def _scan_func_end(self, buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
        """FUNC_END: whitespace, then `</function>` (or the next tag: the end tag is missing)."""
        end = _WS.match(buf, pos, self._room(pos, len(buf))).end()
        self._take(buf[pos:end])
        if self._over_cap(out):
            return end
        if end == len(buf):
            return None
        found = marker_at(buf, end, (FUNCTION_END, FUNCTION))
        if found == PARTIAL:
            if not final:
                self._tail = buf[end:]
                return None
            if FUNCTION_END.text.startswith(buf[end:]):  # a half-written end tag at the end
                self._take(buf[end:])
                self._verdict(self._function_call(), out)
                return None
        if found == FUNCTION_END:
            self._take(FUNCTION_END.text)
            self._verdict(self._function_call(), out)
            return end + len(FUNCTION_END.text)
        if found == FUNCTION:  # AFTER reads the next tag
            self._verdict(self._function_call(), out, keep=self._value_end)
            return end
        self._release(out)  # a value followed by prose is not a call
        return end

    def _function_call(self) -> Calls | None:
        value = self._held_text()[self._value_at : self._value_end]
        return judge_call(self.judge, self._name, value)

    # -- `<|python_start|>[...]` and `<|python_tag|>{...}` --------------------------------------

    def _opener(self, first: str, state: str) -> Callable[[str, int, list[Segment], bool], int | None]:
        """PY_OPEN, TAG_OPEN: whitespace after the token, then `first` begins the value."""

        def scan(buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
            end = _WS.match(buf, pos, self._room(pos, len(buf))).end()
            self._take(buf[pos:end])
            if self._over_cap(out):
                return end
            if end == len(buf):
                return None
            if buf[end] == first:
                self._state = state
                self._value_at = self._size
            else:  # e.g. `<|python_tag|>` before code for Llama's built-in interpreter
                self._release(out)
            return end

        return scan

    def _scan_py_list(self, buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
        return self._scan_value(buf, pos, out, final, self._python, (PYTHON_END, PYTHON_START, PYTHON_TAG), self._py_closed)

    def _py_closed(self, out: list[Segment]) -> None:
        source = self._held_text()[self._value_at :]
        try:
            entries = pythonic_entries(source)
        except _NotACall as exc:
            self._note(INVALID_JSON, f"pythonic call list: {exc}")
            calls = None
        else:
            calls = judge_entries(self.judge, compact_json(entries))
        self._verdict(calls, out, trailers=self.trailers["pythonic"])

    def _scan_tag_json(self, buf: str, pos: int, out: list[Segment], final: bool) -> int | None:
        return self._scan_value(buf, pos, out, final, self._json, (PYTHON_TAG, EOM, EOT), self._tag_closed)

    def _tag_closed(self, out: list[Segment]) -> None:
        value = self._held_text()[self._value_at :]
        self._verdict(judge_entries(self.judge, value), out, trailers=self.trailers["python_tag"])

