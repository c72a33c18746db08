"""The verdict on markup that looks like calls: declared names, strict schemas, one repair.

Every dialect asks `ToolCallJudge` before held markup becomes calls, so the same block gets the
same verdict whatever its dialect, streamed or not (tool emulation reuses it too). Also here:
reading call objects with the model's own argument bytes kept (`judge_entries`), and Llama 4's
pythonic call lists (`pythonic_entries`). JSON is read and written as `schema.py` does.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import fastjsonschema
import json_repair
import jsonschema
import orjson
from jsonschema.exceptions import best_match

from .calls import INVALID_JSON, INVALID_SCHEMA, REPAIRED_JSON, SCHEMA_MISMATCH, STRICT_FAILURE, UNKNOWN_NAME, CallScope, excerpt
from .schema import compact_json, loads_strict, plain_data, refuse_constant
from .tools import ToolSpec

# A block whose own quotes are escaped (`{\"name\": …`) was written inside a JSON string: the
# model is quoting markup in prose, not calling. json_repair would unescape it into a call.
_QUOTED_BLOCK = re.compile(r'\s*(?:\[\s*)?\{\s*\\"')

# (name, arguments JSON text, the model's id or None) for each call a block makes
Calls = list[tuple[str, str, "str | None"]]


# -- the verdict on a closed block ------------------------------------------------------------


class _Rejected(Exception):
    """The block is not a call; `args`: the problem kind and why, for the rewrite's notes."""


_INVALID = object()  # what `loads_strict` / `_repair` give for text they cannot read


class ToolCallJudge:
    """Decides whether the JSON of a closed `<tool_call>` block is a call (or several).

    Checks, in order (seed 001, D5 and D5a):

    * the block reads as JSON, or after one repair pass (`json_repair`) that gives call objects
      naming declared tools with object arguments, none strict (REPAIRED_JSON; else
      INVALID_JSON, or STRICT_FAILURE);
    * every name is a declared tool (UNKNOWN_NAME; no declared tools means no calls at all);
    * arguments given as JSON text must read as an object: strict tools get no repair
      (STRICT_FAILURE), others one repair pass (REPAIRED_JSON, else INVALID_JSON);
    * arguments fit the tool's `parameters`, or a strict tool makes no call (STRICT_FAILURE,
      the one policy for strict failures: the block is text, noted); a non-strict tool's call
      is made anyway (SCHEMA_MISMATCH);
    * `scope.admit_all` (tool_choice none; parallel_tool_calls false: a list of several calls
      stays text too, before anything is admitted).

    A list is all-or-nothing: if any entry fails, the whole block stays text (a partial list
    cannot be shown without rewriting the model's bytes). The arguments text is the model's own
    string when it reads as an object, else compact JSON with non-ASCII kept: the same block
    always gives the same text.
    """

    def __init__(self, scope: CallScope) -> None:
        self.scope = scope
        self._validators: dict[str, Any] = {}  # tool name -> validator, or None: not validated

    def verdict(self, block: str, ids: Sequence[str | None] = ()) -> Calls | None:
        """The calls to emit for `block` (the text between the tags), admitted, each with the id of
        `ids` in its place if any; None: text. Why not is noted; what was repaired or did not
        fit, only for calls admitted."""
        notes: list[tuple[str, str]] = []  # what was repaired or did not fit
        try:
            calls = self._check(block, notes)
        except _Rejected as rejected:
            self.scope.note(*rejected.args)
            return None
        if not self.scope.admit_all([name for name, _ in calls]):
            return None
        for problem, detail in notes:
            self.scope.note(problem, detail)
        return [(name, arguments, ids[k] if k < len(ids) else None) for k, (name, arguments) in enumerate(calls)]

    def _check(self, block: str, notes: list[tuple[str, str]]) -> list[tuple[str, str]]:
        if not self.scope.tools:
            raise _Rejected(UNKNOWN_NAME, "no tools were declared")
        value = loads_strict(block, _INVALID)
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
        calls = [self._check_entry(entry, repaired, notes) for entry in entries]
        if repaired:  # one note for the block, first
            notes.insert(0, (REPAIRED_JSON, f"{calls[0][0]}: block JSON repaired"))
        return calls

    def _check_entry(self, entry: Any, repaired: bool, notes: list[tuple[str, str]]) -> tuple[str, str]:
        """(name, arguments JSON text) of a call object, or `_Rejected`."""
        # After a repair, anything but a call to a declared tool means the repair failed.
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise _Rejected(INVALID_JSON, f"not a call object {excerpt(compact_json(entry))}")
        name = entry["name"]
        spec = self.scope.tools.get(name)
        if spec is None:
            raise _Rejected(INVALID_JSON if repaired else UNKNOWN_NAME, f"{excerpt(name)} is not a declared tool")
        if repaired and spec.strict:
            raise _Rejected(STRICT_FAILURE, f"{name}: the block is not valid JSON")
        raw = _arguments(entry)
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            arguments, text = {}, "{}"
        elif isinstance(raw, dict):
            arguments, text = raw, compact_json(raw)
        elif isinstance(raw, str):
            arguments, text = loads_strict(raw, _INVALID), raw  # the model's own bytes when they read as an object
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
        return name, text

    def schema_error(self, spec: ToolSpec, arguments: dict[str, Any]) -> str | None:
        """Why `arguments` do not fit the tool's parameters, or None (fits, or no schema)."""
        if spec.name not in self._validators:
            validator, fits, problem = _validator(spec.parameters)
            if problem:
                self.scope.note(INVALID_SCHEMA, f"{spec.name}: {problem}")
            self._validators[spec.name] = (validator, fits) if validator is not None else None
        checks = self._validators[spec.name]
        if checks is None:
            return None
        validator, fits = checks
        if fits is not None and fits(arguments):
            return None  # (what jsonschema says of them, told by compiled code: `_fits`)
        try:
            error = best_match(validator.iter_errors(arguments))
        except Exception as exc:  # e.g. a $ref that cannot be resolved: treat as no schema
            self._validators[spec.name] = None
            self.scope.note(INVALID_SCHEMA, f"{spec.name}: {excerpt(str(exc))}")
            return None
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path)
        return excerpt(f"{where or '(root)'}: {error.message}")


