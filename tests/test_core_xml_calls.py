"""The XML-like dialects (Qwen3-Coder, GLM, MiniMax): one test per rule, then the peers' samples
fed whole, at every two-piece split and character by character."""

from __future__ import annotations

from functools import partial

import json
import re

import pytest

from toolshim.calls import (
    NOT_ALLOWED,
    SCHEMA_MISMATCH,
    STRICT_FAILURE,
    UNKNOWN_NAME,
    CallScope,
    RewriteStats,
)
from toolshim.lexers.base import CallArgs, CallBegin, CallEnd, ChainLexer, Text
from toolshim.schema import coerce_value
from toolshim.lexers.engine import lexer
from toolshim.lexers.specs import GLM, HERMES, MINIMAX, QWEN_XML

HermesLexer, QwenXmlLexer, GlmLexer, MiniMaxLexer = (partial(lexer, spec) for spec in (HERMES, QWEN_XML, GLM, MINIMAX))
from toolshim.tools import RequestContext, ToolSpec

STRINGS = lambda *names: {"type": "object", "properties": {n: {"type": "string"} for n in names}}  # noqa: E731
AREA = {
    "type": "object",
    "properties": {"shape": {"type": "string"}, "dimensions": {"type": "object"}, "precision": {"type": "integer"}},
}
TYPED = {
    "type": "object",
    "properties": {
        "n": {"type": "integer"},
        "x": {"type": "number"},
        "flag": {"type": "boolean"},
        "tags": {"type": "array"},
        "opt": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "s": {"type": "string"},
    },
}
TOOLS = {
    "get_current_weather": ToolSpec("get_current_weather", STRINGS("city", "state", "unit")),
    "calculate_area": ToolSpec("calculate_area", AREA),
    "Finish": ToolSpec("Finish", STRINGS("answer")),
    "get_weather": ToolSpec("get_weather", STRINGS("city", "date")),
    "get_time": ToolSpec("get_time", {"type": "object", "properties": {}}),
    "typed": ToolSpec("typed", TYPED),
    "write_file": ToolSpec("write_file", STRINGS("path", "content")),
    "free": ToolSpec("free", None),
    "strict_weather": ToolSpec(
        "strict_weather",
        {"type": "object", "properties": {"days": {"type": "integer"}}, "required": ["days"], "additionalProperties": False},
        strict=True,
    ),
}
ID = "<id>"  # minted ids are random: compared separately


def make_scope(tools=TOOLS, **context) -> CallScope:
    return CallScope(RequestContext(tools=dict(tools), **context), RewriteStats())


def merge(segments):
    """Join neighbouring text and argument pieces, and hide the random ids."""
    merged = []
    for seg in segments:
        if isinstance(seg, CallBegin):
            seg = CallBegin(ID, seg.name)
        if merged and type(seg) in (Text, CallArgs) and type(merged[-1]) is type(seg):
            merged[-1] = type(seg)(merged[-1].text + seg.text)
        else:
            merged.append(seg)
    return merged


def run(lexer, text: str, pieces: list[str] | None = None):
    segments = []
    for piece in pieces if pieces is not None else [text]:
        segments += lexer.feed(piece)
    segments += lexer.finish()
    return merge(segments)


def qwen(text, scope=None, pieces=None, **kwargs):
    return run(QwenXmlLexer(scope or make_scope(), **kwargs), text, pieces)


def glm(text, scope=None, pieces=None, **kwargs):
    return run(GlmLexer(scope or make_scope(), **kwargs), text, pieces)


def minimax(text, scope=None, pieces=None, **kwargs):
    return run(MiniMaxLexer(scope or make_scope(), **kwargs), text, pieces)


def call(name, args):
    return [CallBegin(ID, name), CallArgs(json.dumps(args, separators=(",", ":"), ensure_ascii=False)), CallEnd()]


def qwen_block(name, params: dict[str, str], wrapped=True) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    function = f"<function={name}>\n{body}</function>"
    return f"<tool_call>\n{function}\n</tool_call>" if wrapped else function


# -- typing values by schema ----------------------------------------------------------------------


