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

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import json_repair
import jsonschema
import orjson
from jsonschema.exceptions import best_match

from ...calls import (
    INVALID_JSON,
    INVALID_SCHEMA,
    REPAIRED_JSON,
    SCHEMA_MISMATCH,
    STRICT_FAILURE,
    UNKNOWN_NAME,
    CallScope,
)
from ...tools import ToolSpec
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


# -- the verdict on a closed block ------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class ParsedCall:
    """One call a block makes: a declared tool and the JSON text of an object."""

    name: str
    arguments: str
    notes: tuple[tuple[str, str], ...] = ()  # what was repaired or did not fit, noted once emitted


class _Rejected(Exception):
    """The block is not a call; the problem kind and why, for the rewrite's notes."""

    def __init__(self, problem: str, detail: str) -> None:
        super().__init__(detail)
        self.problem = problem
        self.detail = detail


_INVALID = object()  # what `_loads` / `_repair` return for text they cannot read


class ToolCallJudge:
    """Decides whether the JSON of a closed `<tool_call>` block is a call (or several).

    Checks, in order (seed 001, D5 and D5a):

    * the block reads as JSON; if not, one repair pass (`json_repair`), accepted only if it
      gives call objects naming declared tools with object arguments, and only when none of
      them is strict (REPAIRED_JSON; otherwise INVALID_JSON, or STRICT_FAILURE);
    * every name is a declared tool (UNKNOWN_NAME; no declared tools means no calls at all);
    * arguments given as JSON text must read as an object: strict tools get no repair
      (STRICT_FAILURE), others one repair pass (REPAIRED_JSON, else INVALID_JSON);
    * arguments are validated against the tool's `parameters`: a strict tool that does not
      fit makes no call (STRICT_FAILURE, the one policy for strict failures: the block is shown
      as text and noted); a non-strict one is emitted anyway (SCHEMA_MISMATCH);
    * `scope.admit` for each call (tool_choice none, parallel_tool_calls false).

    A list is all-or-nothing: if any entry fails, the whole block stays text (a partial list
    cannot be shown as text without rewriting the model's bytes). With parallel_tool_calls
    false a list of several calls stays text too, before anything is admitted.

    The arguments text is the model's own string when it sent one that reads as an object,
    otherwise compact JSON with non-ASCII kept: the same block always gives the same text.
    """

    def __init__(self, scope: CallScope) -> None:
        self.scope = scope
        self._validators: dict[str, Any] = {}  # tool name -> validator, or None: not validated

    def verdict(self, block: str) -> list[ParsedCall] | None:
        """The calls to emit for `block` (the text between the tags), admitted; None: text."""
        calls = self.check(block)
        if calls is None:
            return None
        if not self.scope.admit_all([call.name for call in calls]):
            return None
        for call in calls:
            for problem, detail in call.notes:
                self._note(problem, detail)
        return calls

    def check(self, block: str) -> list[ParsedCall] | None:
        """Everything `verdict` checks except admission; failures are noted, None: text."""
        try:
            return self._check(block)
        except _Rejected as rejected:
            self._note(rejected.problem, rejected.detail)
            return None

    def _check(self, block: str) -> list[ParsedCall]:
        if not self.scope.tools:
            raise _Rejected(UNKNOWN_NAME, "no tools were declared")
        value = _loads(block)
        repaired = value is _INVALID
        if repaired:
            if _QUOTED_BLOCK.match(block):  # found by tests/test_security.py: a quoted example became a call
                raise _Rejected(INVALID_JSON, f"markup quoted inside a JSON string {excerpt(block)}")
            value = _repair(block)
            if value is _INVALID:
                raise _Rejected(INVALID_JSON, f"unreadable block {excerpt(block)}")
        entries = value if isinstance(value, list) else [value]
        if not entries:
            raise _Rejected(INVALID_JSON, "an empty list of calls")
        calls = [self._check_entry(entry, repaired) for entry in entries]
        if repaired:  # one note for the block, emitted with its first call
            first = calls[0]
            calls[0] = ParsedCall(first.name, first.arguments, ((REPAIRED_JSON, f"{first.name}: block JSON repaired"),) + first.notes)
        return calls

    def _check_entry(self, entry: Any, repaired: bool) -> ParsedCall:
        # After a repair, anything but a call to a declared tool means the repair failed.
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise _Rejected(INVALID_JSON, f"not a call object {excerpt(compact_json(entry))}")
        name = entry["name"]
        spec = self.scope.tools.get(name)
        if spec is None:
            raise _Rejected(INVALID_JSON if repaired else UNKNOWN_NAME, f"{excerpt(name)} is not a declared tool")
        if repaired and spec.strict:
            raise _Rejected(STRICT_FAILURE, f"{name}: the block is not valid JSON")
        notes: list[tuple[str, str]] = []
        raw = entry.get("arguments")
        if raw is None:
            raw = entry.get("parameters")
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            arguments, text = {}, "{}"
        elif isinstance(raw, dict):
            arguments, text = raw, compact_json(raw)
        elif isinstance(raw, str):
            arguments, text = _loads(raw), raw  # the model's own bytes when they read as an object
            if not isinstance(arguments, dict):
                if spec.strict:
                    raise _Rejected(STRICT_FAILURE, f"{name}: arguments are not a JSON object")
                if arguments is not _INVALID:
                    raise _Rejected(INVALID_JSON, f"{name}: arguments are not an object")
                arguments = _repair(raw)
                if not isinstance(arguments, dict):
                    raise _Rejected(INVALID_JSON, f"{name}: unreadable arguments {excerpt(raw)}")
                text = compact_json(arguments)
                notes.append((REPAIRED_JSON, f"{name}: arguments repaired"))
        else:
            raise _Rejected(STRICT_FAILURE if spec.strict else INVALID_JSON, f"{name}: arguments are not an object")
        error = self.schema_error(spec, arguments)
        if error is not None:
            if spec.strict:
                raise _Rejected(STRICT_FAILURE, f"{name}: {error}")
            notes.append((SCHEMA_MISMATCH, f"{name}: {error}"))
        return ParsedCall(name, text, tuple(notes))

    def schema_error(self, spec: ToolSpec, arguments: dict[str, Any]) -> str | None:
        """Why `arguments` do not fit the tool's parameters, or None (fits, or no schema)."""
        if spec.name not in self._validators:
            validator, problem = _validator(spec.parameters)
            if problem:
                self._note(INVALID_SCHEMA, f"{spec.name}: {problem}")
            self._validators[spec.name] = validator
        validator = self._validators[spec.name]
        if validator is None:
            return None
        try:
            error = best_match(validator.iter_errors(arguments))
        except Exception as exc:  # e.g. a $ref that cannot be resolved: treat as no schema
            self._validators[spec.name] = None
            self._note(INVALID_SCHEMA, f"{spec.name}: {excerpt(str(exc))}")
            return None
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path)
        return excerpt(f"{where or '(root)'}: {error.message}")

    def _note(self, problem: str, detail: str) -> None:
        self.scope.note(problem, detail)