def _arguments(entry: dict[str, Any]) -> Any:
    """A call object's arguments: `arguments`, else `parameters` (Llama's, Command's)."""
    arguments = entry.get("arguments")
    return entry.get("parameters") if arguments is None else arguments


def _validator(parameters: dict[str, Any] | None) -> tuple[Any, Callable[[Any], bool] | None, str | None]:
    """A validator for a tool's parameters (None: nothing to validate), the compiled check in
    front of it if any (`_fits`), and a problem if any."""
    if parameters is None:
        return None, None, None
    try:
        return _compiled_validator(orjson.dumps(parameters, option=orjson.OPT_SORT_KEYS))
    except (orjson.JSONEncodeError, TypeError):
        return None, None, "parameters are not JSON"


@lru_cache(maxsize=256)
def _compiled_validator(key: bytes) -> tuple[Any, Callable[[Any], bool] | None, str | None]:
    """Clients send the same tools with every request: schemas are checked once per process."""
    schema = orjson.loads(key)
    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        return cls(schema), _fits(schema), None
    except Exception as exc:  # SchemaError, or a $schema this jsonschema does not know
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        return None, None, f"invalid parameters schema, not validated ({excerpt(reason)})"


# -- the compiled check: arguments that fit, told at a fraction of jsonschema's cost -------------
#
# jsonschema walks a schema anew for each instance, a Python call and a validator object for each
# keyword and property: 7 µs for a one-property schema in process, about 50 µs inside a busy
# mitmdump (bench/HISTORY.md), at every call a block or a section makes. fastjsonschema compiles a
# schema to one Python function once. The two read a schema alike only on the keywords below (for
# the values JSON gives: dict, list, str, int, float, bool, None), so the compiled check takes only
# a schema that keeps to them, and only says "fits": arguments it refuses, and every schema beyond
# them, are judged by jsonschema, whose verdict and message stand.

