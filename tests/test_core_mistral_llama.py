"""The Mistral (`[TOOL_CALLS]`) and Llama (`<function=…>`, pythonic, `<|python_tag|>`) lexers:
one test per rule, the peers' samples at every split, and prose that must stay prose."""

from __future__ import annotations

import json
import re

import pytest

from toolshim.calls import (
    INVALID_JSON,
    NOT_ALLOWED,
    REPAIRED_JSON,
    SCHEMA_MISMATCH,
    STRICT_FAILURE,
    UNKNOWN_NAME,
    CallScope,
    RewriteStats,
)
from toolshim.lexers.base import CallArgs, CallBegin, CallEnd, Text
from toolshim.lexers.engine import lexer as make_lexer
from toolshim.lexers.specs import LLAMA, MISTRAL
from toolshim.judge import call_entries
from toolshim.tools import RequestContext, ToolSpec

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
NAMES = ["add", "multiply", "special_function", "searchTool", "getOpenIncidentsTool", "get_weather", "toolName"]
TOOLS = {name: ToolSpec(name, {"type": "object"}) for name in NAMES}
TOOLS["weather"] = ToolSpec("weather", WEATHER)
TOOLS["strict_weather"] = ToolSpec("strict_weather", {**WEATHER, "additionalProperties": False}, strict=True)
ID = "<id>"  # minted ids are random: compared separately


def mistral_lexer(scope, **kwargs):
    return make_lexer(MISTRAL, scope, **kwargs)


def llama_lexer(scope, **kwargs):
    return make_lexer(LLAMA, scope, **kwargs)


def make_scope(tools=TOOLS, **context) -> CallScope:
    return CallScope(RequestContext(tools=dict(tools), **context), RewriteStats())


def merge(segments, keep_ids=False):
    """Join neighbouring text and argument pieces, and hide the random ids."""
    merged = []
    for seg in segments:
        if isinstance(seg, CallBegin) and not keep_ids:
            seg = CallBegin(ID, seg.name)
        if merged and type(seg) in (Text, CallArgs) and type(merged[-1]) is type(seg):
            merged[-1] = type(seg)(merged[-1].text + seg.text)
        else:
            merged.append(seg)
    return merged


def run(lexer, pieces, keep_ids=False):
    segments = []
    for piece in pieces:
        segments += lexer.feed(piece)
    segments += lexer.finish()
    return merge(segments, keep_ids)


def mistral(text, scope=None, pieces=None, keep_ids=False, **kwargs):
    return run(mistral_lexer(scope or make_scope(), **kwargs), pieces or [text], keep_ids)


def llama(text, scope=None, pieces=None, keep_ids=False, **kwargs):
    return run(llama_lexer(scope or make_scope(), **kwargs), pieces or [text], keep_ids)


def call(name, args, call_id=ID):
    return [CallBegin(call_id, name), CallArgs(args), CallEnd()]


def every_split(lex, text):
    """The one-piece output, checked against every two-piece split and character by character."""
    whole = lex(text)
    for cut in range(1, len(text)):
        assert lex(text, pieces=[text[:cut], text[cut:]]) == whole, cut
    assert lex(text, pieces=list(text)) == whole
    return whole


# -- the peers' samples (peer_samples.jsonl, copied: tests do not read the research files) ------

SAMPLES = [
    (
        "mistral_pre_v11",
        mistral_lexer,
        '[TOOL_CALLS][{"name": "add", "arguments":{"a": 3.5, "b": 4}}]',
        [],
        [("add", '{"a": 3.5, "b": 4}')],
    ),
    (
        "mistral_v11",  # as vLLM's Mistral tokenizer leaves it: `[ARGS]` stripped
        mistral_lexer,
        '[TOOL_CALLS]add{"a": 3.5, "b": 4}[TOOL_CALLS]multiply{"a": 3, "b": 6}',
        [],
        [("add", '{"a": 3.5, "b": 4}'), ("multiply", '{"a": 3, "b": 6}')],
    ),
    (
        "mistral_v13+think",  # [THINK] is not read yet: it stays text
        mistral_lexer,
        '[THINK]I\'m\nthinking[/THINK][TOOL_CALLS]special_function[ARGS]{"arg1":1}',
        [Text("[THINK]I'm\nthinking[/THINK]")],
        [("special_function", '{"arg1":1}')],
    ),
    (
        "llama3_json",  # the sample is bare JSON; with its optional `<|python_tag|>` in front
        llama_lexer,
        '<|python_tag|>{"name": "searchTool", "parameters": {"query": "test1"}}; {"name": "getOpenIncidentsTool", "parameters": {}}; '
        '{"name": "searchTool", "parameters": {"query": "test2"}}',
        [],
        [("searchTool", '{"query": "test1"}'), ("getOpenIncidentsTool", "{}"), ("searchTool", '{"query": "test2"}')],
    ),
    (
        "llama31_function_tag",
        llama_lexer,
        '<function=special_function>{"arg1": 1}</function>',
        [],
        [("special_function", '{"arg1": 1}')],
    ),
    (
        "llama4_pythonic",  # arguments rebuilt from Python literals: compact JSON
        llama_lexer,
        "Here's a call: <|python_start|>[get_weather(location='Tokyo', data=[1, 2, 3])]<|python_end|>",
        [Text("Here's a call: ")],
        [("get_weather", '{"location":"Tokyo","data":[1,2,3]}')],
    ),
]


