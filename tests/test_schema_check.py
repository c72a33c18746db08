"""The compiled schema check in front of jsonschema (judge.py, `_fits`): it may only ever say
"fits" of arguments jsonschema finds no error in, takes only schemas that keep to the keywords
both libraries read alike, and leaves the judge's verdicts and notes as jsonschema alone makes
them."""

from __future__ import annotations

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolshim import judge as judge_module
from toolshim.calls import SCHEMA_MISMATCH, STRICT_FAILURE, CallScope, RewriteStats
from toolshim.judge import ToolCallJudge, _fits
from toolshim.schema import compact_json
from toolshim.tools import RequestContext, ToolSpec

KEYS = ["a", "b", "c"]
NUMBERS = [-1, 0, 1, 2, 5, 2**70, 0.0, 1.0, 1.5, 2.0, -0.5, 1e300]
STRINGS = ["", "x", "xy", "1", "é", "😀😀", "abc\n"]
DRAFTS = [
    None, "http://json-schema.org/draft-06/schema#", "http://json-schema.org/draft-07/schema#",
    "https://json-schema.org/draft/2019-09/schema", "https://json-schema.org/draft/2020-12/schema",
]  # fmt: skip
TYPES = ["null", "boolean", "integer", "number", "string", "array", "object"]

json_values = st.recursive(
    st.none() | st.booleans() | st.sampled_from(NUMBERS) | st.sampled_from(STRINGS),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.sampled_from(KEYS), children, max_size=3),
    max_leaves=8,
)
types = st.sampled_from(TYPES) | st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True)
sizes = st.integers(0, 3)
plain_schemas = st.booleans() | st.fixed_dictionaries(
    {},
    optional={
        "type": types, "minimum": st.sampled_from(NUMBERS[:6] + [1.5]), "maximum": st.sampled_from(NUMBERS[:6] + [1.5]),
        "minLength": sizes, "maxLength": sizes, "minItems": sizes, "maxItems": sizes, "minProperties": sizes, "maxProperties": sizes,
        "enum": st.lists(st.sampled_from(["", "x", "xy", None]), min_size=1, max_size=3, unique=True),
        "const": st.sampled_from(["x", "", None]), "required": st.lists(st.sampled_from(KEYS), max_size=3, unique=True),
        "title": st.just("a title"), "description": st.just("what it is"), "default": json_values,
        "format": st.sampled_from(["email", "date-time", "uri"]), "examples": st.lists(json_values, max_size=2),
    },
)  # fmt: skip
schemas = st.recursive(
    plain_schemas,
    lambda children: st.fixed_dictionaries(
        {},
        optional={
            "type": types, "properties": st.dictionaries(st.sampled_from(KEYS), children, max_size=3),
            "additionalProperties": children, "items": children, "required": st.lists(st.sampled_from(KEYS), max_size=3, unique=True),
            "anyOf": st.lists(children, min_size=1, max_size=3), "allOf": st.lists(children, min_size=1, max_size=3),
        },
    ),  # fmt: skip
    max_leaves=6,
)


def jsonschema_fits(schema, instance) -> bool:
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema).is_valid(instance)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas, draft=st.sampled_from(DRAFTS), instances=st.lists(json_values, min_size=1, max_size=6))
def test_the_compiled_check_says_fits_only_of_what_jsonschema_finds_no_error_in(schema, draft, instances):
    if isinstance(schema, dict) and draft is not None:
        schema = {"$schema": draft, **schema}
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError:
        return  # (the judge validates nothing then: no check is made)
    fits = _fits(schema) if isinstance(schema, dict) else None
    for instance in instances:
        if fits is not None and fits(instance):
            assert jsonschema_fits(schema, instance), (schema, instance)


@pytest.mark.parametrize(
    "schema, fitting, misfit",
    [
        ({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}, {"command": "ls"}, {"command": 1}),
        ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}, "additionalProperties": False}, {"n": 1.0}, {"n": True}),
        ({"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}}}, {"tags": ["a"]}, {"tags": ["c"]}),
        ({"anyOf": [{"type": "string"}, {"type": "null"}], "description": "Optional[str]"}, None, 0),
        ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "properties": {"a": {"const": "x"}}}, {"a": "x"}, {"a": "y"}),
    ],
)
def test_schemas_within_the_shared_keywords_are_checked_by_the_compiled_check(schema, fitting, misfit):
    fits = _fits(schema)
    assert fits is not None
    assert fits(fitting) and jsonschema_fits(schema, fitting)
    assert not fits(misfit) and not jsonschema_fits(schema, misfit)