def test_strings_stay_strings_and_no_schema_means_string():
    assert coerce_value(" 42 ", {"type": "string"}) == " 42 "
    assert coerce_value("null", {"type": "string"}) == "null"
    assert coerce_value("42", None) == "42"
    assert coerce_value('{"a": 1}', {}) == '{"a": 1}'  # `{}` says nothing: the text
    assert coerce_value("[1]", {"$ref": "#/defs/x"}) == "[1]"


def test_integers_and_numbers():
    assert coerce_value(" 42\n", {"type": "integer"}) == 42
    assert coerce_value("-7", {"type": "integer"}) == -7
    assert coerce_value("5.0", {"type": "integer"}) == 5
    assert coerce_value("5.5", {"type": "integer"}) == "5.5"  # no integer: the text, for the judge
    assert coerce_value("2", {"type": "number"}) == 2 and isinstance(coerce_value("2", {"type": "number"}), int)
    assert coerce_value("2.5e1", {"type": "number"}) == 25.0
    assert coerce_value("1e999", {"type": "number"}) == "1e999"
    assert coerce_value("nan", {"type": "number"}) == "nan"
    assert coerce_value("123456789012345678901234567890", {"type": "integer"}) == 123456789012345678901234567890


def test_booleans_only_true_and_false():
    assert coerce_value("true", {"type": "boolean"}) is True
    assert coerce_value("False", {"type": "boolean"}) is False  # Jinja prints Python's spelling
    assert coerce_value("yes", {"type": "boolean"}) == "yes"


def test_objects_and_arrays_json_then_python_literal():
    assert coerce_value('{"width": 10, \n "height": 20}', {"type": "object"}) == {"width": 10, "height": 20}
    assert coerce_value("{'k': 'v', 't': (1, 2)}", {"type": "object"}) == {"k": "v", "t": [1, 2]}
    assert coerce_value('"{\'k\': 1}"', {"type": "object"}) == {"k": 1}  # double-encoded repr
    assert coerce_value("[1, 'a', None, True]", {"type": "array"}) == [1, "a", None, True]
    assert coerce_value("[1, 2]", {"type": "object"}) == "[1, 2]"  # not an allowed type: the text
    assert coerce_value("{1, 2}", {"type": "array"}) == "{1, 2}"  # a set is no JSON
    assert coerce_value("not json", {"type": "object"}) == "not json"


def test_null_and_unions():
    nullable = {"anyOf": [{"type": "string"}, {"type": "null"}]}
    assert coerce_value("null", nullable) is None
    assert coerce_value("None", nullable) is None
    assert coerce_value("text", nullable) == "text"
    assert coerce_value("null", {"type": "integer"}) is None
    assert coerce_value("3", {"type": ["integer", "null"]}) == 3
    # where string is allowed the text is always valid: kept as written
    assert coerce_value("02139", {"type": ["string", "integer"]}) == "02139"
    assert coerce_value("7", {"oneOf": [{"type": "integer"}, {"type": "array"}]}) == 7
    assert coerce_value("[7]", {"oneOf": [{"type": "integer"}, {"type": "array"}]}) == [7]
    assert coerce_value("2", {"enum": [1, 2, 3]}) == 2
    assert coerce_value("[1]", {"items": {"type": "integer"}}) == [1]
    assert coerce_value("3", {"type": "int"}) == 3  # hand-written alias


def test_values_are_typed_by_the_tools_schema_in_a_call():
    text = qwen_block("typed", {"n": "42", "x": "1.5", "flag": "true", "tags": '["a", "b"]', "opt": "null", "s": "007"})
    assert qwen(text) == call("typed", {"n": 42, "x": 1.5, "flag": True, "tags": ["a", "b"], "opt": None, "s": "007"})


# -- Qwen3-Coder ---------------------------------------------------------------------------------


def test_qwen_call_with_text_before_and_after():
    block = qwen_block("get_weather", {"city": "Oslo"})
    assert qwen(f"Checking.\n{block}\nDone.") == [Text("Checking.")] + call("get_weather", {"city": "Oslo"}) + [Text("\nDone.")]


def test_qwen_values_lose_one_newline_on_each_side_only():
    text = "<tool_call>\n<function=write_file>\n<parameter=content>\n\n  x  \n\n</parameter>\n</function>\n</tool_call>"
    assert qwen(text) == call("write_file", {"content": "\n  x  \n"})
    # GLM-like compact spelling: nothing to strip
    assert qwen("<tool_call><function=write_file><parameter=content>x</parameter></function></tool_call>") == call("write_file", {"content": "x"})


