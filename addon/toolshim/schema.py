"""JSON values as toolshim reads, writes and types them: a shared service, not dialect code.

Read strictly (`loads_strict`, `reads_as_json`: no NaN, no infinities, big integers exact) and
written compactly with non-ASCII kept (`compact_json`), by the judge and every dialect alike. A
value written as raw text is typed by its property's JSON schema (`coerce_value`): the XML-like
dialects and DeepSeek's DSML type their markup's values so, and the repair of upstream's own
calls (`native.py`) the string values whose schema admits no string.
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

import orjson

from .tools import ToolSpec

_LONG_DIGITS = re.compile(r"\d{19}")  # a number orjson might read as a float (see loads_strict)
_TYPE_ALIASES = {  # spellings seen in hand-written schemas (vLLM accepts them too)
    "int": "integer", "long": "integer", "int32": "integer", "int64": "integer",
    "float": "number", "double": "number", "bool": "boolean",
    "str": "string", "text": "string", "dict": "object", "list": "array", "arr": "array",
}
_JSON_TYPES = ((type(None), "null"), (bool, "boolean"), (int, "integer"), (float, "number"), (list, "array"), (dict, "object"))
_INTEGER = re.compile(r"[-+]?\d+")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_NO = object()  # "this reading failed", distinct from a None that means JSON null


# -- strict JSON --------------------------------------------------------------------------------


def refuse_constant(literal: str) -> Any:
    """`parse_constant` for the stdlib's decoders: NaN and Infinity are not JSON."""
    raise ValueError(f"{literal} is not JSON")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise ValueError(f"{literal} is out of range")
    return value


_STRICT = json.JSONDecoder(parse_constant=refuse_constant, parse_float=_finite_float)  # no NaN, no infinities


def loads_strict(text: str, invalid: Any) -> Any:
    """Strict JSON, or `invalid`.

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
        return _STRICT.decode(text)
    except (ValueError, RecursionError):
        return invalid


def reads_as_json(text: str) -> bool:
    """One complete JSON value (the stdlib parser: no NaN, no infinities)."""
    try:
        _STRICT.decode(text)
    except (ValueError, RecursionError):
        return False
    return True


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


# -- typing a value by its schema ---------------------------------------------------------------


def coerce_value(raw: str, schema: dict[str, Any] | None) -> Any:
    """The JSON value of a parameter written as raw text, typed by its property `schema`.

    The rules of vLLM's Qwen3-Coder parser, made stricter where they would lose the model's text:

    * no usable schema (None, not an object, no type to be read from it: `{}`, a `$ref`), or a
      property the tool does not declare: the text, as a string. GLM writes non-string values
      as JSON whatever the schema; vLLM's GLM parser decodes them when the schema does not say
      string, we do not: a call to a property the client never declared stays the model's text;
    * the types allowed are read from `type` (a name or a list), `anyOf` / `oneOf` / `allOf`
      (their union), `enum` / `const` (the types of their values), else `properties` (object)
      or `items` (array);
    * `null` (or Python's `None`, which Jinja templates print) is None when null is allowed, or
      when string is not (vLLM); a string is always valid where string is allowed, so then the
      text is kept as it is (`"02139"` stays a zip code even if integer is allowed too);
    * integer: digits (or a number with no fraction, `5.0`); number: integers stay integers,
      others are finite floats; boolean: `true` / `false`, any case (Jinja prints `True`);
    * object / array: JSON, then a Python literal (`ast.literal_eval`: `{'k': 'v'}`, tuples as
      lists), also when the JSON is a string holding them (templates that double-encode);
      accepted only when the result is of an allowed type and plain JSON;
    * anything that reads as no allowed type stays the text (a schema mismatch for the judge).
    """
    types = schema_types(schema)
    if not types:
        return raw
    text = raw.strip()
    if text.lower() in ("null", "none") and ("null" in types or "string" not in types):
        return None
    if "string" in types:
        return raw
    if "integer" in types or "number" in types:
        number = _number(text, integral="number" not in types)
        if number is not None:
            return number
    if "boolean" in types and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if "object" in types or "array" in types:
        value = _container(text, types)
        if value is not _NO:
            return value
    return raw


def schema_types(schema: Any, _depth: int = 0) -> set[str]:
    """The JSON types a property schema allows, as far as it says (empty: it does not say)."""
    if not isinstance(schema, dict) or _depth > 8:
        return set()
    types: set[str] = set()
    declared = schema.get("type")
    for name in [declared] if isinstance(declared, str) else declared if isinstance(declared, list) else []:
        if isinstance(name, str):
            name = name.strip().lower()
            types.add(_TYPE_ALIASES.get(name, name))
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list):
            for option in options:
                types |= schema_types(option, _depth + 1)
    values = list(schema["enum"]) if isinstance(schema.get("enum"), list) else []
    if "const" in schema:
        values.append(schema["const"])
    types.update(json_type(value) for value in values)
    if not types:
        if "properties" in schema:
            types.add("object")
        elif "items" in schema:
            types.add("array")
    return types


def json_type(value: Any) -> str:
    """The JSON type of a decoded value, as a schema names it (bool before int: True is an int)."""
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), "string")


def _number(text: str, integral: bool) -> int | float | None:
    try:
        if _INTEGER.fullmatch(text):
            return int(text)
        if _NUMBER.fullmatch(text):
            value = float(text)
            if not math.isfinite(value):
                return None
            if integral:
                return int(value) if value.is_integer() else None
            return value
    except ValueError:  # more digits than Python converts
        return None
    return None


def _container(text: str, types: set[str]) -> Any:
    value = loads_strict(text, _NO)
    if value is _NO:
        value = _literal(text)
    elif isinstance(value, str):  # a JSON string holding the value: read once more
        inner = loads_strict(value, _NO)
        value = _literal(value) if inner is _NO else inner
    if (isinstance(value, dict) and "object" in types) or (isinstance(value, list) and "array" in types):
        return value
    return _NO


def _literal(text: str) -> Any:
    """A Python literal as plain JSON data, or `_NO` (sets, bytes, complex: not JSON)."""
    try:
        return plain_data(ast.literal_eval(text))
    except Exception:  # SyntaxError, ValueError, MemoryError, RecursionError: not a literal
        return _NO


def plain_data(value: Any) -> Any:
    """A Python literal's value as plain JSON data (tuples as lists); ValueError: none."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("not a JSON number")
        return value
    if isinstance(value, (list, tuple)):
        return [plain_data(item) for item in value]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: plain_data(item) for key, item in value.items()}
    raise ValueError("not JSON data")


def _properties(spec: ToolSpec | None) -> dict[str, Any] | None:
    """The tool's top-level properties, or None when it declares none."""
    parameters = spec.parameters if spec is not None else None
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    return properties if isinstance(properties, dict) else None