@pytest.mark.parametrize("fmt, cls, raw, text, calls", SAMPLES, ids=[s[0] for s in SAMPLES])
def test_peer_samples_at_every_split(fmt, cls, raw, text, calls):
    def lex(t, pieces=None):
        return run(cls(make_scope()), pieces or [t])

    expected = text + [seg for name, args in calls for seg in call(name, args)]
    assert every_split(lex, raw) == expected


# What the peers expect (`expected` in peer_samples.jsonl), as they format the arguments.
PEER_EXPECTED = {
    "mistral_pre_v11": [("add", '{"a": 3.5, "b": 4}')],
    "mistral_v11": [("add", '{"a": 3.5, "b": 4}'), ("multiply", '{"a": 3, "b": 6}')],
    "mistral_v13+think": [("special_function", '{"arg1":1}')],
    "llama3_json": [("searchTool", '{"query": "test1"}'), ("getOpenIncidentsTool", "{}"), ("searchTool", '{"query": "test2"}')],
    "llama31_function_tag": [("special_function", '{"arg1": 1}')],
    "llama4_pythonic": [("get_weather", '{"location": "Tokyo", "data": [1, 2, 3]}')],
}


@pytest.mark.parametrize("fmt, calls", [(s[0], s[4]) for s in SAMPLES], ids=[s[0] for s in SAMPLES])
def test_peer_samples_give_the_calls_the_peers_expect(fmt, calls):
    peer = PEER_EXPECTED[fmt]
    assert [name for name, _ in calls] == [name for name, _ in peer]
    assert [json.loads(args) for _, args in calls] == [json.loads(args) for _, args in peer]
    if fmt != "llama4_pythonic":  # the model's own JSON text: byte for byte what the peers keep
        assert calls == peer


def test_llama3_bare_json_sample_is_not_detected_without_python_tag():
    raw = (
        '{"name": "searchTool", "parameters": {"query": "test1"}}; {"name": "getOpenIncidentsTool", "parameters": {}}; '
        '{"name": "searchTool", "parameters": {"query": "test2"}}'
    )
    assert llama(raw) == [Text(raw)]  # known limit: prose can hold the same JSON


def test_llama_whitespace_alone_at_the_start_is_not_lost():
    # found by review: the start held for a bare JSON call, then dropped at the end of the text
    assert every_split(lambda t, pieces=None: llama(t, pieces=pieces, bare_json=True), "  \n ") == [Text("  \n ")]


def test_llama_named_tag_cut_after_its_closing_quote_is_text():
    # found by review: the quote held for the `>` that may follow it, then dropped at the end
    text = 'Use <function name="bash"'
    assert every_split(llama, text) == [Text(text)]


def test_pythonic_sample_split_as_sglang_streams_it():
    pieces = ["Here's a call: ", "<|python_", "start|>[get_weather(location=", "'Tokyo', data=[1, 2", ", 3])]<|python_end|>"]
    lexer = llama_lexer(make_scope())
    assert lexer.feed(pieces[0]) == [Text("Here's a call: ")]  # text streams live
    assert lexer.feed(pieces[1]) == [] and not lexer.idle  # a possible marker is held
    assert run(lexer, pieces[2:]) == call("get_weather", '{"location":"Tokyo","data":[1,2,3]}')


# -- Mistral: the three formats -----------------------------------------------------------------