def test_qwen_arguments_keep_the_order_of_appearance_and_unicode():
    text = qwen_block("get_current_weather", {"unit": "°C", "city": "Zürich"})
    assert qwen(text) == [CallBegin(ID, "get_current_weather"), CallArgs('{"unit":"°C","city":"Zürich"}'), CallEnd()]


def test_qwen_missing_parameter_close_is_closed_by_the_next_parameter_or_the_function_end():
    text = "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n<parameter=state>\nTX\n</function>\n</tool_call>"
    assert qwen(text) == call("get_current_weather", {"city": "Dallas", "state": "TX"})
    bare = "<function=get_current_weather>\n<parameter=city>\nDallas\n</function>"
    assert qwen(bare) == call("get_current_weather", {"city": "Dallas"})


def test_qwen_bare_function_without_wrapper():
    text = "Sure. " + qwen_block("get_weather", {"city": "Rome"}, wrapped=False) + "\nAnything else?"
    assert qwen(text) == [Text("Sure.")] + call("get_weather", {"city": "Rome"}) + [Text("\nAnything else?")]


def test_qwen_function_without_parameters_is_empty_arguments():
    assert qwen("<tool_call>\n<function=get_time>\n</function>\n</tool_call>") == call("get_time", {})


def test_qwen_several_functions_in_one_wrapper_and_several_blocks():
    one = "<tool_call>\n" + qwen_block("get_weather", {"city": "A"}, False) + "\n" + qwen_block("get_time", {}, False) + "\n</tool_call>"
    two = qwen_block("get_weather", {"city": "B"})
    assert qwen(f"{one}\n{two}") == call("get_weather", {"city": "A"}) + call("get_time", {}) + call("get_weather", {"city": "B"})


def test_qwen_closing_tags_inside_a_value_stay_in_the_value():
    content = "x = '</parameter>' if a </function> else 1\n</parameter> is how a value ends\n</tool_call>"
    assert qwen(qwen_block("write_file", {"path": "a.py", "content": content})) == call("write_file", {"path": "a.py", "content": content})


def test_qwen_a_whole_example_call_inside_a_value_stays_in_the_value():
    example = qwen_block("get_current_weather", {"city": "Dallas", "state": "TX"})  # lines of markup
    content = f"# Format\n\n{example}\n\nThat is all."
    text = qwen_block("write_file", {"content": content, "path": "doc.md"})
    assert qwen(text) == call("write_file", {"content": content, "path": "doc.md"})


def test_qwen_a_stray_literal_parameter_line_does_not_hide_the_function_end():
    content = "see\n<parameter=x>\nmore"  # never closed: swallows the real `</parameter>`
    assert qwen(qwen_block("write_file", {"content": content})) == call("write_file", {"content": content})
    bare = qwen_block("write_file", {"content": content}, wrapped=False)
    assert qwen(bare + " ok") == call("write_file", {"content": content}) + [Text(" ok")]


def test_qwen_parameter_tag_at_line_start_closes_the_value_only_for_a_new_property():
    # `path` is a property not given yet: the missing `</parameter>`; `content` was given: literal
    text = "<function=write_file>\n<parameter=content>\nA\n<parameter=content>\nB\n</parameter>\n</parameter>\n<parameter=path>\np\n</parameter>\n</function>"
    assert qwen(text) == call("write_file", {"content": "A\n<parameter=content>\nB\n</parameter>", "path": "p"})
    # a tool without properties takes any name not given yet
    text = "<function=free>\n<parameter=a>\n1\n<parameter=b>\n2\n</parameter>\n</function>"
    assert qwen(text) == call("free", {"a": "1", "b": "2"})


def test_qwen_prose_mentioning_the_tags_stays_text_and_streams_live():
    lexer = QwenXmlLexer(make_scope())
    assert merge(lexer.feed("To call it, use <function=get_weather> tags")) == [Text("To call it, use <function=get_weather> tags")]
    assert merge(lexer.feed(" or <tool_call> blocks")) == [Text(" or <tool_call> blocks")]
    assert merge(lexer.feed(" like <function=a b>.")) == [Text(" like <function=a b>.")]
    assert lexer.finish() == [] and lexer.idle


