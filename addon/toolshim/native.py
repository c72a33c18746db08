"""Upstream's own `tool_calls` deltas (Chat Completions streams), normalised to the wire rules.

Servers break their own streamed calls in a few known ways (research/wire.md 1.3, research/
parsers.md 4 items 8 and 10, research/peers.md): no `index` (langchain#31634), every call at
index 0 with its own id (Ollama), `id`/`type`/`name` repeated on every delta (vLLM #44098, GLM),
the full arguments sent again after the deltas (GLM, glm-tool-fix-proxy), the object text sent
as a JSON string or as an object (Kimi-K2#26), two entries for one index in one chunk. The
clients then join ids and names, merge calls or crash. `NativeCalls` reads one choice's entries
chunk by chunk and writes entries that follow the rules: a dense 0-based index shared with the
calls found in markup, `id`/`type`/`name` once in a call's first entry, one entry per call in a
chunk, arguments as the plain JSON object text.

A well-formed stream passes through entry for entry (only `index` may move, when markup calls
came first), and nothing is held for it: the only text ever held is an unfinished escape
sequence of arguments that arrive double encoded (at most 11 characters per call).

Which call an entry belongs to, in this order:
1. an `id` seen before names its call;
2. otherwise the call last seen at the entry's `index`; without an index (or while the current
   call, the last one started, began without one), the current call. Unless the entry starts a
   new call: a new `id` (except while that call's arguments are unfinished and the name is
   absent or the same: a server that mints an id per delta), a different `function.name`, or
   the same name with new arguments once the call's arguments are a complete JSON value;
3. with neither, a new call, if the entry carries anything (an entry with no id, no name and
   no arguments is dropped).

A snapshot is arguments that parse as a whole object and either equal, as a value, what the
call took so far, or start with its text. The second test can in theory mistake a genuine
delta for one: a delta holding a whole nested object that begins with all the text so far
(`{"a": [` then `{"a": []}`); no tokenizer splits that way in practice.

Typed by the declared schema (`ArgumentTyping`): a top-level value the tool's schema types as
no string but that arrives as a string holding a number, a boolean, an array or an object
(`"limit": "5"`) is sent as that value (`"limit": 5`), holding only that string until it
closes; arguments that are `null` or empty become `{}`.

Not repaired (they need holding a whole call): deltas of two calls interleaved across chunks
(within one chunk they are regrouped), a name split over deltas (passed on as it comes), a
first entry without a name (a later name is passed on in a continuation: the SDKs join it).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson

from .calls import random_id
from .schema import coerce_value, schema_types
from .tools import ToolSpec

# `repairs` keys: what was changed, for flow annotations and logs.
MISSING_INDEX = "missing_index"  # entry without an (integer) index
REUSED_INDEX = "reused_index"  # a new call at an index an earlier call had
REPEATED_HEAD = "repeated_head"  # id/type/name on a continuation, dropped
MISSING_HEAD = "missing_head"  # a call's first entry without id or type: minted/added
SNAPSHOT = "snapshot"  # the arguments sent again in full: only the new suffix kept
DOUBLE_ENCODED = "double_encoded"  # arguments as a JSON string of the object text: unquoted
OBJECT_ARGUMENTS = "object_arguments"  # arguments as a JSON value, not a string: serialised
MERGED = "merged"  # several entries for one call in one chunk: joined
TYPED_VALUE = "typed_value"  # a stringified value the schema types otherwise: sent as that value
EMPTY_ARGUMENTS = "empty_arguments"  # arguments null or empty: sent as {}
DROPPED = "dropped"  # an entry with nothing to send (not a dict, empty, or all held/known)

_WHITESPACE = " \t\r\n"
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX = frozenset("0123456789abcdefABCDEF")


def _hex4(text: str) -> int | None:
    return int(text, 16) if len(text) == 4 and all(c in _HEX for c in text) else None


def _nonempty(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _index_of(value: Any) -> int | None:
    if type(value) is int:
        return value
    if isinstance(value, str) and value.isdigit():  # `"index": "0"`: the SDKs coerce it
        return int(value)
    return None


def _object_value(text: str) -> dict[str, Any] | None:
    """The object `text` holds in full (plain or double encoded), else None."""
    try:
        value = orjson.loads(text)
        if isinstance(value, str):
            value = orjson.loads(value)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class _Arguments:
    """A call's argument text as upstream sends it, turned into the plain JSON object text.

    Undecided while only whitespace came; a first `"` means the object text is sent as a JSON
    string (double encoded), which is unquoted on the fly (its content may itself be quoted
    again: one more `_Arguments` reads it); anything else passes through untouched.
    """

    __slots__ = ("_mode", "_pending", "_inner")

    def __init__(self) -> None:
        self._mode = "undecided"  # | "plain" | "quoted" | "closed"
        self._pending = ""  # an unfinished escape sequence of the quoted text
        self._inner: _Arguments | None = None

    @property
    def quoted(self) -> bool:
        return self._inner is not None

    @property
    def held(self) -> bool:
        return bool(self._pending) or (self._inner is not None and self._inner.held)

    def feed(self, text: str) -> str:
        if self._mode == "plain":
            return text
        if self._mode == "undecided":
            body = text.lstrip(_WHITESPACE)
            if not body:
                return text
            if body[0] != '"':
                self._mode = "plain"
                return text
            self._mode = "quoted"
            self._inner = _Arguments()
            return text[: len(text) - len(body)] + self._inner.feed(self._unquote(body[1:]))
        if self._mode == "quoted":
            assert self._inner is not None
            return self._inner.feed(self._unquote(text))
        return ""  # after the closing quote: at most whitespace, or stray text of a broken server

    def finish(self) -> str:
        """What is held, as it came (an escape cut off by the end of the stream)."""
        if self._inner is None:
            return ""
        pending, self._pending = self._pending, ""
        return self._inner.feed(pending) + self._inner.finish()

    def _unquote(self, text: str) -> str:
        buf = self._pending + text
        self._pending = ""
        out: list[str] = []
        i, n = 0, len(buf)
        while i < n and self._mode == "quoted":
            quote, backslash = buf.find('"', i), buf.find("\\", i)
            stop = min(p for p in (quote, backslash, n) if p >= 0)
            out.append(buf[i:stop])
            i = stop
            if i == n:
                break
            if buf[i] == '"':
                self._mode = "closed"
                break
            if i + 1 == n:
                self._pending = buf[i:]
                break
            escape = buf[i + 1]
            if escape != "u":
                out.append(_ESCAPES.get(escape, escape))
                i += 2
                continue
            if n - i < 6:
                self._pending = buf[i:]
                break
            code = _hex4(buf[i + 2 : i + 6])
            if code is None:
                out.append("u")
                i += 2
            elif 0xD800 <= code < 0xDC00:  # a high surrogate: its low half follows as \uXXXX
                if n - i < 12 and "\\u".startswith(buf[i + 6 : i + 8]):
                    self._pending = buf[i:]
                    break
                low = _hex4(buf[i + 8 : i + 12]) if buf[i + 6 : i + 8] == "\\u" else None
                if low is not None and 0xDC00 <= low < 0xE000:
                    out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                    i += 12
                else:
                    out.append("\ufffd")
                    i += 6
            else:
                out.append("\ufffd" if 0xDC00 <= code < 0xE000 else chr(code))
                i += 6
        return "".join(out)


class _Call:
    __slots__ = ("index", "id", "name", "indexed", "_raw", "_last", "arguments", "counted_quoted", "typing", "sent")

    def __init__(self, index: int, call_id: str | None, name: str | None) -> None:
        self.index = index  # ours
        self.indexed = False  # upstream gave it an index
        self.id = call_id
        self.name = name
        self._raw: list[str] = []  # upstream's argument text taken so far, to spot a snapshot
        self._last = ""  # its last character other than whitespace
        self.arguments = _Arguments()
        self.counted_quoted = False
        self.typing: ArgumentTyping | None = None  # set when the call's tool types its values
        self.sent = False  # any argument text went out

    @property
    def taken(self) -> bool:
        return bool(self._raw)

    @property
    def raw(self) -> str:
        if len(self._raw) > 1:
            self._raw = ["".join(self._raw)]
        return self._raw[0] if self._raw else ""

    def take(self, text: str) -> None:
        if text:
            self._raw.append(text)
            self._last = text.rstrip(_WHITESPACE)[-1:] or self._last

    def complete(self) -> bool:
        """The arguments so far are a whole JSON value (cheap test first: most are not)."""
        if self._last not in ("}", '"'):
            return False
        try:
            orjson.loads(self.raw)
        except ValueError:
            return False
        return True


class NativeCalls:
    """One choice's own `tool_calls` entries in, entries that follow the wire rules out.

    `allocate()` hands out the next call index of the choice (shared with calls found in
    markup); it is called once per call, when its first entry is sent. `mint_id()` makes an id
    for a call that arrived without one. `repairs` counts what was changed, by kind (the
    flow's `RewriteStats.stream_repairs`, when given).
    """

    def __init__(
        self,
        allocate: Callable[[], int],
        mint_id: Callable[[], str] | None = None,
        repairs: Counter[str] | None = None,
        tools: dict[str, ToolSpec] | None = None,
    ) -> None:
        self._allocate = allocate
        self._tools = tools or {}
        self._mint_id = mint_id or (lambda: random_id("call_"))
        self._calls: list[_Call] = []
        self._by_id: dict[str, _Call] = {}
        self._by_index: dict[int, _Call] = {}
        self.changed = False  # the last feed()/finish() wrote anything but its input entries
        self.repairs: Counter[str] = Counter() if repairs is None else repairs

    @property
    def emitted(self) -> int:
        """How many calls of upstream's were sent so far."""
        return len(self._calls)

    @property
    def idle(self) -> bool:
        """Nothing is held (finish() would return nothing)."""
        return not any(call.arguments.held or call.typing is not None and call.typing.held for call in self._calls)

    def feed(self, entries: list[Any]) -> list[dict[str, Any]]:
        """The entries to send for one chunk's `delta.tool_calls` (possibly none)."""
        out: list[dict[str, Any]] = []
        slots: dict[int, dict[str, Any]] = {}  # our index -> its entry in `out`
        for entry in entries:
            written = self._entry(entry) if isinstance(entry, dict) else None
            if written is None:
                self.repairs[DROPPED] += 1
                continue
            slot = slots.get(written["index"])
            if slot is None:
                slots[written["index"]] = written
                out.append(written)
            else:  # a second entry for this call in this chunk: only a continuation can be one
                self.repairs[MERGED] += 1
                function = slot["function"] = dict(slot["function"])
                function["arguments"] = (function.get("arguments") or "") + written["function"]["arguments"]
                if "name" in written["function"] and "name" not in function:
                    function["name"] = written["function"]["name"]
        self.changed = out != entries
        return out

    def finish(self) -> list[dict[str, Any]]:
        """At the choice's end: what is still held, as continuation entries (usually none)."""
        out = []
        for call in self._calls:
            tail = call.arguments.finish()
            typing, call.typing = call.typing, None  # the call is over: nothing more is held
            if typing is not None:
                tail = typing.feed(tail) + typing.finish()
            if not call.sent and not tail.strip(_WHITESPACE) or typing is not None and typing.null:
                self.repairs[EMPTY_ARGUMENTS] += 1
                tail = "{}"
            if tail:
                call.sent = True
                out.append({"index": call.index, "function": {"arguments": tail}})
        self.changed = bool(out)
        return out

    # -- one entry -------------------------------------------------------------------------------

    def _entry(self, entry: dict[str, Any]) -> dict[str, Any] | None:
        upstream_index = _index_of(entry.get("index"))
        if upstream_index is None:
            self.repairs[MISSING_INDEX] += 1
        call_id = _nonempty(entry.get("id"))
        function = entry.get("function")
        function = function if isinstance(function, dict) else {}
        name = _nonempty(function.get("name"))
        text = self._text(function.get("arguments"))

        call = self._by_id.get(call_id) if call_id is not None else None
        if call is None:
            current = self._calls[-1] if self._calls else None
            base = current if upstream_index is None else self._by_index.get(upstream_index)
            if current is not None and not current.indexed and (base is None or call_id is None):
                base = current  # the current call began without an index: an index now names it
            if base is None or self._starts_new(base, call_id, name, text):
                if call_id is None and name is None and not text:
                    return None  # nothing to start a call with
                if base is not None and upstream_index is not None:
                    self.repairs[REUSED_INDEX] += 1
                return self._first_entry(entry, function, call_id, name, text, upstream_index)
            call = base
            if call_id is not None:
                self._by_id.setdefault(call_id, call)
        if upstream_index is not None:
            self._by_index[upstream_index] = call
            call.indexed = True
        return self._continuation(call, entry, function, name, text)

    def _starts_new(self, base: _Call, call_id: str | None, name: str | None, text: str | None) -> bool:
        if call_id is not None:  # an id not seen before
            return not (name in (None, base.name) and base.taken and not base.complete())
        if name is None or base.name is None:
            return False
        if name != base.name:
            return True
        return bool(text and text.strip(_WHITESPACE)) and base.complete() and self._snapshot_suffix(base, text) is None

    def _first_entry(
        self,
        entry: dict[str, Any],
        function: dict[str, Any],
        call_id: str | None,
        name: str | None,
        text: str | None,
        upstream_index: int | None,
    ) -> dict[str, Any]:
        if call_id is None or entry.get("type") != "function":
            self.repairs[MISSING_HEAD] += 1
        call = _Call(self._allocate(), call_id or self._mint_id(), name)
        self._calls.append(call)
        self._by_id[call.id] = call
        if upstream_index is not None:
            self._by_index[upstream_index] = call
            call.indexed = True
        out = {**entry, "index": call.index, "id": call.id, "type": "function"}
        out["function"] = {**function, "arguments": self._arguments(call, text or "")}
        return out

    def _continuation(
        self, call: _Call, entry: dict[str, Any], function: dict[str, Any], name: str | None, text: str | None
    ) -> dict[str, Any] | None:
        if text is not None:
            suffix = self._snapshot_suffix(call, text) if call.taken else None
            if suffix is not None:
                self.repairs[SNAPSHOT] += 1
                text = suffix
        arguments = self._arguments(call, text) if text is not None else None
        out = {k: v for k, v in entry.items() if k not in ("id", "type", "function")}
        out["index"] = call.index
        out["function"] = {k: v for k, v in function.items() if k != "name"}
        if call.name is None and name is not None:
            # The first entry had no name: a late one is better than none (the SDKs join it).
            call.name = name
            out["function"]["name"] = name
        out["function"]["arguments"] = arguments or ""
        if out == {**entry, "index": call.index}:
            return out  # well-formed, even if it says nothing
        if "id" in entry or "type" in entry or "name" in function:
            self.repairs[REPEATED_HEAD] += 1
        return out if arguments or "name" in out["function"] else None

    # -- arguments -------------------------------------------------------------------------------

    def _text(self, arguments: Any) -> str | None:
        if arguments is None or isinstance(arguments, str):
            return arguments
        self.repairs[OBJECT_ARGUMENTS] += 1
        return json.dumps(arguments, ensure_ascii=False)

    def _arguments(self, call: _Call, text: str) -> str:
        call.take(text)
        plain = call.arguments.feed(text)
        if call.arguments.quoted and not call.counted_quoted:
            call.counted_quoted = True
            self.repairs[DOUBLE_ENCODED] += 1
        if call.typing is None and not call.sent:
            call.typing = ArgumentTyping.for_tool(self._tools.get(call.name or ""), self.repairs)
        if call.typing is not None:
            plain = call.typing.feed(plain)
        if plain.strip(_WHITESPACE):
            call.sent = True
        return plain

    @staticmethod
    def _snapshot_suffix(call: _Call, text: str) -> str | None:
        """If `text` is the call's whole arguments sent again: the part not yet sent, else None.

        It must be a complete object (plain or double encoded) that starts with everything
        taken so far, or equals it as a value (another spelling of the same object).
        """
        if text.lstrip(_WHITESPACE)[:1] not in ('{', '"') or (value := _object_value(text)) is None:
            return None
        raw = call.raw
        if text.startswith(raw):
            return text[len(raw) :]
        return "" if _object_value(raw) == value else None


class ArgumentTyping:
    """A call's arguments, streamed, with the top-level values its tool's schema types as no
    string but that arrive as strings (`"5"`, `"true"`, `"[1, 2]"`) sent as the values they hold.

    Everything passes as it comes except such a string, held from its opening quote to its
    closing one (then sent typed, or as it was when it holds no value of an allowed type), and
    a leading `n` that may begin a `null` standing for the whole arguments (then `{}`). Each
    character is looked at once."""

    __slots__ = ("_typed", "_repairs", "_depth", "_in_string", "_escape", "_key", "_expect", "_held", "null", "_started", "_maybe_null")

    def __init__(self, typed: dict[str, dict[str, Any]], repairs: Counter[str]) -> None:
        self._typed = typed  # property -> schema, for the properties that admit no string
        self._repairs = repairs
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._key: list[str] | None = None  # the top-level key being read
        self._expect = "value"  # at depth 1: "key", "colon", "value", "after"
        self._held: list[str] | None = None  # a typed property's string value, held
        self.null = False  # the arguments are `null` (so far)
        self._started = False
        self._maybe_null: str | None = None  # the start of the arguments, while it may spell null

    @classmethod
    def for_tool(cls, spec: ToolSpec | None, repairs: Counter[str]) -> ArgumentTyping:
        """The typing of a call to `spec` (undeclared, or without properties: nothing is typed,
        but `null` arguments still become `{}`, on every API alike)."""
        properties = spec.parameters.get("properties") if spec is not None and isinstance(spec.parameters, dict) else None
        if not isinstance(properties, dict):
            return cls({}, repairs)
        typed = {name: schema for name, schema in properties.items() if isinstance(schema, dict) and (types := schema_types(schema)) and "string" not in types}
        return cls(typed, repairs)

    @property
    def held(self) -> bool:
        return self._held is not None or self._maybe_null is not None

    def whole(self, text: str) -> str | None:
        """A call's arguments all at once (a non-streaming body, a copy never streamed): typed,
        or None when they are `null` or empty (the caller sends `{}`)."""
        typed = self.feed(text) + self.finish()
        return None if self.null or not typed.strip(_WHITESPACE) else typed

    def feed(self, text: str) -> str:
        out: list[str] = []
        for c in text:
            self._step(c, out)
        return "".join(out)

    def finish(self) -> str:
        if self._held is not None:  # the string never closed: as it came
            held, self._held = "".join(self._held), None
            return held
        if self._maybe_null is not None and not self.null:  # a start of null, cut off: as it came
            held, self._maybe_null = self._maybe_null, None
            return held
        return ""

    def _step(self, c: str, out: list[str]) -> None:  # noqa: C901 (one character, one place)
        if not self._started:
            if c in _WHITESPACE:
                out.append(c)
                return
            self._started = True
            if c == "n":  # may be `null` for the whole arguments: sent as {} at the end
                self._maybe_null = "n"
                return
        if self._maybe_null is not None:
            candidate = self._maybe_null + c
            if "null".startswith(candidate) or candidate.startswith("null") and not candidate[4:].strip(_WHITESPACE):
                self._maybe_null = candidate
                self.null = candidate.startswith("null")
                return
            held, self._maybe_null, self.null = candidate, None, False  # not `null`: as it came
            for replayed in held:
                self._step(replayed, out)
            return
        if self._held is not None:
            self._held.append(c)
            if self._escape:
                self._escape = False
            elif c == "\\":
                self._escape = True
            elif c == '"':
                out.append(self._typed_value("".join(self._held)))
                self._held = None
                self._in_string = False
                self._expect = "after"
            return
        out.append(c)
        if self._in_string:
            if self._escape:
                self._escape = False
            elif c == "\\":
                self._escape = True
            elif c == '"':
                self._in_string = False
                if self._key is not None and self._depth == 1 and self._expect == "key":
                    self._expect = "colon"
            elif self._key is not None and self._depth == 1 and self._expect == "key":
                self._key.append(c)
            return
        if c in _WHITESPACE:
            return
        if c in "{[":
            self._depth += 1
            if self._depth == 1:
                self._expect = "key"
                self._key = []
        elif c in "}]":
            self._depth -= 1
        elif self._depth == 1 and c == ":":
            self._expect = "value"
        elif self._depth == 1 and c == ",":
            self._expect = "key"
            self._key = []
        elif c == '"':
            if self._depth == 1 and self._expect == "value" and "".join(self._key or ()) in self._typed:
                out.pop()
                self._held = ['"']
                self._in_string = True
                return
            self._in_string = True
        if self._depth == 1 and self._expect == "value" and c not in ":":
            self._expect = "after"

    def _typed_value(self, held: str) -> str:
        key = "".join(self._key or ())
        try:
            text = json.loads(held)
        except ValueError:
            return held
        value = coerce_value(text, self._typed[key])
        if isinstance(value, str):
            return held
        self._repairs[TYPED_VALUE] += 1
        return json.dumps(value, ensure_ascii=False)