def test_mistral_v3_list_keeps_the_models_arguments_and_ids():
    text = '[TOOL_CALLS]\u2581[{"arguments": {"a": 1,  "b": [2]}, "name": "add", "id": "abcDEF123"}, {"name": "multiply", "id": "XYZxyz789", "arguments": {}}]'
    assert mistral(text, keep_ids=True) == call("add", '{"a": 1,  "b": [2]}', "abcDEF123") + call("multiply", "{}", "XYZxyz789")
    # a space after the token, string-encoded arguments, "parameters", arguments left out
    text = '[TOOL_CALLS] [{"name": "add", "arguments": "{\\"a\\": 1}"}, {"name": "multiply", "parameters": {"b": 2}}, {"name": "toolName"}]'
    assert mistral(text) == call("add", '{"a": 1}') + call("multiply", '{"b": 2}') + call("toolName", "{}")


def test_mistral_v11_name_call_id_args_repeated():
    text = '[TOOL_CALLS]add[CALL_ID]abcDEF123[ARGS]{"a": 1}[TOOL_CALLS]multiply[CALL_ID]XYZxyz789[ARGS] {"b": 2} '
    assert mistral(text, keep_ids=True) == call("add", '{"a": 1}', "abcDEF123") + call("multiply", '{"b": 2}', "XYZxyz789")


def test_mistral_v13_calls_follow_each_other_without_separators():
    args = {"s": 'a}b{c[TOOL_CALLS]d[ARGS]"e\\', "n": [{"x": []}]}
    first = json.dumps(args)
    text = f"[TOOL_CALLS]get_weather[ARGS]{first}add[ARGS]{{}}multiply[ARGS]{{\"b\": 2}}"
    assert every_split(mistral, text) == call("get_weather", first) + call("add", "{}") + call("multiply", '{"b": 2}')


def test_mistral_model_ids_are_used_once_then_minted():
    text = '[TOOL_CALLS]add[CALL_ID]abcDEF123[ARGS]{}add[CALL_ID]abcDEF123[ARGS]{}add[CALL_ID]bad id[ARGS]{}'
    out = mistral(text, keep_ids=True)
    ids = [seg.id for seg in out if isinstance(seg, CallBegin)]
    assert ids[0] == "abcDEF123" and re.fullmatch(r"call_[A-Za-z0-9]{24}", ids[1])
    # "bad id" is not an id: the third unit is not a call
    assert out[-1] == Text("add[CALL_ID]bad id[ARGS]{}")
    # an id the scope already handed out (another channel, another dialect) is not reused
    scope = make_scope()
    scope.claim_id("abcDEF123")
    out = mistral('[TOOL_CALLS][{"name": "add", "arguments": {}, "id": "abcDEF123"}]', scope, keep_ids=True)
    assert out[0].id != "abcDEF123"


def test_mistral_text_before_streams_live_and_only_a_marker_prefix_is_held():
    lexer = mistral_lexer(make_scope())
    assert lexer.feed("Let me [check] that. [TOOL") == [Text("Let me [check] that. ")]
    assert not lexer.idle
    assert lexer.feed("_CALLS]add[ARGS]{") == []
    assert merge(lexer.feed('"a": 1}') + lexer.finish()) == call("add", '{"a": 1}')
    assert lexer.idle


# -- Mistral: what stays text -------------------------------------------------------------------


MISTRAL_PROSE = [
    "Mistral models write [TOOL_CALLS] before their calls.",
    "[TOOL_CALLS]",
    "[TOOL_C",
    "See [TOOL_CALLS][docs] and [TOOL_CALLS]: done",
    "[TOOL_CALLS]add then [ARGS] later",
    "[TOOL_CALLS]add[ARGS] is followed by JSON",
    "[TOOL_CALLS]add[CALL_ID]",
    '[TOOL_CALLS][{"name": "add", "arguments": {}',  # cut short at the end
    "[TOOL_CALLS][1, 2, 3]",
    "[TOOL_CALLS] [see the list below, which never closes",
    "[TOOL_CALLS][]",
    "[TOOL_CALLS]" + "x" * 80 + "[ARGS]{}",  # not a name: too long
    "[TOOL_CALLS]\n\nThe token above starts a call list.",
    "Use [ARGS] and [CALL_ID] markers.",
]


@pytest.mark.parametrize("text", MISTRAL_PROSE)
def test_mistral_prose_look_alikes_stay_text_at_every_split(text):
    assert every_split(mistral, text) == [Text(text)]