def test_qwen_releases_a_hermes_or_glm_block_at_once():
    lexer = QwenXmlLexer(make_scope())
    assert merge(lexer.feed("<tool_call>\n")) == []  # the next character decides
    assert merge(lexer.feed('{"name": "get_weather"')) == [Text('<tool_call>\n{"name": "get_weather"')]
    assert merge(lexer.feed("}</tool_call> <tool_call>get_weather\n")) == [Text("}</tool_call> <tool_call>get_weather\n")]
    assert lexer.finish() == [] and lexer.idle
    # Llama's `<function=NAME>{json}</function>` is not Qwen's either
    text = '<function=get_weather>{"city": "Oslo"}</function>'
    assert qwen(text) == [Text(text)]


def test_qwen_thinking_sample_keeps_the_text_around_the_block():
    text = "<think>verify result\n<tool_call>\n<function=Finish>\n<parameter=answer>\n204\n</parameter>\n</function>\n</tool_call></think>Here is the answer."
    assert qwen(text) == [Text("<think>verify result")] + call("Finish", {"answer": "204"}) + [Text("</think>Here is the answer.")]


# -- GLM -----------------------------------------------------------------------------------------


def test_glm_call_with_newlines_and_without_them():
    text = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n</tool_call>"
    assert glm(text) == call("get_weather", {"city": "Beijing"})
    text47 = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value><arg_key>date</arg_key><arg_value>2025-08-01</arg_value></tool_call>"
    assert glm(text47) == call("get_weather", {"city": "Beijing", "date": "2025-08-01"})


def test_glm_call_without_arguments_is_empty_arguments():
    assert glm("<tool_call>get_time\n</tool_call>") == call("get_time", {})
    assert glm("<tool_call>get_time</tool_call>") == call("get_time", {})


def test_glm_values_are_written_as_they_are_and_typed_by_schema():
    text = "<tool_call>typed\n<arg_key>n</arg_key>\n<arg_value>12</arg_value>\n<arg_key>s</arg_key>\n<arg_value>\n a \n</arg_value>\n<arg_key>tags</arg_key>\n<arg_value>[1, 2]</arg_value>\n</tool_call>"
    assert glm(text) == call("typed", {"n": 12, "s": "\n a \n", "tags": [1, 2]})


def test_glm_value_close_inside_a_value_stays_in_the_value():
    content = "a </arg_value> b\n</arg_value>\nc"
    text = f"<tool_call>write_file\n<arg_key>content</arg_key>\n<arg_value>{content}</arg_value>\n</tool_call>"
    assert glm(text) == call("write_file", {"content": content})


def test_glm_releases_prose_hermes_and_qwen_blocks_at_once():
    lexer = GlmLexer(make_scope())
    assert merge(lexer.feed("Use <tool_call> tags, like")) == [Text("Use <tool_call> tags, like")]
    assert merge(lexer.feed(" <tool_call>\n{")) == [Text(" <tool_call>\n{")]
    assert merge(lexer.feed("} <tool_call>\n<function=x>")) == [Text("} <tool_call>\n<function=x>")]
    assert merge(lexer.feed(" <tool_call>name is here")) == [Text(" <tool_call>name is here")]
    assert lexer.finish() == [] and lexer.idle


def test_glm_next_block_closes_a_block_missing_its_end_tag():
    text = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>A</arg_value>\n<tool_call>get_time</tool_call>"
    assert glm(text) == call("get_weather", {"city": "A"}) + call("get_time", {})


# -- MiniMax -------------------------------------------------------------------------------------


def test_minimax_several_invokes_are_several_calls():
    text = (
        "<minimax:tool_call>\n"
        '<invoke name="get_weather">\n<parameter name="city">Seattle</parameter>\n</invoke>\n'
        "<invoke name='get_time'>\n</invoke>\n"
        "</minimax:tool_call>"
    )
    assert minimax(text) == call("get_weather", {"city": "Seattle"}) + call("get_time", {})