# What both read alike. Left out: what fastjsonschema (draft-07's rules at most) does not read
# (`prefixItems`, `unevaluated…`, `dependentRequired`, …), reads otherwise or may (`multipleOf` on
# floats: 0.07 a multiple of 0.01 to fastjsonschema, not to jsonschema; `enum` and `const` of
# numbers and booleans, whose equality each library tells its own way; `pattern`, whose `$`
# fastjsonschema reads as the string's very end; `exclusiveMinimum`, a boolean in draft-04),
# fetches (`$ref`, `$id`), or where "fits" in a part is not "fits" in the whole (`not` and `oneOf`
# turn a part the compiled check refused, which jsonschema may have taken, into a fit).
_FITS_SUBSCHEMA = frozenset({"additionalProperties", "items"})
_FITS_SUBSCHEMAS = frozenset({"anyOf", "allOf"})
_FITS_PLAIN = frozenset({"type", "required", "minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties", "minimum", "maximum"})
_FITS_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "format", "$comment", "deprecated", "readOnly", "writeOnly"})
_FITS_DRAFTS = frozenset({
    "http://json-schema.org/draft-06/schema", "http://json-schema.org/draft-07/schema",
    "https://json-schema.org/draft/2019-09/schema", "https://json-schema.org/draft/2020-12/schema",
})  # fmt: skip  (draft-04 and earlier: 1.0 is no integer there, and exclusiveMinimum a boolean)


def _fits(schema: dict[str, Any]) -> Callable[[Any], bool] | None:
    """A compiled check of `schema` (valid for its draft: `check_schema` passed) that says True
    only of instances jsonschema finds no error in; None when the schema goes beyond the keywords
    both read alike, or FAST_SCHEMA_CHECK is off."""
    if not FAST_SCHEMA_CHECK:
        return None
    draft = schema.get("$schema")
    if draft is not None and (not isinstance(draft, str) or draft.rstrip("#") not in _FITS_DRAFTS):
        return None
    if not _read_alike({k: v for k, v in schema.items() if k != "$schema"}):
        return None
    try:  # (no defaults written into the arguments, no formats: jsonschema asserts none either)
        compiled = fastjsonschema.compile(schema, use_default=False, use_formats=False)
    except Exception:  # anything it cannot compile is jsonschema's alone
        return None

    def fits(instance: Any) -> bool:
        try:
            compiled(instance)
        except Exception:  # (JsonSchemaValueException: a misfit; anything else: jsonschema decides)
            return False
        return True

    return fits


def _read_alike(schema: Any) -> bool:
    """Does `schema` keep to the keywords the compiled check and jsonschema read alike?"""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict):
        return False
    for keyword, value in schema.items():
        if keyword in _FITS_PLAIN or keyword in _FITS_ANNOTATIONS:
            continue
        if keyword == "properties":
            if not isinstance(value, dict) or not all(_read_alike(sub) for sub in value.values()):
                return False
        elif keyword in _FITS_SUBSCHEMA:  # (`items` as one schema: a list of them is another draft's)
            if not _read_alike(value):
                return False
        elif keyword in _FITS_SUBSCHEMAS:
            if not isinstance(value, list) or not all(_read_alike(sub) for sub in value):
                return False
        elif keyword == "enum":
            if not isinstance(value, list) or not all(item is None or isinstance(item, str) for item in value):
                return False
        elif keyword == "const":
            if not (value is None or isinstance(value, str)):
                return False
        else:
            return False
    return True


FAST_SCHEMA_CHECK = True  # (the compiled check in front of jsonschema; off, jsonschema alone: tests compare)


def _repair(text: str) -> Any:
    """The one repair pass: what `json_repair` reads from `text`, or `_INVALID`."""
    try:
        value = json_repair.loads(text)
    except Exception:  # the repairer is best-effort; deep nesting can exhaust the stack
        return _INVALID
    return _INVALID if value == "" else value  # "" is what it makes of text it cannot read


# -- call objects, the model's argument bytes kept -----------------------------------------------

_DECODER = json.JSONDecoder(parse_constant=refuse_constant)  # no NaN, no Infinity
_JSON_WS = re.compile(r"[ \t\n\r]*")