def test_mistral_quoted_token_releases_as_soon_as_it_cannot_be_a_call():
    lexer = mistral_lexer(make_scope())
    # a word after the token may be a tool's name: held until a character says it is not one
    assert lexer.feed("The [TOOL_CALLS] token") == [Text("The ")]
    assert merge(lexer.feed(" marks calls")) == [Text("[TOOL_CALLS] token marks calls")]
    assert lexer.idle


def test_mistral_list_of_anything_but_objects_streams_at_once():
    lexer = mistral_lexer(make_scope())
    assert merge(lexer.feed("[TOOL_CALLS] [see below")) == [Text("[TOOL_CALLS] [see below")]
    assert lexer.idle


def test_mistral_token_twice_the_first_is_text():
    assert every_split(mistral, "[TOOL_CALLS][TOOL_CALLS]add[ARGS]{}") == [Text("[TOOL_CALLS]")] + call("add", "{}")


def test_mistral_undeclared_names_stay_text_exactly():
    scope = make_scope()
    text = 'Hi [TOOL_CALLS]rm_rf[ARGS]{"path": "/"}'
    assert mistral(text, scope) == [Text(text)]
    text = '[TOOL_CALLS][{"name": "add", "arguments": {}}, {"name": "rm_rf", "arguments": {}}]'
    assert mistral(text, scope) == [Text(text)]  # a list is all or nothing
    assert scope.stats.problems[UNKNOWN_NAME] == 2 and scope.stats.calls == 0


def test_mistral_a_text_unit_does_not_stop_the_next_call():
    text = '[TOOL_CALLS]rm_rf[ARGS]{"a": 1}add[ARGS]{"b": 2}'
    assert mistral(text) == [Text('[TOOL_CALLS]rm_rf[ARGS]{"a": 1}')] + call("add", '{"b": 2}')


def test_mistral_value_cut_short_by_the_next_token_is_text():
    text = '[TOOL_CALLS]add[ARGS]{"a": [TOOL_CALLS]multiply[ARGS]{"b": 2}'
    assert every_split(mistral, text) == [Text('[TOOL_CALLS]add[ARGS]{"a": ')] + call("multiply", '{"b": 2}')


def test_mistral_strict_tool_that_does_not_fit_stays_text():
    scope = make_scope()
    bad = '[TOOL_CALLS]strict_weather[ARGS]{"city": 5}'
    broken = '[TOOL_CALLS]strict_weather[ARGS]{"city": "Rome",}'
    assert mistral(bad, scope) == [Text(bad)]
    assert mistral(broken, scope) == [Text(broken)]
    assert scope.stats.problems[STRICT_FAILURE] == 2
    assert mistral('[TOOL_CALLS]strict_weather[ARGS]{"city": "Rome"}') == call("strict_weather", '{"city": "Rome"}')


def test_mistral_non_strict_repair_and_schema_mismatch_are_noted():
    scope = make_scope()
    assert mistral('[TOOL_CALLS]weather[ARGS]{"city": "Rome",}', scope) == call("weather", '{"city":"Rome"}')
    assert mistral('[TOOL_CALLS]weather[ARGS]{"town": "Rome"}', scope) == call("weather", '{"town": "Rome"}')
    assert scope.stats.problems[REPAIRED_JSON] == 1 and scope.stats.problems[SCHEMA_MISMATCH] == 1


def test_mistral_scope_policy_applies():
    scope = make_scope(parallel_tool_calls=False)
    text = '[TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]add[ARGS]{"a": 2}'
    assert mistral(text, scope) == call("add", '{"a": 1}') + [Text('[TOOL_CALLS]add[ARGS]{"a": 2}')]
    scope = make_scope(tool_choice_none=True)
    assert mistral(text, scope) == [Text(text)]
    assert scope.stats.problems[NOT_ALLOWED] == 2


def test_mistral_unit_over_the_cap_is_text():
    text = '[TOOL_CALLS]add[ARGS]{"a": "' + "x" * 200 + '"}'
    assert mistral(text, max_held=100) == [Text(text)]
    assert mistral(text, pieces=[text[i : i + 7] for i in range(0, len(text), 7)], max_held=100) == [Text(text)]
    assert mistral(text, max_held=len(text)) == call("add", text[text.index("{") :])