def test_minimax_values_typed_and_missing_parameter_close():
    text = '<minimax:tool_call>\n<invoke name="typed">\n<parameter name="n">\n3\n</parameter>\n<parameter name="flag">false</invoke>\n</minimax:tool_call>'
    assert minimax(text) == call("typed", {"n": 3, "flag": False})


def test_minimax_prose_stays_text():
    text = "The <minimax:tool_call> tag opens a block; <invoke name=x> too."
    assert minimax(text) == [Text(text)]
    assert minimax(text, pieces=list(text)) == [Text(text)]


# -- what stays text (every dialect) ---------------------------------------------------------------

UNKNOWN = {
    "qwen": (qwen, qwen_block("rm_rf", {"path": "/"})),
    "glm": (glm, "<tool_call>rm_rf\n<arg_key>path</arg_key>\n<arg_value>/</arg_value>\n</tool_call>"),
    "minimax": (minimax, '<minimax:tool_call>\n<invoke name="rm_rf">\n<parameter name="path">/</parameter>\n</invoke>\n</minimax:tool_call>'),
}


@pytest.mark.parametrize("dialect", UNKNOWN)
def test_undeclared_name_stays_text_exactly_and_is_noted(dialect):
    lex, block = UNKNOWN[dialect]
    scope = make_scope()
    text = f"Hi \n{block}\n bye"
    assert lex(text, scope) == [Text(text)]
    assert scope.stats.problems[UNKNOWN_NAME] == 1 and scope.stats.calls == 0


def test_one_undeclared_function_keeps_the_whole_wrapper_text():
    text = "<tool_call>\n" + qwen_block("get_time", {}, False) + "\n" + qwen_block("rm_rf", {}, False) + "\n</tool_call>"
    assert qwen(text) == [Text(text)]


def test_no_declared_tools_means_no_calls_and_nothing_held():
    text = qwen_block("get_weather", {"city": "NYC"})
    for cls in (QwenXmlLexer, GlmLexer, MiniMaxLexer):
        lexer = cls(make_scope({}))
        assert lexer.feed(text[:15]) == [Text(text[:15])] and lexer.idle


def test_strict_tool_fitting_is_a_call_not_fitting_stays_text():
    scope = make_scope()
    assert qwen(qwen_block("strict_weather", {"days": "3"}), scope) == call("strict_weather", {"days": 3})
    bad = qwen_block("strict_weather", {"days": "three"})
    assert qwen(bad, scope) == [Text(bad)]
    extra = "<tool_call>strict_weather<arg_key>days</arg_key><arg_value>3</arg_value><arg_key>x</arg_key><arg_value>1</arg_value></tool_call>"
    assert glm(extra, scope) == [Text(extra)]
    assert scope.stats.problems[STRICT_FAILURE] == 2 and scope.stats.calls == 1


def test_non_strict_schema_mismatch_is_emitted_and_noted():
    scope = make_scope()
    assert qwen(qwen_block("typed", {"n": "many"}), scope) == call("typed", {"n": "many"})
    assert scope.stats.problems[SCHEMA_MISMATCH] == 1 and scope.stats.calls == 1


def test_tool_choice_none_and_parallel_tool_calls_false():
    scope = make_scope(tool_choice_none=True)
    block = qwen_block("get_time", {})
    assert qwen(block, scope) == [Text(block)]
    assert scope.stats.problems[NOT_ALLOWED] == 1
    scope = make_scope(parallel_tool_calls=False)
    assert qwen(f"{block}\n{block}", scope) == call("get_time", {}) + [Text(f"\n{block}")]
    both = '<minimax:tool_call><invoke name="get_time"></invoke><invoke name="get_time"></invoke></minimax:tool_call>'
    assert minimax(both, make_scope(parallel_tool_calls=False)) == [Text(both)]  # all or nothing


# -- blocks that do not end properly ---------------------------------------------------------------