def call_entries(text: str) -> list[Any] | None:
    """The call objects of a JSON object or list, each `"arguments"` / `"parameters"` object
    replaced by its exact text, so that a verdict passes the model's bytes on. None: `text` is
    not strict JSON."""
    entries: list[Any] = []

    def read_entry(i: int) -> int:
        entry, i = _entry(text, i)
        entries.append(entry)
        return i

    try:
        i = _JSON_WS.match(text).end()
        i = _items(text, i + 1, "]", read_entry) if text.startswith("[", i) else read_entry(i)
        return entries if _JSON_WS.match(text, i).end() == len(text) else None
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        return None


def _entry(text: str, i: int) -> tuple[Any, int]:
    if not text.startswith("{", i):
        return _DECODER.raw_decode(text, i)
    entry: dict[str, Any] = {}

    def read_member(i: int) -> int:
        if not text.startswith('"', i):
            raise ValueError("a key must be a string")
        key, i = _DECODER.raw_decode(text, i)
        i = _JSON_WS.match(text, i).end()
        if not text.startswith(":", i):
            raise ValueError("':' expected")
        start = i = _JSON_WS.match(text, i + 1).end()
        value, i = _DECODER.raw_decode(text, i)
        entry[key] = text[start:i] if key in ("arguments", "parameters") and isinstance(value, dict) else value
        return i

    return entry, _items(text, i + 1, "}", read_member)


def _items(text: str, i: int, close: str, read: Callable[[int], int]) -> int:
    """The items of a JSON array or object, from just after its opening bracket: `read(i)` reads
    the one at `i` and returns where it ends. Returns the position after `close`."""
    i = _JSON_WS.match(text, i).end()
    if text.startswith(close, i):
        return i + 1
    while True:
        i = _JSON_WS.match(text, read(i)).end()
        if text.startswith(",", i):
            i = _JSON_WS.match(text, i + 1).end()
        elif text.startswith(close, i):
            return i + 1
        else:
            raise ValueError(f"',' or '{close}' expected")


def judge_entries(judge: ToolCallJudge, block: str) -> Calls | None:
    """The verdict on a JSON call object or list of them, with each call's `"id"` if any, the
    model's argument bytes kept (`call_entries`). Unreadable JSON goes to the judge as it is (one
    repair pass for non-strict tools, the arguments then re-serialised, ids lost)."""
    entries = call_entries(block)
    if entries is None:
        return judge.verdict(block)
    shown: list[Any] = []
    for entry in entries:
        if isinstance(entry, dict):
            arguments = _arguments(entry)
            entry = {"name": entry.get("name")} | ({} if arguments is None else {"arguments": arguments})
        shown.append(entry)
    ids = [entry.get("id") if isinstance(entry, dict) and isinstance(entry.get("id"), str) else None for entry in entries]
    return judge.verdict(compact_json(shown), ids)  # one call for each entry, or none


def judge_call(judge: ToolCallJudge, name: str, arguments: str, model_id: str | None = None) -> Calls | None:
    """The verdict on one call written as a name and the JSON text of its arguments."""
    return judge.verdict(compact_json({"name": name, "arguments": arguments}), (model_id,))


# -- pythonic call lists (Llama 4) ----------------------------------------------------------------


class NotACall(Exception):
    """A pythonic call list that is not one; the reason is the message."""


def pythonic_entries(source: str) -> list[dict[str, Any]]:
    """`[name(key=literal, ...), ...]` as call objects, read with `ast.parse`, nothing run: only
    keyword arguments whose values are literals of JSON data (`ast.literal_eval`: strings,
    numbers, True/False/None, lists, tuples, dicts with string keys); else `NotACall`."""
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:  # ValueError: a NUL
        raise NotACall(f"not a Python call list ({type(exc).__name__})") from None
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        raise NotACall("not a list of calls")
    entries = []
    for node in tree.body.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise NotACall("not a list of calls")
        if node.args:
            raise NotACall(f"{node.func.id}: positional arguments have no names")
        arguments: dict[str, Any] = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                raise NotACall(f"{node.func.id}: ** arguments")
            try:  # (sets, bytes, complex numbers, NaN: no JSON value)
                arguments[keyword.arg] = plain_data(ast.literal_eval(keyword.value))
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
                raise NotACall(f"{node.func.id}: {keyword.arg} is not a literal ({type(exc).__name__})") from None
        entries.append({"name": node.func.id, "arguments": arguments})
    return entries