def _validator(parameters: dict[str, Any] | None) -> tuple[Any, str | None]:
    """A validator for a tool's parameters (None: nothing to validate), and a problem if any."""
    if parameters is None:
        return None, None
    try:
        key = orjson.dumps(parameters, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONEncodeError, TypeError):
        return None, "parameters are not JSON"
    return _compiled_validator(key)


@lru_cache(maxsize=256)
def _compiled_validator(key: bytes) -> tuple[Any, str | None]:
    """Clients send the same tools with every request: schemas are checked once per process."""
    schema = orjson.loads(key)
    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        return cls(schema), None
    except Exception as exc:  # SchemaError, or a $schema this jsonschema does not know
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        return None, f"invalid parameters schema, not validated ({excerpt(reason)})"


def loads_strict(text: str, invalid: Any) -> Any:
    """Strict JSON, or `invalid` (shared by the dialects that read JSON values)."""
    value = _loads(text)
    return invalid if value is _INVALID else value


def _loads(text: str) -> Any:
    """Strict JSON, or `_INVALID`.

    orjson reads integers beyond 64 bits as floats, silently: text holding a run of 19 digits
    goes to the stdlib parser, which keeps them exact. The stdlib parser also takes what orjson
    rejects and JSON allows (lone surrogate escapes); NaN and infinities are refused by both.
    """
    if not _LONG_DIGITS.search(text):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    try:
        return json.loads(text, parse_constant=_refuse, parse_float=_finite_float)
    except (ValueError, RecursionError):
        return _INVALID


def _refuse(literal: str) -> Any:
    raise ValueError(f"{literal} is not JSON")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise ValueError(f"{literal} is out of range")
    return value


def _repair(text: str) -> Any:
    """The one repair pass: what `json_repair` reads from `text`, or `_INVALID`."""
    try:
        value = json_repair.loads(text)
    except Exception:  # the repairer is best-effort; deep nesting can exhaust the stack
        return _INVALID
    return _INVALID if value == "" else value  # "" is what it makes of text it cannot read


def compact_json(value: Any) -> str:
    """Compact JSON with non-ASCII kept (orjson; the stdlib for integers beyond 64 bits)."""
    try:
        return orjson.dumps(value).decode()
    except (orjson.JSONEncodeError, TypeError):
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        try:
            text.encode()
        except UnicodeEncodeError:  # a lone surrogate: only its escape is valid UTF-8
            text = json.dumps(value, separators=(",", ":"))
        return text



# -- the lexer --------------------------------------------------------------------------------


class SentinelLexer:
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