def test_unclosed_wrapper_after_a_complete_function_is_a_call_at_finish():
    body = "<tool_call>\n" + qwen_block("get_weather", {"city": "X"}, False)
    assert qwen("Sure. " + body + "\n") == [Text("Sure.")] + call("get_weather", {"city": "X"})
    assert qwen(body + "\n</tool_c") == call("get_weather", {"city": "X"})  # an end tag cut short
    # `</parameter>` and `</function>` missing too: the end of the text confirms `</function>`
    assert qwen("<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</function>") == call("get_weather", {"city": "X"})
    mm = '<minimax:tool_call><invoke name="get_weather"><parameter name="city">X</parameter></invoke>'
    assert minimax(mm) == call("get_weather", {"city": "X"})
    assert glm("<tool_call>get_weather<arg_key>city</arg_key><arg_value>X</arg_value>\n") == call("get_weather", {"city": "X"})


def test_unclosed_block_without_a_complete_function_is_text_at_finish():
    for lex, text in [
        (qwen, "Sure. <tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n"),
        (qwen, "<function=get_weather>\n<parameter=city>\nX"),
        (qwen, "<tool_call>\n<funct"),
        (glm, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>X"),
        (glm, "<tool_call>get_time\n"),
        (minimax, '<minimax:tool_call><invoke name="get_weather"><parameter name="city">X</parameter>'),
    ]:
        assert lex(text) == [Text(text)], text


def test_next_wrapper_closes_a_wrapper_missing_its_end_tag():
    first = "<tool_call>\n" + qwen_block("get_weather", {"city": "A"}, False)
    assert qwen(first + "\n" + qwen_block("get_time", {})) == call("get_weather", {"city": "A"}) + call("get_time", {})
    # prose after a function whose wrapper never closes: the call, then the prose (issue 20
    # item 2: text inside a section after a call is shown in its place; vLLM makes the call too)
    text = first + "\nand then"
    assert qwen(text) == call("get_weather", {"city": "A"}) + [Text("\nand then")]


@pytest.mark.parametrize("lex", [qwen, glm, minimax])
def test_block_over_the_cap_is_released_as_text(lex):
    text = {
        qwen: qwen_block("write_file", {"content": "x" * 200}),
        glm: f"<tool_call>write_file<arg_key>content</arg_key><arg_value>{'x' * 200}</arg_value></tool_call>",
        minimax: f'<minimax:tool_call><invoke name="write_file"><parameter name="content">{"x" * 200}</parameter></invoke></minimax:tool_call>',
    }[lex]
    assert lex(text, max_held=100) == [Text(text)]
    assert lex(text, pieces=[text[i : i + 7] for i in range(0, len(text), 7)], max_held=100) == [Text(text)]
    assert lex(text, pieces=list(text), max_held=100) == [Text(text)]
    assert lex(text, max_held=len(text)) == call("write_file", {"content": "x" * 200})
    assert lex(text, pieces=list(text), max_held=len(text)) == call("write_file", {"content": "x" * 200})
    assert lex(text, max_held=len(text) - 1) == [Text(text)]


@pytest.mark.parametrize("make", [QwenXmlLexer, GlmLexer, MiniMaxLexer], ids=["qwen", "glm", "minimax"])
def test_a_value_that_passes_the_cap_is_released_as_it_streams(make):
    """A value's pieces with no tag in them are held without the steps' machinery
    (`BlockLexer.feed`): the cap still releases the block at its character, mid-value, however
    the value comes, and what follows streams live."""
    text = {
        QwenXmlLexer: qwen_block("write_file", {"content": "x" * 200}),
        GlmLexer: f"<tool_call>write_file<arg_key>content</arg_key><arg_value>{'x' * 200}</arg_value></tool_call>",
        MiniMaxLexer: f'<minimax:tool_call><invoke name="write_file"><parameter name="content">{"x" * 200}</parameter></invoke></minimax:tool_call>',
    }[make]
    mid_value = text.index("x" * 200) + 150
    for size in (1, 7, 40):
        lx = make(make_scope(), max_held=100)
        out = []
        for at in range(0, mid_value, size):
            out += lx.feed(text[at : min(at + size, mid_value)])
            if at + size >= 101:  # the block's 101st character has come: all of it is out
                assert merge(out) == [Text(text[: min(at + size, mid_value)])], (size, at)
        assert lx.idle


def test_cap_applies_to_a_name_that_never_ends():
    text = "<tool_call>\n<function=" + "a" * 300
    assert qwen(text) == [Text(text)]
    lexer = QwenXmlLexer(make_scope())
    assert merge(lexer.feed(text)) == [Text(text)]  # longer than any name: released at once


# -- whitespace ----------------------------------------------------------------------------------


def test_whitespace_around_calls_is_padding():
    a = qwen_block("get_time", {})
    assert qwen(f"Plan: \n{a}\n\n{a}\n\n") == [Text("Plan:")] + call("get_time", {}) * 2
    assert qwen(f"{a}\n\nThe answer") == call("get_time", {}) + [Text("\n\nThe answer")]


def test_whitespace_around_text_blocks_is_kept_exactly():
    text = f"Plan: \n{qwen_block('rm_rf', {})}\n more"
    assert qwen(text) == [Text(text)]


def test_whitespace_sent_in_an_earlier_piece_stays_sent():
    lexer = QwenXmlLexer(make_scope())
    assert lexer.feed("Plan: \n") == [Text("Plan: \n")]
    assert merge(lexer.feed(qwen_block("get_time", {})) + lexer.finish()) == call("get_time", {})


# -- reuse ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "block", "held"),
    [
        (QwenXmlLexer, qwen_block("get_time", {}), ["<tool_c", "<tool_call>\n<function=get_t", "x<function=get_time>\n<parameter=a>\n1", ""]),
        (GlmLexer, "<tool_call>get_time</tool_call>", ["<tool", "<tool_call>get_", "<tool_call>get_time<arg_key>a</arg_key><arg_value>1</arg_value>"]),
        (MiniMaxLexer, '<minimax:tool_call><invoke name="get_time"></invoke></minimax:tool_call>', ["<minimax:to", '<minimax:tool_call><invoke name="g']),
    ],
)
def test_finish_leaves_the_lexer_as_new(cls, block, held):
    lexer = cls(make_scope())
    for piece in held:
        lexer.feed(piece)
        lexer.finish()
        assert lexer.idle
        assert merge(lexer.feed("hi " + block) + lexer.finish()) == [Text("hi")] + call("get_time", {})