def test_mistral_whitespace_after_calls_is_padding():
    a = '[TOOL_CALLS]add[ARGS]{"a": 1}'
    assert mistral(a + "\n\n") == call("add", '{"a": 1}')
    assert mistral(a + "\n" + a) == call("add", '{"a": 1}') * 2
    assert mistral(a + "\n\nDone.") == call("add", '{"a": 1}') + [Text("\n\nDone.")]
    # after a unit that stayed text, whitespace is shown as it was
    assert mistral("[TOOL_CALLS]rm_rf[ARGS]{}\n\n") == [Text("[TOOL_CALLS]rm_rf[ARGS]{}\n\n")]


def test_mistral_no_tools_passes_everything_at_once():
    text = '[TOOL_CALLS]add[ARGS]{"a": 1}'
    lexer = mistral_lexer(make_scope({}))
    assert lexer.feed(text[:14]) == [Text(text[:14])] and lexer.idle
    assert mistral(text, make_scope({})) == [Text(text)]


def test_mistral_finish_leaves_the_lexer_as_new():
    lexer = mistral_lexer(make_scope())
    a = '[TOOL_CALLS]add[ARGS]{"a": 1}'
    for held in ["[TOOL_C", "[TOOL_CALLS]ad", '[TOOL_CALLS][{"name', a + "  ", a + "mul", ""]:
        lexer.feed(held)
        lexer.finish()
        assert lexer.idle
        assert run(lexer, ["hi " + a]) == [Text("hi ")] + call("add", '{"a": 1}')


def test_call_entries_keeps_the_models_bytes():
    assert call_entries('[{"name": "a", "arguments": { "x" : 1 }}]') == [{"name": "a", "arguments": '{ "x" : 1 }'}]
    assert call_entries('{"name": "a", "parameters": {}, "id": "q"}') == [{"name": "a", "parameters": "{}", "id": "q"}]
    assert call_entries('[{"name": "a",}]') is None
    assert call_entries('{"name": NaN}') is None


# -- Llama 3.1 `<function=NAME>{json}</function>` -----------------------------------------------


def test_llama_function_tags_with_text_around():
    a = '<function=get_weather>{"city": "Oslo"}</function>'
    b = "<function=toolName> </function>"
    text = f"Checking. {a}\n{b}\nDone."
    assert every_split(llama, text) == [Text("Checking. ")] + call("get_weather", '{"city": "Oslo"}') + call("toolName", "{}") + [Text("\nDone.")]


def test_llama_function_end_tag_inside_a_string_does_not_close():
    args = json.dumps({"html": "</function><function=x>{", "q": '"'})
    assert llama(f"<function=toolName>{args}</function>") == call("toolName", args)


def test_llama_function_without_end_tag():
    a = '<function=add>{"a": 1}'
    # the next tag closes it; the end of the text closes it; a half-written end tag goes with it
    assert llama(f'{a}\n<function=multiply>{{"b": 2}}</function>') == call("add", '{"a": 1}') + call("multiply", '{"b": 2}')
    assert llama(a + "\n") == call("add", '{"a": 1}')
    assert every_split(llama, a + "</func") == call("add", '{"a": 1}')
    assert llama(a + "<") == call("add", '{"a": 1}')  # llama.cpp's partial sample
    # a value followed by prose is not a call; neither is a value cut short
    assert llama(a + " and so on") == [Text(a + " and so on")]
    cut = '<function=add>{"a": </function>'
    assert every_split(llama, cut) == [Text(cut)]


LLAMA_PROSE = [
    "In JS, <function> is not a tag.",
    "<function=foo>bar</function>",
    "Write <function=NAME>{json}</function> to call.",  # NAME is not a tool, {json} is not JSON
    '<function name="get_weather">{"city": "Oslo"',  # the drift spelling, cut short
    "<function=get_weather>",
    "<function=get weather>{}</function>",
    "<function=>{}</function>",
    "<|python_start|>print('hi')<|python_end|>",
    "<|python_start|>[1, 2, 3]<|python_end|>",
    "<|python_start|>[]",
    "<|python_start|>[get_weather(location='Tokyo'",
    "<|python_tag|>import math\nprint(math.pi)<|eom_id|>",
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}',
    'Result: {"name": "get_weather", "parameters": {"city": "Oslo"}}',
    "a < b <| c <|python",
]


@pytest.mark.parametrize("text", LLAMA_PROSE)
def test_llama_prose_and_code_look_alikes_stay_text_at_every_split(text):
    assert every_split(llama, text) == [Text(text)]