@pytest.mark.parametrize(
    "schema, instance",
    [
        ({"multipleOf": 0.01}, 0.07),  # fastjsonschema finds 0.07 a multiple of 0.01; jsonschema does not
        ({"not": {"type": "string"}}, 1),
        ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "x"),
        ({"enum": [1, "x"]}, 1),  # (`==` reads True as 1)
        ({"const": 1}, 1),
        ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"}, 1),  # (1.0 is no integer there)
        ({"exclusiveMinimum": 0}, 1),
        ({"pattern": "^a$"}, "a"),
        ({"properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {"A": {"type": "string"}}}, {"a": "x"}),
        ({"prefixItems": [{"type": "string"}]}, ["x"]),
        ({"uniqueItems": True}, [1]),
        ({"anyOf": [{"type": "string"}, {"multipleOf": 0.01}]}, 0.07),  # (and in any part of a schema)
        ({"allOf": [{"type": "number"}, {"multipleOf": 0.01}]}, 0.07),
        ({"type": "array", "items": {"multipleOf": 0.01}}, [0.07]),
        ({"type": "object", "additionalProperties": {"multipleOf": 0.01}}, {"p": 0.07}),
        ({"type": "object", "nullable": True}, {}),  # (a keyword neither reads: left to jsonschema all the same)
        ({"$schema": "https://example.com/my-draft", "type": "object"}, {}),
    ],
)
def test_schemas_beyond_the_shared_keywords_are_left_to_jsonschema(schema, instance):
    assert _fits(schema) is None


def test_a_misfit_the_compiled_check_would_miss_is_still_noted():
    """The reason for the keyword list: `multipleOf` on floats, where fastjsonschema says "fits"
    and jsonschema does not: the judge notes jsonschema's verdict."""
    judge = make_judge({"price": {"type": "object", "properties": {"p": {"type": "number", "multipleOf": 0.01}}}})
    assert judge.schema_error(judge.scope.tools["price"], {"p": 0.07}) == "p: 0.07 is not a multiple of 0.01"


def test_defaults_are_not_written_into_the_arguments():
    schema = {"type": "object", "properties": {"mode": {"type": "string", "default": "fast"}}}
    arguments = {}
    assert _fits(schema)(arguments) and arguments == {}
    judge = make_judge({"run": schema})
    calls = judge.verdict('{"name": "run", "arguments": {}}')
    assert calls == [("run", "{}", None)]


def test_fitting_arguments_skip_jsonschema_and_misfits_get_its_message(monkeypatch):
    asked = []
    real = judge_module.best_match
    monkeypatch.setattr(judge_module, "best_match", lambda errors: asked.append(1) or real(errors))
    judge = make_judge({"bash": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}})
    spec = judge.scope.tools["bash"]
    assert judge.schema_error(spec, {"command": "ls"}) is None and not asked
    assert judge.schema_error(spec, {}) == "(root): 'command' is a required property" and len(asked) == 1


VERDICT_TOOLS = {
    "bash": ({"type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "integer", "minimum": 1}}, "required": ["command"]}, False),
    "strict_bash": ({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"], "additionalProperties": False}, True),
    "pick": ({"type": "object", "properties": {"which": {"enum": ["a", "b"]}, "n": {"multipleOf": 0.5}}}, False),
    "refs": ({"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {"A": {"type": "string"}}}, True),
}
VERDICT_ARGUMENTS = [
    {"command": "ls"}, {"command": 1}, {}, {"command": "ls", "timeout": 0}, {"command": "ls", "timeout": 2.0}, {"command": "ls", "extra": True},
    {"which": "a", "n": 1.5}, {"which": "c"}, {"n": 0.3}, {"a": "x"}, {"a": 2}, {"timeout": True, "command": "x"},
]  # fmt: skip


@pytest.mark.parametrize("name", list(VERDICT_TOOLS))
def test_verdicts_and_notes_are_jsonschema_s_with_the_compiled_check_on_or_off(name, monkeypatch):
    def verdicts() -> list:
        judge_module._compiled_validator.cache_clear()
        out = []
        for arguments in VERDICT_ARGUMENTS:
            judge = make_judge({name: VERDICT_TOOLS[name][0]}, strict=VERDICT_TOOLS[name][1])
            calls = judge.verdict(compact_json({"name": name, "arguments": arguments}))
            out.append((calls, dict(judge.scope.stats.problems), list(judge.scope.stats.notes)))
        return out

    with_check = verdicts()
    monkeypatch.setattr(judge_module, "FAST_SCHEMA_CHECK", False)
    without = verdicts()
    judge_module._compiled_validator.cache_clear()
    assert with_check == without
    problems = [problems for _, problems, _ in with_check]
    assert any(SCHEMA_MISMATCH in p or STRICT_FAILURE in p for p in problems)  # (misfits among them)
    assert any(not p for p in problems)  # (and fits)


def make_judge(schemas: dict, strict: bool = False) -> ToolCallJudge:
    tools = {name: ToolSpec(name, schema, strict=strict) for name, schema in schemas.items()}
    return ToolCallJudge(CallScope(RequestContext(tools=tools), RewriteStats()))


def test_names_and_values_in_a_schema_are_data_to_the_compiled_check(tmp_path):
    """fastjsonschema writes the schema into Python source it runs: a client's property names,
    enums and descriptions must stay strings there."""
    touched = tmp_path / "touched"
    payloads = [
        f'a"]: pass\nimport pathlib; pathlib.Path({str(touched)!r}).touch()\n#',
        f"a'); __import__('pathlib').Path({str(touched)!r}).touch(); ('",
        f'a\\"; __import__("pathlib").Path({str(touched)!r}).touch(); "',
        "{}}}{{ \x00\n\r\t",
    ]
    for payload in payloads:
        schema = {"type": "object", "properties": {payload: {"type": "string", "enum": [payload], "description": payload}}, "required": [payload]}
        fits = _fits(schema)
        assert fits is not None
        assert fits({payload: payload}) and not fits({payload: "other"}) and not fits({})
    assert not touched.exists()