def test_minted_ids_are_openai_shaped_and_unique():
    lexer = QwenXmlLexer(make_scope())
    out = lexer.feed(qwen_block("get_time", {}) * 20) + lexer.finish()
    ids = [seg.id for seg in out if isinstance(seg, CallBegin)]
    assert len(ids) == 20 and len(set(ids)) == 20
    assert all(re.fullmatch(r"call_[A-Za-z0-9]{24}", i) for i in ids)


# -- sharing `<tool_call>` with the JSON dialect -----------------------------------------------------

HERMES = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "NYC"}}\n</tool_call>\nDone.'
QWEN = "Let me check.\n" + qwen_block("get_weather", {"city": "NYC"}) + "\nDone."
GLM = "Let me check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>NYC</arg_value>\n</tool_call>\nDone."
NYC = [Text("Let me check.")] + call("get_weather", {"city": "NYC"}) + [Text("\nDone.")]

CHAINS = {
    "hermes>qwen": lambda s: ChainLexer(HermesLexer(s), QwenXmlLexer(s)),
    "qwen>hermes": lambda s: ChainLexer(QwenXmlLexer(s), HermesLexer(s)),
    "hermes>qwen>glm": lambda s: ChainLexer(HermesLexer(s), ChainLexer(QwenXmlLexer(s), GlmLexer(s))),
    "glm>qwen>hermes": lambda s: ChainLexer(GlmLexer(s), ChainLexer(QwenXmlLexer(s), HermesLexer(s))),
}


@pytest.mark.parametrize("chain", CHAINS)
@pytest.mark.parametrize("text", [HERMES, QWEN, GLM], ids=["hermes", "qwen", "glm"])
def test_chained_dialects_leave_each_others_blocks_intact(chain, text):
    if "glm" not in chain and text is GLM:
        # without a GLM lexer the GLM block is text, exactly as written
        assert run(CHAINS[chain](make_scope()), text) == [Text(text)]
        return
    assert run(CHAINS[chain](make_scope()), text) == NYC
    assert loosely(run(CHAINS[chain](make_scope()), text, list(text))) == NYC