def test_llama_code_sample_streams_as_soon_as_it_is_not_a_tag():
    lexer = llama_lexer(make_scope())
    assert merge(lexer.feed("x = <function=foo>bar")) == [Text("x = <function=foo>bar")]
    assert lexer.idle


# -- Llama 4 pythonic ---------------------------------------------------------------------------


def test_pythonic_literals_become_json():
    text = (
        "<|python_start|>[get_weather(city='Oslo', days=(1, -2.5), extra={'a': None, 'b': [True, False]}),"
        ' toolName(s="x]\'<|python_end|>", t=\'\'\'it\'s "]"\'\'\')]'
    )
    expected = call("get_weather", '{"city":"Oslo","days":[1,-2.5],"extra":{"a":null,"b":[true,false]}}') + call(
        "toolName", '{"s":"x]\'<|python_end|>","t":"it\'s \\"]\\""}'
    )
    assert every_split(llama, text) == expected
    assert every_split(llama, text + "<|python_end|>\nDone") == expected + [Text("\nDone")]


def test_pythonic_without_end_token_ends_at_the_list():
    text = "<|python_start|>[toolName()] and then text"
    assert llama(text) == call("toolName", "{}") + [Text(" and then text")]


@pytest.mark.parametrize(
    "source",
    [
        "[toolName('positional')]",
        "[toolName(x=get_weather())]",
        "[toolName(x=y)]",
        "[toolName(**kw)]",
        "[os.system(cmd='ls')]",
        "[toolName(x=f'{y}')]",
        "[toolName(x={1: 2})]",
        "[toolName(x=1e999)]",
        "[toolName(x=1 + 2)]",
        "[toolName(x=b'raw')]",
        "[toolName(x={1, 2})]",  # literals that are no JSON data: a set, a complex number
        "[toolName(x=1 + 2j)]",
        "[toolName(x=[1,))]]",  # brackets that balance, Python that does not parse
    ],
)
def test_pythonic_anything_but_literal_keyword_arguments_stays_text(source):
    scope = make_scope()
    text = f"<|python_start|>{source}<|python_end|>"
    assert llama(text, scope) == [Text(text)]
    assert scope.stats.calls == 0 and scope.stats.problems[INVALID_JSON] == 1


def test_pythonic_undeclared_name_stays_text():
    scope = make_scope()
    text = "<|python_start|>[get_weather(city='A'), rm_rf(path='/')]<|python_end|>"
    assert llama(text, scope) == [Text(text)]
    assert scope.stats.problems[UNKNOWN_NAME] == 1


def test_pythonic_strict_tool_is_validated():
    scope = make_scope()
    bad = "<|python_start|>[strict_weather(city=5)]<|python_end|>"
    assert llama(bad, scope) == [Text(bad)]
    assert scope.stats.problems[STRICT_FAILURE] == 1
    assert llama("<|python_start|>[strict_weather(city='Rome')]") == call("strict_weather", '{"city":"Rome"}')


# -- Llama 3.x JSON after `<|python_tag|>` ------------------------------------------------------


def test_python_tag_calls_separated_by_semicolons_and_end_tokens():
    text = '<|python_tag|>{"name": "add", "arguments": {"a": 1}} ;\n{"name": "toolName", "parameters": {}}<|eom_id|>'
    assert every_split(llama, text) == call("add", '{"a": 1}') + call("toolName", "{}")


def test_python_tag_prose_after_a_call_gets_its_separator_back():
    text = '<|python_tag|>{"name": "add", "parameters": {}}; would you like more?'
    assert every_split(llama, text) == call("add", "{}") + [Text("; would you like more?")]
    # a second object that is no call after the separator is text, separator and all
    text = '<|python_tag|>{"name": "add", "parameters": {}};\n{"city": "Oslo"} is the shape'
    assert every_split(llama, text) == call("add", "{}") + [Text(';\n{"city": "Oslo"} is the shape')]


@pytest.mark.parametrize("separator", ["; ", ";", "\n", " ", "\n\n", "\t", " ;\n", ""])
def test_python_tag_calls_separated_by_any_whitespace_or_semicolons(separator):
    # Llama 3.1's template writes `; ` between calls; models also write a newline, spaces or
    # nothing: vLLM PR #49923 (llama3_json) skips any run of `; \t\n` between the objects.
    text = '<|python_tag|>{"name": "add", "parameters": {"a": 1}}' + separator + '{"name": "toolName", "parameters": {}}<|eom_id|>'
    assert every_split(llama, text) == call("add", '{"a": 1}') + call("toolName", "{}")


