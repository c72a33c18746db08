"""Values typed by the tool's schema in every XML, DSML and key/value dialect (issue 20 item 6).

The markup of these dialects carries no types (Qwen3-Coder, Seed-OSS, GLM, MiniMax) or a type
the model guessed (DeepSeek DSML's `string="true"|"false"`). The rule, one for all of them
(`schema.coerce_value`, `deepseek._parameter_value`), and the sources it follows:

* a value whose schema admits no string is read as the type the schema allows, whatever the
  markup says: vLLM's `qwen3_coder` / `seed_oss` / `minimax_m2` parsers (`_convert_param_value`
  by the property's `type`) and its GLM-4.5 parser (JSON unless the schema says string); for DSML
  the schema wins over `string="true"`;
* where a string fits, the text stays a string: `null`, `true`, `42` are the model's words
  (vLLM's Qwen3-Coder parser keeps string-typed text as is); `null` is None only where null is
  allowed or string is not. Here the issue decides against vLLM, whose `_convert_param_value`
  (qwen3coder_tool_parser.py, checked) returns None for `null` before it looks at the type, a
  string-typed parameter included;
* `anyOf` / `oneOf` / a list of types: their union (vLLM PR #32342 for MiniMax's `anyOf` with null);
* no schema for the parameter (none given, no type, or a property the tool does not declare): a
  string, as vLLM's Qwen3-Coder, Seed-OSS and MiniMax parsers do (GLM's decodes JSON there; here
  a property the client never declared keeps the model's text); in DSML the `string=` attribute
  decides, as DeepSeek's own encoding (`encoding_dsv32.py`) writes it.

Each dialect's block is read whole, at every split and one character at a time.
"""

from __future__ import annotations

import json

import pytest

from toolshim.calls import CallScope, RewriteStats
from toolshim.lexers.base import CallArgs, CallBegin, CallEnd, Text
from toolshim.lexers.deepseek import DeepSeekLexer
from toolshim.lexers.engine import lexer as engine_lexer
from toolshim.lexers.specs import GLM, MINIMAX, QWEN_XML, SEED_OSS
from toolshim.tools import RequestContext, ToolSpec

STRING = {"type": "string"}
TYPED = {
    "type": "object",
    "properties": {
        "n": {"type": "integer"},
        "x": {"type": "number"},
        "flag": {"type": "boolean"},
        "tags": {"type": "array", "items": {}},
        "obj": {"type": "object"},
        "s": STRING,
        "s_null": STRING,
        "s_true": STRING,
        "word": {"enum": ["null", "true", "42"]},
        "opt": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "opt_n": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "one": {"oneOf": [{"type": "integer"}, {"type": "array"}]},
        "pair": {"type": ["boolean", "null"]},
        "sn": {"type": ["string", "null"]},
        "sn_42": {"type": ["string", "null"]},
        "free": {"description": "no type"},
    },
}
TOOLS = {"typed": ToolSpec("typed", TYPED)}

# (parameter, raw text, expected value)
VALUES = [
    ("n", "42", 42),
    ("x", "1.5", 1.5),
    ("flag", "true", True),
    ("tags", '["a", 1]', ["a", 1]),
    ("obj", '{"k": "v"}', {"k": "v"}),
    ("s", "42", "42"),
    ("s_null", "null", "null"),
    ("s_true", "true", "true"),
    ("word", "null", "null"),
    ("opt", "null", None),
    ("opt_n", "7", 7),
    ("one", "[1]", [1]),
    ("pair", "false", False),
    ("sn", "null", None),
    ("sn_42", "42", "42"),
    ("free", "42", "42"),
    ("undeclared", "true", "true"),
]
EXPECTED = {key: value for key, _, value in VALUES}


def qwen_xml(values):
    return "<tool_call>\n<function=typed>\n" + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values) + "</function>\n</tool_call>"


def seed_oss(values):
    return "<seed:tool_call>\n<function=typed>\n" + "".join(f"<parameter={k}>{v}</parameter>\n" for k, v in values) + "</function>\n</seed:tool_call>"