def test_chained_dialects_in_one_stream():
    text = HERMES + "\n" + QWEN + "\n" + GLM
    expected = [Text("Let me check.")] + call("get_weather", {"city": "NYC"}) + [Text("\nDone.\nLet me check.")]
    expected += call("get_weather", {"city": "NYC"}) + [Text("\nDone.\nLet me check.")] + call("get_weather", {"city": "NYC"}) + [Text("\nDone.")]
    for make in (CHAINS["hermes>qwen>glm"], CHAINS["glm>qwen>hermes"]):
        assert run(make(make_scope()), text) == expected


# -- the peers' samples, whole and at every split ----------------------------------------------------

# From tests/data/peer_samples.jsonl (vLLM's test suites), with the calls they expect.
SAMPLES = {
    "qwen3_coder single_tool": (
        qwen,
        "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nTX\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n</function>\n</tool_call>",
        call("get_current_weather", {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}),
    ),
    "qwen3_coder multiline typed": (
        qwen,
        '<tool_call>\n<function=calculate_area>\n<parameter=shape>\nrectangle\n</parameter>\n<parameter=dimensions>\n{"width": 10, \n "height": 20}\n</parameter>\n<parameter=precision>\n2\n</parameter>\n</function>\n</tool_call>',
        call("calculate_area", {"shape": "rectangle", "dimensions": {"width": 10, "height": 20}, "precision": 2}),
    ),
    "qwen3_coder no wrapper": (
        qwen,
        "<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n<parameter=state>\nTX\n</parameter>\n</function>",
        call("get_current_weather", {"city": "Dallas", "state": "TX"}),
    ),
    "qwen3_coder+think": (
        qwen,
        "<think>verify result\n<tool_call>\n<function=Finish>\n<parameter=answer>\n204\n</parameter>\n</function>\n</tool_call></think>Here is the answer.",
        [Text("<think>verify result")] + call("Finish", {"answer": "204"}) + [Text("</think>Here is the answer.")],
    ),
    "glm4_moe with thinking tags": (
        glm,
        "<think>I want to get the weather.</think>\n\nI will help you get the weather.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>date</arg_key>\n<arg_value>2025-08-01</arg_value>\n</tool_call>",
        [Text("<think>I want to get the weather.</think>\n\nI will help you get the weather.")] + call("get_weather", {"city": "Beijing", "date": "2025-08-01"}),
    ),
    "minimax_m2 content before call": (
        minimax,
        'Let me check. <minimax:tool_call><invoke name="get_weather"><parameter name="city">Seattle</parameter></invoke></minimax:tool_call>',
        [Text("Let me check.")] + call("get_weather", {"city": "Seattle"}),
    ),
}
_OPENER_AHEAD = re.compile(r"\s*(?:<tool_call>|<function=|<minimax:tool_call>)")


def loosely(segments):
    """Whitespace sent before its marker arrived stays sent: the one difference splits make."""
    out = []
    for seg in segments:
        if isinstance(seg, CallBegin) and out and isinstance(out[-1], Text):
            out[-1] = Text(out[-1].text.rstrip())
            if not out[-1].text:
                out.pop()
        out.append(seg)
    return out


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_whole_and_character_by_character(name):
    lex, text, expected = SAMPLES[name]
    assert lex(text) == expected
    assert loosely(lex(text, pieces=list(text))) == expected


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_at_every_two_piece_split(name):
    lex, text, expected = SAMPLES[name]
    for cut in range(1, len(text)):
        split = lex(text, pieces=[text[:cut], text[cut:]])
        if text[cut - 1].isspace() and _OPENER_AHEAD.match(text, cut):
            assert loosely(split) == expected, cut
        else:
            assert split == expected, cut


def test_tricky_stream_at_every_split():
    content = "a </parameter> b\n<parameter=x>\n</parameter>\n</function> c"
    text = "Go: " + qwen_block("write_file", {"content": content, "path": "p"}) + " <function=get_time>\n</function> ok <tool_call>{} end"
    expected = [Text("Go:")] + call("write_file", {"content": content, "path": "p"}) + call("get_time", {}) + [Text(" ok <tool_call>{} end")]
    assert qwen(text) == expected
    assert loosely(qwen(text, pieces=list(text))) == expected
    for cut in range(1, len(text)):
        split = qwen(text, pieces=[text[:cut], text[cut:]])
        assert loosely(split) == expected, cut