def test_bare_json_calls_at_the_start_separated_by_newlines():
    # Llama 3.x without `<|python_tag|>` (its template's default), one object per line
    text = '{"name": "add", "parameters": {"a": 1}}\n{"name": "toolName", "parameters": {}}\nDone.'
    expected = call("add", '{"a": 1}') + call("toolName", "{}") + [Text("\nDone.")]
    assert every_split(lambda t, **kw: llama(t, bare_json=True, **kw), text) == expected


def test_python_tag_undeclared_and_strict():
    scope = make_scope()
    text = '<|python_tag|>{"name": "rm_rf", "parameters": {}}'
    assert llama(text, scope) == [Text(text)]
    text = '<|python_tag|>{"name": "strict_weather", "parameters": {"city": 5}}'
    assert llama(text, scope) == [Text(text)]
    assert scope.stats.problems[UNKNOWN_NAME] == 1 and scope.stats.problems[STRICT_FAILURE] == 1


# -- Llama: everything else ---------------------------------------------------------------------


def test_llama_undeclared_function_tag_stays_text_and_the_next_is_a_call():
    bad = '<function=rm_rf>{"path": "/"}</function>'
    good = "<function=add>{}</function>"
    assert llama(f"{bad}\n{good}") == [Text(bad + "\n")] + call("add", "{}")


def test_llama_scope_policy_applies():
    scope = make_scope(parallel_tool_calls=False)
    a = "<function=add>{}</function>"
    assert llama(a + a, scope) == call("add", "{}") + [Text(a)]
    scope = make_scope(tool_choice_none=True)
    assert llama(a, scope) == [Text(a)]
    assert scope.stats.problems[NOT_ALLOWED] == 1


def test_llama_unit_over_the_cap_is_text():
    for text in [
        '<function=add>{"a": "' + "x" * 200 + '"}</function>',
        "<|python_start|>[add(a='" + "x" * 200 + "')]",
        '<|python_tag|>{"name": "add", "parameters": {"a": "' + "x" * 200 + '"}}',
    ]:
        assert llama(text, max_held=100) == [Text(text)]
        assert llama(text, pieces=[text[i : i + 7] for i in range(0, len(text), 7)], max_held=100) == [Text(text)]
        assert len(llama(text, max_held=len(text))) == 3


def test_llama_no_tools_passes_everything_at_once():
    text = "<function=add>{}</function>"
    lexer = llama_lexer(make_scope({}))
    assert lexer.feed(text[:12]) == [Text(text[:12])] and lexer.idle


def test_llama_finish_leaves_the_lexer_as_new():
    lexer = llama_lexer(make_scope())
    a = "<function=add>{}</function>"
    for held in ["<|python_st", "<function=ad", "<|python_start|>[add(", "<|python_tag|>{", a + "  ", a + "<", ""]:
        lexer.feed(held)
        lexer.finish()
        assert lexer.idle
        assert run(lexer, ["hi " + a]) == [Text("hi ")] + call("add", "{}")


def test_minted_ids_are_unique_across_both_lexers_of_a_scope():
    scope = make_scope()
    out = run(mistral_lexer(scope), ["[TOOL_CALLS]add[ARGS]{}" * 5], keep_ids=True)
    out += run(llama_lexer(scope), ["<function=add>{}</function>" * 5], keep_ids=True)
    ids = [seg.id for seg in out if isinstance(seg, CallBegin)]
    assert len(ids) == 10 and len(set(ids)) == 10
    assert all(re.fullmatch(r"call_[A-Za-z0-9]{24}", i) for i in ids)


# -- longer streams, every split ----------------------------------------------------------------

MISTRAL_STREAM = (
    "Sure, [TOOL_CALLS] is how I call. [TOOL_CALLS]get_weather[CALL_ID]abcDEF123[ARGS] "
    + json.dumps({"city": "New [ARGS] \"York\" \\ 日本 }"})
    + 'add[ARGS]{"a": 1}\n[TOOL_CALLS]\u2581[{"name": "multiply", "arguments": {"b": [2]}}]\n\nAll done [TOOL_CALLS]rm_rf{} ok'
)