def glm(values):
    return "<tool_call>typed\n" + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in values) + "</tool_call>"


def minimax(values):
    return '<minimax:tool_call>\n<invoke name="typed">\n' + "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in values) + "</invoke>\n</minimax:tool_call>"


def dsml(values, string):
    attr = "" if string is None else f' string="{string}"'
    params = "".join(f'<｜DSML｜parameter name="{k}"{attr}>{v}</｜DSML｜parameter>\n' for k, v in values)
    return f'<｜DSML｜tool_calls>\n<｜DSML｜invoke name="typed">\n{params}</｜DSML｜invoke>\n</｜DSML｜tool_calls>'


def scope():
    return CallScope(RequestContext(tools=dict(TOOLS)), RewriteStats())


DIALECTS = {
    "qwen_xml": (lambda: engine_lexer(QWEN_XML, scope()), qwen_xml),
    "seed_oss": (lambda: engine_lexer(SEED_OSS, scope()), seed_oss),
    "glm": (lambda: engine_lexer(GLM, scope()), glm),
    "minimax": (lambda: engine_lexer(MINIMAX, scope()), minimax),
}


def read(make, pieces):
    lexer = make()
    segments = []
    for piece in pieces:
        segments += lexer.feed(piece)
    segments += lexer.finish()
    calls, text = [], ""
    for seg in segments:
        if type(seg) is CallBegin:
            calls.append([seg.name, ""])
        elif type(seg) is CallArgs:
            calls[-1][1] += seg.text
        elif type(seg) is Text:
            text += seg.text
        else:
            assert type(seg) is CallEnd
    return [(name, json.loads(args)) for name, args in calls], text


def assert_every_split(make, text, expected):
    assert read(make, [text]) == expected
    for cut in range(1, len(text)):
        assert read(make, [text[:cut], text[cut:]]) == expected, cut
    assert read(make, list(text)) == expected


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_values_are_typed_by_the_schema_in_every_xml_and_key_value_dialect(dialect):
    make, block = DIALECTS[dialect]
    text = block([(k, v) for k, v, _ in VALUES])
    assert_every_split(make, text, ([("typed", EXPECTED)], ""))


def dsml_lexer():
    return DeepSeekLexer(scope())


def test_dsml_string_true_on_a_value_whose_schema_admits_no_string_is_typed():
    # DeepSeek-V3.2/V4 mark each parameter `string="true"` or `"false"`; the model's mark is a
    # guess, the client's schema is not: `string="true"` on an integer still gives the integer.
    # Where a string fits, the mark is kept: `null` marked string is the word (not None).
    text = dsml([(k, v) for k, v, _ in VALUES], "true")
    assert_every_split(dsml_lexer, text, ([("typed", {**EXPECTED, "sn": "null"})], ""))


def test_dsml_string_false_where_only_a_string_fits_stays_a_string():
    # `string="false"` says JSON; where the schema admits only a string, `null`, `true` and `42`
    # stay the model's words. With no schema the attribute decides (DeepSeek's encoding).
    expected = {**EXPECTED, "free": 42, "undeclared": True}
    text = dsml([(k, v) for k, v, _ in VALUES], "false")
    assert_every_split(dsml_lexer, text, ([("typed", expected)], ""))


def test_dsml_without_string_attribute_follows_the_schema_and_else_is_a_string():
    text = dsml([(k, v) for k, v, _ in VALUES], None)
    assert read(dsml_lexer, [text]) == ([("typed", EXPECTED)], "")


def test_dsml_value_that_reads_as_no_allowed_type_is_left_for_the_judge():
    # `many` is no integer: kept as the text the markup gives (a schema mismatch, noted)
    stats = RewriteStats()
    lexer = DeepSeekLexer(CallScope(RequestContext(tools=dict(TOOLS)), stats))
    out = lexer.feed(dsml([("n", "many")], "true")) + lexer.finish()
    assert [json.loads(s.text) for s in out if type(s) is CallArgs] == [{"n": "many"}]
    assert stats.problems