def test_mistral_stream_every_split():
    assert every_split(mistral, MISTRAL_STREAM) == (
        [Text("Sure, [TOOL_CALLS] is how I call. ")]
        + call("get_weather", json.dumps({"city": "New [ARGS] \"York\" \\ 日本 }"}))
        + call("add", '{"a": 1}')
        + call("multiply", '{"b": [2]}')
        + [Text("\n\nAll done [TOOL_CALLS]rm_rf{} ok")]
    )


LLAMA_STREAM = (
    "Use <function=NAME> tags. <function=get_weather>\n"
    + json.dumps({"city": "</function> 日本"})
    + "\n</function>\n<|python_start|> [add(a='<|python_start|>]')] <|python_end|>"
    + '<|python_tag|>{"name": "multiply", "parameters": {"b": 2}}; {"name": "rm_rf", "parameters": {}}'
    + " bye <function=x"
)


def test_llama_stream_every_split():
    assert every_split(llama, LLAMA_STREAM) == (
        [Text("Use <function=NAME> tags. ")]
        + call("get_weather", json.dumps({"city": "</function> 日本"}))
        + call("add", '{"a":"<|python_start|>]"}')
        + call("multiply", '{"b": 2}')
        + [Text('; {"name": "rm_rf", "parameters": {}} bye <function=x')]
    )


def test_llama_cpp_drift_spelling_function_name_attribute():
    text = '<function name="add">\n{"a": 1}\n</function>'
    assert every_split(llama, text) == call("add", '{"a": 1}')


# -- Mistral: `[TOOL_CALLS]` inside `[THINK]…[/THINK]` (issue 20 item 5) ---------------------------

# Magistral / Ministral 3 / Devstral 2 (tokenizer v13+): the chat template renders the thought as
# `[THINK]…[/THINK]` before any `[TOOL_CALLS]`, and vLLM's Mistral reasoning parser hands the tool
# parser only what follows `[/THINK]`: a `[TOOL_CALLS]` written inside the thought is the thought.
THOUGHT = '[THINK]I could write [TOOL_CALLS]add[ARGS]{"a": 1} but first [/THINK]'
AFTER = '[TOOL_CALLS]multiply[ARGS]{"b": 2}'


def test_tool_calls_token_inside_think_is_part_of_the_thought_at_every_split():
    from toolshim.lexers.base import ReasoningText
    from toolshim.lexers.think import ThinkLexer

    def split(text, pieces=None):
        lexer = ThinkLexer(tool_starts=MISTRAL.starts, pairs={"[THINK]": "[/THINK]"}, keeps={"[THINK]": ("[TOOL_CALLS]",)})  # as the registry makes it
        out = []
        for piece in pieces or [text]:
            out += lexer.feed(piece)
        merged = []
        for seg in out + lexer.finish():
            if merged and type(seg) is type(merged[-1]):
                merged[-1] = type(seg)(merged[-1].text + seg.text)
            else:
                merged.append(seg)
        return merged

    text = THOUGHT + AFTER
    assert every_split(split, text) == [ReasoningText('I could write [TOOL_CALLS]add[ARGS]{"a": 1} but first '), Text(AFTER)]
    # in `<think>` (Magistral v11 writes plain-text tags) a call still ends the reasoning, as before
    assert split('<think>x [TOOL_CALLS]add[ARGS]{}') == [ReasoningText("x "), Text("[TOOL_CALLS]add[ARGS]{}")]


@pytest.mark.parametrize("cut", [3, 12, 20, len(THOUGHT) - 4, len(THOUGHT) + 3])
def test_magistral_thought_with_tool_calls_token_through_the_chat_rewriter(cut):
    from harness import sse_body
    from toolshim.chat import ChatStreamRewriter
    from toolshim.tools import RequestContext
    from wire import check_chat_stream

    tools = [{"type": "function", "function": {"name": name, "parameters": {"type": "object"}}} for name in ("add", "multiply")]
    context = RequestContext.from_body(json.dumps({"model": "mistralai/Magistral-Small-2509", "messages": [], "tools": tools}).encode())
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "magistral"}
    text = THOUGHT + AFTER
    chunks = [{**base, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in (text[:cut], text[cut:])]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    rewriter = ChatStreamRewriter(context)
    result = check_chat_stream(b"".join(rewriter.feed(sse_body(chunks)) + rewriter.close()))
    assert result["reasoning_content"] == 'I could write [TOOL_CALLS]add[ARGS]{"a": 1} but first '
    assert [(c["name"], json.loads(c["arguments"])) for c in result["tool_calls"]] == [("multiply", {"b": 2})]
    assert not result["content"]
