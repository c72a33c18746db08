"""DeepSeek (V3, V3.1, DSML) and Harmony (gpt-oss) lexers: one test per rule, then every split."""

from __future__ import annotations

import pytest

from toolshim.calls import CallScope, RewriteStats
from toolshim.lexers import harmony as harmony_module
from toolshim.lexers.base import CallArgs, CallBegin, CallEnd, ReasoningEnd, ReasoningText, Text
from toolshim.lexers.deepseek import DeepSeekLexer
from toolshim.lexers.harmony import HarmonyLexer
from toolshim.tools import RequestContext, ToolSpec

OBJECT = {"type": "object"}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}, "required": ["city"]}
SEARCH = {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}, "tags": {"type": "array"}}}
TOOLS = {
    "get_weather": ToolSpec("get_weather", WEATHER),
    "foo": ToolSpec("foo", OBJECT),
    "bar": ToolSpec("bar", OBJECT),
    "special_function": ToolSpec("special_function", OBJECT),
    "search": ToolSpec("search", SEARCH),
    "strict_weather": ToolSpec("strict_weather", {**WEATHER, "additionalProperties": False}, strict=True),
}

# -- the peer samples (tests/data/peer_samples.jsonl), copied verbatim ---------------

# vllm tests/tool_parsers/test_deepseekv3_tool_parser.py (single_tool_call_output)
DEEPSEEK_V3 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Tokyo\", \"unit\": \"celsius\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
# vllm tests/tool_parsers/test_deepseekv31_tool_parser.py (test_extract_tool_calls_with_multiple_tools)
DEEPSEEK_V31 = "some prefix text<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>foo<｜tool▁sep｜>{\"x\":1}<｜tool▁call▁end｜><｜tool▁call▁begin｜>bar<｜tool▁sep｜>{\"y\":2}<｜tool▁call▁end｜><｜tool▁calls▁end｜> some suffix text"
# llama.cpp tests/test-chat.cpp (COMMON_CHAT_FORMAT_GPT_OSS)
HARMONY = "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>commentary to=functions.special_function <|constrain|>json<|message|>{\"arg1\": 1}"
# https://github.com/raullenchai/Rapid-MLX/issues/480 (gpt-oss-20b, special tokens stripped)
HARMONY_STRIPPED = "commentary to=functions.get_weather json{\"city\":\"Paris\"}"

# The DeepSeek special tokens, spelled out (U+FF5C bars, U+2581 spaces).
SB, SE = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, SEP, CE = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
FC, FC_END = "<｜DSML｜function_calls>", "</｜DSML｜function_calls>"
TC, TC_END = "<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"
INV_END, PAR_END = "</｜DSML｜invoke>", "</｜DSML｜parameter>"


def invoke(name: str) -> str:
    return f'<｜DSML｜invoke name="{name}">'


def param(name: str, value: str, string: str | None = "true") -> str:
    attr = "" if string is None else f' string="{string}"'
    return f'<｜DSML｜parameter name="{name}"{attr}>{value}{PAR_END}'


def make_scope(tools=TOOLS, **context) -> CallScope:
    return CallScope(RequestContext(tools=dict(tools), **context), RewriteStats())


def deepseek(scope=None, **kw):
    return DeepSeekLexer(scope or make_scope(), **kw)


def harmony(scope=None, **kw):
    return HarmonyLexer(scope or make_scope(), **kw)


def run(lexer, pieces: list[str]) -> list:
    segments = []
    for piece in pieces:
        segments += lexer.feed(piece)
    return segments + lexer.finish()


def merge(segments) -> list:
    """Join neighbouring text / argument / reasoning pieces and blank the ids: splits must not matter."""
    merged = []
    for seg in segments:
        if type(seg) is CallBegin:
            seg = CallBegin("", seg.name)
        if merged and type(seg) in (Text, CallArgs, ReasoningText) and type(merged[-1]) is type(seg):
            merged[-1] = type(seg)(merged[-1].text + seg.text)
        else:
            merged.append(seg)
    return merged


def lex(text: str, make=deepseek, pieces: list[str] | None = None, **kw) -> list:
    return merge(run(make(**kw), pieces or [text]))


def call(name, args):
    return [CallBegin("", name), CallArgs(args), CallEnd()]


def assert_every_split(text: str, expected: list, make=deepseek, **kw) -> None:
    """Whole, cut in two at every character, and one character at a time: the same output."""
    assert lex(text, make, **kw) == expected
    for cut in range(1, len(text)):
        assert lex(text, make, [text[:cut], text[cut:]], **kw) == expected, cut
    assert lex(text, make, list(text), **kw) == expected


# -- peer samples ---------------------------------------------------------------------------------


def test_peer_sample_deepseek_v3_every_split():
    assert_every_split(DEEPSEEK_V3, call("get_weather", '{"city": "Tokyo", "unit": "celsius"}'))


def test_peer_sample_deepseek_v31_every_split():
    expected = [Text("some prefix text")] + call("foo", '{"x":1}') + call("bar", '{"y":2}') + [Text(" some suffix text")]
    assert_every_split(DEEPSEEK_V31, expected)


def test_peer_sample_harmony_every_split():
    expected = [ReasoningText("I'm\nthinking")] + call("special_function", '{"arg1": 1}')
    assert_every_split(HARMONY, expected, harmony)


def test_peer_sample_harmony_stripped_is_text():
    assert lex(HARMONY_STRIPPED, harmony) == [Text(HARMONY_STRIPPED)]  # not read: a guess (README, Dialects)


# -- DeepSeek: spellings ----------------------------------------------------------------------------


def test_v31_arguments_stream_live():
    lexer = deepseek()
    first = lexer.feed(f"Hi {SB}{CB}foo{SEP}" + '{"x": ')
    assert [type(s) for s in first] == [Text, CallBegin, CallArgs] and first[2] == CallArgs('{"x":')
    assert lexer.feed('1}') == [CallArgs(' 1}')]  # the held space comes back with what follows it
    assert lexer.feed(f"{CE}{SE}") == [CallEnd()]
    assert lexer.finish() == [] and lexer.idle


def test_v3_fenced_call_is_held_until_its_end():
    lexer = deepseek()
    assert lexer.feed(f"{SB}{CB}function{SEP}get_weather\n```json\n" + '{"city": "Paris"}\n```') == []
    assert merge(lexer.feed(CE + SE) + lexer.finish()) == call("get_weather", '{"city": "Paris"}')


def test_v3_without_fence_and_without_language_word():
    assert lex(f"{CB}function{SEP}foo\n" + '{"a": 1}' + CE) == call("foo", '{"a": 1}')
    assert lex(f"{CB}function{SEP}foo\n```\n" + '{"a": 1}' + f"\n```{CE}") == call("foo", '{"a": 1}')


def test_v3_fence_never_closed_stays_text():
    text = f"{SB}{CB}function{SEP}foo\n```json\n" + '{"a": 1}' + f"{CE}{SE}"
    assert lex(text) == [Text(text)]


def test_call_without_section_and_without_call_end():
    assert lex(f"Look: {CB}foo{SEP}" + '{"a": 1}') == [Text("Look: ")] + call("foo", '{"a": 1}')


def test_next_call_begin_or_section_end_closes_a_call_missing_its_end():
    text = f"{SB}{CB}foo{SEP}" + '{"a":1}' + f"{CB}bar{SEP}" + '{"b":2}' + SE
    assert lex(text) == call("foo", '{"a":1}') + call("bar", '{"b":2}')
    text = f"{SB}{CB}function{SEP}foo\n```json\n{{}}\n```{CB}function{SEP}bar\n```json\n{{}}\n```{SE}"
    assert lex(text) == call("foo", "{}") + call("bar", "{}")


def test_whitespace_between_calls_and_around_arguments_is_padding():
    text = f"{SB}\n{CB}foo{SEP}\n" + '{"a": 1}' + f"\n{CE}\n{CB}function{SEP}bar\n```json\n{{}}\n```{CE}\n{SE}\n"
    assert_every_split(text, call("foo", '{"a": 1}') + call("bar", "{}"))


def test_prose_after_calls_gets_its_whitespace_back():
    assert lex(f"{SB}{CB}foo{SEP}{{}}{CE}{SE}\n\nDone.") == call("foo", "{}") + [Text("\n\nDone.")]


def test_junk_inside_a_section_is_shown():
    text = f"{SB}{CB}foo{SEP}{{}}{CE} note {CB}bar{SEP}{{}}{CE}{SE}"
    assert_every_split(text, call("foo", "{}") + [Text(" note ")] + call("bar", "{}"))


def test_pretty_printed_arguments_keep_inner_whitespace():
    args = '{\n  "a": "x y",\n  "b": [1, 2]\n}'
    assert_every_split(f"{CB}foo{SEP}\n{args}\n{CE}", call("foo", args))


def test_call_with_no_arguments_gets_an_empty_object():
    assert lex(f"{SB}{CB}foo{SEP}{CE}{SE}") == call("foo", "{}")


def test_plain_text_and_partial_markers_pass_unchanged():
    text = "a <b> c <｜ d <｜tool x </think> <｜DSML｜ y"
    assert_every_split(text, [Text(text)])


def test_only_a_possible_marker_beginning_is_held():
    lexer = deepseek()
    assert lexer.feed("Hello <｜tool▁ca") == [Text("Hello ")]
    assert lexer.feed("t") == [Text("<｜tool▁cat")]


@pytest.mark.parametrize(
    "text",
    [
        "<|tool▁calls▁begin|><|tool▁call▁begin|>foo<|tool▁sep|>{}<|tool▁call▁end|><|tool▁calls▁end|>",  # ASCII bars
        "<｜tool_calls_begin｜><｜tool_call_begin｜>foo<｜tool_sep｜>{}<｜tool_call_end｜><｜tool_calls_end｜>",  # ASCII underscores
        "<|tool_calls_begin|><|tool_call_begin|>foo<|tool_sep|>{}<|tool_call_end|><|tool_calls_end|>",
        '<|DSML|function_calls><|DSML|invoke name="foo"><|DSML|parameter name="a" string="true">1</|DSML|parameter></|DSML|invoke></|DSML|function_calls>',
        '<|DSML|tool_calls><|DSML|invoke name="foo"></|DSML|invoke></|DSML|tool_calls>',
        "<｜tool▁calls▁begin|><｜tool▁call▁begin|>foo<｜tool▁sep|>{}",  # one bar of each kind
    ],
)
def test_ascii_look_alikes_never_match(text):
    assert_every_split(text, [Text(text)])


# -- DeepSeek: names, policy, validation ----------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        f"{SB}{CB}rm_rf{SEP}{{}}{CE}{SE}",
        f"{SB}\n{CB}function{SEP}rm_rf\n```json\n{{}}\n```{CE}\n{SE}",
        f"{FC}\n{invoke('rm_rf')}\n{param('path', '/')}\n{INV_END}\n{FC_END}",
        f"{CB}rm_rf{SEP}{{}}",
    ],
)
def test_undeclared_name_stays_text_exactly_as_written(text):
    assert_every_split(f"Sure. {text} Done.", [Text(f"Sure. {text} Done.")])


def test_undeclared_call_next_to_a_declared_one_shows_only_its_own_markup():
    text = f"{SB}{CB}foo{SEP}{{}}{CE}{CB}rm_rf{SEP}{{}}{CE}{SE}"
    assert_every_split(text, call("foo", "{}") + [Text(f"{CB}rm_rf{SEP}{{}}{CE}")])
    text = f"{SB}{CB}rm_rf{SEP}{{}}{CE}{CB}foo{SEP}{{}}{CE}{SE}"
    assert_every_split(text, [Text(f"{SB}{CB}rm_rf{SEP}{{}}{CE}")] + call("foo", "{}"))


def test_functions_prefix_is_stripped():
    assert lex(f"{CB}functions.foo{SEP}{{}}{CE}") == call("foo", "{}")


def test_no_declared_tools_passes_everything_through():
    lexer = deepseek(make_scope({}))
    assert lexer.idle and lexer.feed(DEEPSEEK_V31) == [Text(DEEPSEEK_V31)] and lexer.finish() == []


def test_strict_tool_is_held_and_validated():
    good = f"{CB}strict_weather{SEP}" + '{"city": "Paris"}' + CE
    lexer = deepseek()
    assert lexer.feed(good[:-3]) == []  # held, not streamed
    assert merge(lexer.feed(good[-3:]) + lexer.finish()) == call("strict_weather", '{"city": "Paris"}')
    bad = f"{CB}strict_weather{SEP}" + '{"town": "Paris"}' + CE
    scope = make_scope()
    assert lex(bad, scope=scope) == [Text(bad)]
    assert scope.stats.problems["strict_failure"] == 1


def test_strict_v3_and_dsml_calls_are_validated_too():
    assert lex(f"{CB}function{SEP}strict_weather\n```json\n{{\"city\": 1}}\n```{CE}") == [Text(f"{CB}function{SEP}strict_weather\n```json\n{{\"city\": 1}}\n```{CE}")]
    text = f"{TC}{invoke('strict_weather')}{param('city', 'Oslo')}{INV_END}{TC_END}"
    assert lex(text) == call("strict_weather", '{"city":"Oslo"}')


def test_non_strict_v3_arguments_are_repaired_once():
    scope = make_scope()
    assert lex(f"{CB}function{SEP}foo\n```json\n{{'a': 1,}}\n```{CE}", scope=scope) == call("foo", '{"a":1}')
    assert scope.stats.problems["repaired_json"] == 1


def test_scope_admission_is_asked_for_every_call():
    text = f"{SB}{CB}foo{SEP}{{}}{CE}{CB}bar{SEP}{{}}{CE}{SE}"
    assert lex(text, scope=make_scope(parallel_tool_calls=False)) == call("foo", "{}") + [Text(f"{CB}bar{SEP}{{}}{CE}")]
    assert lex(text, scope=make_scope(tool_choice_none=True)) == [Text(text)]
    dsml = f"{FC}{invoke('foo')}{INV_END}{invoke('bar')}{INV_END}{FC_END}"
    assert lex(dsml, scope=make_scope(parallel_tool_calls=False)) == call("foo", "{}") + [Text(f"{invoke('bar')}{INV_END}")]


def test_call_ids_are_minted_by_the_scope():
    scope = make_scope()
    segments = run(deepseek(scope), [DEEPSEEK_V31])
    ids = [s.id for s in segments if type(s) is CallBegin]
    assert len(ids) == 2 and all(i.startswith("call_") and scope.id_taken(i) for i in ids) and ids[0] != ids[1]


# -- DeepSeek: DSML ----------------------------------------------------------------------------------


def test_dsml_v32_function_calls_with_string_and_json_parameters():
    text = (
        f"Searching.\n\n{FC}\n{invoke('search')}\n{param('query', 'weather in Paris')}\n"
        f"{param('limit', ' 3 ', 'false')}\n" + param("tags", '["a", 1]', "false") + f"\n{INV_END}\n{FC_END}"
    )
    expected = [Text("Searching.\n\n")] + call("search", '{"query":"weather in Paris","limit":3,"tags":["a", 1]}')
    assert_every_split(text, expected)


def test_dsml_v4_tool_calls_with_two_invokes_each_emitted_when_it_closes():
    lexer = deepseek()
    first = lexer.feed(f"{TC}\n{invoke('foo')}\n{param('a', 'x')}\n{INV_END}\n{invoke('bar')}\n")
    assert merge(first) == call("foo", '{"a":"x"}')
    assert merge(lexer.feed(f"{param('b', '2', 'false')}\n{INV_END}\n{TC_END}") + lexer.finish()) == call("bar", '{"b":2}')


def test_dsml_string_values_are_kept_verbatim():
    value = '  line 1\n  "quoted" <b>\n'
    assert lex(f"{FC}{invoke('foo')}{param('text', value)}{INV_END}{FC_END}") == call("foo", '{"text":"  line 1\\n  \\"quoted\\" <b>\\n"}')


def test_dsml_non_json_value_marked_false_becomes_a_string_and_cannot_add_keys():
    text = f"{FC}{invoke('foo')}{param('a', 'hello', 'false')}" + param("b", '1, "c": 2', "false") + f"{INV_END}{FC_END}"
    assert lex(text) == call("foo", '{"a":"hello","b":"1, \\"c\\": 2"}')


def test_dsml_parameter_without_string_attribute_follows_the_schema():
    text = f"{FC}{invoke('search')}{param('query', '42', None)}{param('limit', '5', None)}{INV_END}{FC_END}"
    assert lex(text) == call("search", '{"query":"42","limit":5}')


def test_dsml_invoke_with_a_json_body():
    assert lex(f"{FC}\n{invoke('foo')}\n{{\"a\": [1, 2]}}\n{INV_END}\n{FC_END}") == call("foo", '{"a": [1, 2]}')


def test_dsml_invoke_missing_its_close_stays_text():
    torn = f"{invoke('foo')}{param('a', 'x')}"
    assert lex(f"{FC}{torn}{FC_END}") == [Text(f"{FC}{torn}{FC_END}")]
    assert lex(f"{FC}{torn}") == [Text(f"{FC}{torn}")]  # cut off by the end of the text


def test_dsml_block_inside_reasoning_then_think_end():
    text = f"Let me search.{TC}{invoke('foo')}{INV_END}{TC_END}\n</think>\n\nHere it is."
    assert_every_split(text, [Text("Let me search.")] + call("foo", "{}") + [ReasoningEnd(), Text("Here it is.")], reasoning=True)
    assert lex("a </think> b", reasoning=True) == [Text("a </think> b")]  # before any section: not ours
    # in content too (issue 20 item 1): the block and the `</think>` after it are markup
    assert_every_split(text, [Text("Let me search.")] + call("foo", "{}") + [Text("Here it is.")])


# DeepSeek-V4 with thinking on writes its DSML block inside the reasoning its template opened and
# only then `</think>` (vLLM #46079): in content, a `</think>` right after calls is dropped.
V4_LATE = f'Checking.{TC}\n{invoke("get_weather")}\n{param("city", "Oslo")}\n{INV_END}\n{TC_END}'


@pytest.mark.parametrize(
    "after, expected",
    [
        ("</think>Done.", [Text("Done.")]),
        (" \n</think>\n\nDone.", [Text("Done.")]),
        ("</think>", []),
        ("</think></think>x", [Text("</think>x")]),  # only the first: the next is the model's text
        ("\nSo </think> x", [Text("\nSo </think> x")]),  # text came first: all of it is text
        ("\n</thin", [Text("\n</thin")]),  # cut off: text, as today
        (f"{SB}{CB}foo{SEP}{{}}{CE}{SE}</think>ok", call("foo", "{}") + [Text("ok")]),  # after a V3.1 section too
    ],
)
def test_deepseek_v4_think_end_right_after_calls_in_content_is_markup(after, expected):
    assert_every_split(V4_LATE + after, [Text("Checking.")] + call("get_weather", '{"city":"Oslo"}') + expected)


def test_think_end_after_a_section_that_made_no_call_stays_text():
    text = f"{TC}{invoke('rm')}{INV_END}{TC_END}</think>ok"
    assert_every_split(text, [Text(text)])


# -- DeepSeek: bounds and the end of the text ---------------------------------------------------------


def test_cut_inside_live_arguments_closes_the_call():
    assert lex(f"{CB}foo{SEP}" + '{"a": 1}  <｜tool▁ca') == call("foo", '{"a": 1}')
    assert lex(f"{CB}foo{SEP}") == call("foo", "{}")


def test_cut_inside_a_header_releases_the_markup_as_text():
    assert lex(f"Checking {SB}{CB}fo") == [Text(f"Checking {SB}{CB}fo")]


def test_complete_held_calls_become_calls_at_the_end():
    assert lex(f"{CB}function{SEP}foo\n```json\n{{}}\n```") == call("foo", "{}")
    assert lex(f"{CB}function{SEP}foo\n```json\n{{}}\n```<｜tool▁call▁e") == call("foo", "{}")
    assert lex(f"{CB}strict_weather{SEP}" + '{"city": "P') == [Text(f"{CB}strict_weather{SEP}" + '{"city": "P')]


def test_held_calls_over_max_held_are_text():
    big = '{"city": "' + "x" * 300 + '"}'
    for text in (
        f"{SB}{CB}function{SEP}foo\n```json\n{big}\n```{CE}{SE}",
        f"{SB}{CB}strict_weather{SEP}{big}{CE}{SE}",
        f"{FC}{invoke('foo')}{param('city', 'x' * 300)}{INV_END}{FC_END}",
    ):
        assert_every_split(text, [Text(text)], max_held=100)


def test_overlong_header_is_not_a_header():
    text = f"{CB}{'h' * 300}{SEP}{{}}{CE} and more"
    assert_every_split(text, [Text(text)])


def test_finish_leaves_the_lexer_reusable():
    lexer = deepseek()
    assert merge(run(lexer, [f"{SB}{CB}fo"])) == [Text(f"{SB}{CB}fo")]
    assert lexer.idle
    assert merge(run(lexer, [DEEPSEEK_V3])) == call("get_weather", '{"city": "Tokyo", "unit": "celsius"}')
    assert lexer.idle


# -- Harmony ------------------------------------------------------------------------------------------


def test_harmony_analysis_final_and_return():
    text = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>The answer is 4.<|return|>"
    assert_every_split(text, [ReasoningText("Think."), ReasoningEnd(), Text("The answer is 4.")], harmony)


def test_harmony_recipient_in_the_role_header():
    text = '<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
    assert_every_split(text, call("get_weather", '{"city": "Paris"}'), harmony)


def test_harmony_call_arguments_stream_live():
    lexer = harmony()
    first = lexer.feed('<|channel|>commentary to=functions.foo <|constrain|>json<|message|>{"a": ')
    assert first == [first[0], CallArgs('{"a":')] and type(first[0]) is CallBegin and first[0].name == "foo"
    assert lexer.feed("1}") == [CallArgs(" 1}")]
    assert lexer.feed("<|call|>") == [CallEnd()]
    assert lexer.finish() == []


def test_harmony_call_ends_at_the_next_message_without_an_end_token():
    text = "<|channel|>commentary to=functions.foo<|message|>{}<|start|>assistant<|channel|>final<|message|>ok"
    assert_every_split(text, call("foo", "{}") + [ReasoningEnd(), Text("ok")], harmony)


def test_harmony_preamble_is_content():
    text = "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>commentary to=functions.foo <|constrain|>json<|message|>{}<|call|>"
    assert_every_split(text, [ReasoningEnd(), Text("Let me check.")] + call("foo", "{}"), harmony)


@pytest.mark.parametrize(
    "message",
    [
        "<|start|>assistant<|channel|>commentary to=functions.rm_rf <|constrain|>json<|message|>{}<|call|>",
        "<|start|>assistant<|channel|>analysis to=browser.search code<|message|>{\"query\": \"x\"}<|call|>",
        "<|start|>assistant to=python<|channel|>analysis code<|message|>print(1)<|call|>",
    ],
)
def test_harmony_undeclared_recipient_stays_text_exactly_as_written(message):
    text = "<|channel|>analysis<|message|>Hmm.<|end|>" + message
    assert_every_split(text, [ReasoningText("Hmm."), Text(message)], harmony)


def test_harmony_strict_tool_is_held_and_validated():
    good = '<|channel|>commentary to=functions.strict_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>'
    assert_every_split(good, call("strict_weather", '{"city": "Oslo"}'), harmony)
    bad = '<|channel|>commentary to=functions.strict_weather <|constrain|>json<|message|>{"city": 3}<|call|>'
    assert_every_split(bad, [Text(bad)], harmony)


def test_harmony_scope_admission():
    text = "<|channel|>commentary to=functions.foo<|message|>{}<|call|><|start|>assistant<|channel|>commentary to=functions.bar<|message|>{}<|call|>"
    second = "<|start|>assistant<|channel|>commentary to=functions.bar<|message|>{}<|call|>"
    assert lex(text, harmony, scope=make_scope(parallel_tool_calls=False)) == call("foo", "{}") + [Text(second)]


def test_harmony_without_tools_still_splits_reasoning_and_shows_calls():
    text = "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>commentary to=functions.foo<|message|>{}<|call|>"
    assert lex(text, harmony, scope=make_scope({})) == [ReasoningText("x"), Text("<|start|>assistant<|channel|>commentary to=functions.foo<|message|>{}<|call|>")]


def test_harmony_cut_header_and_cut_marker_at_the_end():
    assert lex("Hi <|channel|>analys", harmony) == [Text("Hi <|channel|>analys")]
    assert lex("<|channel|>final<|message|>Done<|ret", harmony) == [ReasoningEnd(), Text("Done")]
    assert lex("<|channel|>final<|message|>a <", harmony) == [ReasoningEnd(), Text("a <")]
    assert lex("<|channel|>commentary to=functions.foo<|message|>", harmony) == call("foo", "{}")


def test_harmony_header_over_the_cap_and_held_call_over_max_held_are_text():
    text = f"<|channel|>{'x' * 300}<|message|>hi<|end|>"
    assert_every_split(text, [Text(text)], harmony)
    big = '<|channel|>commentary to=functions.strict_weather<|message|>{"city": "' + "x" * 300 + '"}<|call|>'
    assert_every_split(big, [Text(big)], harmony, max_held=100)


def test_harmony_plain_text_and_whitespace_after_messages():
    assert_every_split("a <|b|> <| c", [Text("a <|b|> <| c")], harmony)
    text = "<|channel|>final<|message|>Hi<|return|>\n\n"
    assert lex(text, harmony) == [ReasoningEnd(), Text("Hi")]
    text = "<|channel|>commentary to=functions.foo<|message|>{}<|call|>\nAfter."
    assert lex(text, harmony) == call("foo", "{}") + [Text("\nAfter.")]


def test_harmony_stray_end_tokens_outside_messages_are_text():
    assert lex("a<|end|>b<|call|>", harmony) == [Text("a<|end|>b<|call|>")]


def test_harmony_finish_leaves_the_lexer_reusable():
    lexer = harmony()
    assert merge(run(lexer, ["<|channel|>final<|message|>x"])) == [ReasoningEnd(), Text("x")]
    assert lexer.idle
    assert merge(run(lexer, ["<|channel|>final<|message|>y"])) == [ReasoningEnd(), Text("y")]


def test_harmony_reasoning_segment_is_the_one_the_rewriters_map():
    assert harmony_module.ReasoningText is ReasoningText


def test_a_lone_angle_bracket_at_the_very_end_is_not_lost():
    assert lex(f"{CB}function{SEP}foo\n```json\n{{}}\n```<") == [Text(f"{CB}function{SEP}foo\n```json\n{{}}\n```<")]
    assert lex(f"{SB}{CB}foo{SEP}{{}}{CE}<") == call("foo", "{}") + [Text("<")]


# -- every split, on random markup ------------------------------------------------------------------

DEEPSEEK_PIECES = [
    SB, SE, CB, SEP, CE, FC, FC_END, TC, TC_END, invoke("foo"), invoke("rm"), invoke("strict_weather"), INV_END,
    param("a", "x"), param("city", "Oslo"), param("b", "1", "false"), '<｜DSML｜parameter name="q">', PAR_END,
    "function", "foo", "rm", "strict_weather", "\n", " ", "```json\n", "```", '{"a": 1}', "{", "}", "hi", "<", "<｜", "</think>",
]
HARMONY_PIECES = [
    "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>", "assistant",
    " to=functions.foo", " to=functions.rm", " to=functions.strict_weather", "analysis", "final", "commentary", " json",
    '{"city": "x"}', "{", "}", '"', "\n", " ", "hi", "<", "<|", "commentary to=functions.", "assistant to=functions.", "foo",
]


@pytest.mark.parametrize(
    "make, pieces, options",
    [
        (deepseek, DEEPSEEK_PIECES, {}),
        (deepseek, DEEPSEEK_PIECES, {"reasoning": True, "max_held": 20}),
        (harmony, HARMONY_PIECES, {}),
        (harmony, HARMONY_PIECES, {"max_held": 15}),
    ],
)
def test_random_markup_gives_the_same_output_however_it_is_split(make, pieces, options):
    import random

    rnd = random.Random(20260)
    for _ in range(150):
        text = "".join(rnd.choice(pieces) for _ in range(rnd.randint(1, 12)))
        whole = lex(text, make, **options)
        cuts = sorted(rnd.sample(range(1, len(text)), min(len(text) - 1, 4))) if len(text) > 1 else []
        split = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert lex(text, make, split, **options) == whole, (text, split)
        assert lex(text, make, list(text), **options) == whole, text
        if make is deepseek and not options and not any(type(s) is CallBegin for s in whole):
            assert whole == [Text(text)]  # nothing became a call: nothing changed


# -- Harmony: the first role header cut by the template, calls on the analysis channel (issue 20) --

# gpt-oss's chat template ends the prompt with `<|start|>assistant` (its generation prompt), and
# the Harmony format puts a recipient in the role header as well as in the channel header
# (openai/harmony docs, "Receiving tool calls"): the output then starts ` to=functions.NAME<|channel|>…`.
LEAD = ' to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city": "Paris"}<|call|>'


def test_harmony_recipient_at_the_very_start_is_a_call():
    assert_every_split(LEAD, call("get_weather", '{"city": "Paris"}'), harmony, lead_recipient=True)
    glued = 'to=functions.foo<|channel|>commentary json<|message|>{}<|call|><|start|>assistant<|channel|>final<|message|>Done.'
    assert_every_split(glued, call("foo", "{}") + [ReasoningEnd(), Text("Done.")], harmony, lead_recipient=True)


def test_harmony_recipient_at_the_start_on_the_analysis_channel_is_a_call():
    text = ' to=functions.search<|channel|>analysis code<|message|>{"query": "x"}<|call|>'
    assert_every_split(text, call("search", '{"query": "x"}'), harmony, lead_recipient=True)


def test_harmony_call_on_the_analysis_channel():
    # vLLM's `openai` tool parser (tool_parsers/openai_tool_parser.py, checked) makes every parsed
    # message whose recipient starts with `functions.` a call, without looking at its channel;
    # gpt-oss writes some on `analysis`.
    text = '<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>analysis to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>'
    assert_every_split(text, [ReasoningText("Need the weather.")] + call("get_weather", '{"city": "Oslo"}'), harmony)


@pytest.mark.parametrize(
    "text",
    [
        "to be or not to be",
        "  today",
        "to=",
        " to=functions.get_weather",  # cut before its `<|channel|>`
        " to=functions.get_weather and more<|channel|>final<|message|>x",
        "\n",
    ],
)
def test_harmony_start_that_is_no_role_header_stays_text(text):
    expected = lex(text, harmony)  # what the lexer gives without the start read
    assert_every_split(text, expected, harmony, lead_recipient=True)
    if "<|" not in text:
        assert expected == [Text(text)]


def test_harmony_role_header_at_the_start_naming_no_declared_tool_stays_text_exactly_as_written():
    text = ' to=functions.rm_rf<|channel|>commentary json<|message|>{}<|call|>'
    assert_every_split(text, [Text(text)], harmony, lead_recipient=True)


def test_harmony_recipient_later_than_the_start_is_no_role_header():
    text = 'Hi to=functions.foo<|channel|>commentary<|message|>{}'
    assert lex(text, harmony, lead_recipient=True) == [Text("Hi to=functions.foo"), ReasoningEnd(), Text("{}")]
    assert lex(LEAD, harmony) != call("get_weather", '{"city": "Paris"}')  # off unless asked: only gpt-oss models start so


def test_harmony_start_is_read_again_after_finish():
    lexer = harmony(lead_recipient=True)
    assert merge(run(lexer, [LEAD])) == call("get_weather", '{"city": "Paris"}')
    assert not lexer.idle  # as new: the start must be read, even with no marker in it
    assert merge(run(lexer, [LEAD[:5], LEAD[5:]])) == call("get_weather", '{"city": "Paris"}')


@pytest.mark.parametrize("cut", [1, 4, 12, len(" to=functions.get_weather"), len(" to=functions.get_weather<|chan")])
def test_harmony_start_through_the_chat_rewriter_for_a_gpt_oss_model(cut):
    # the first content event holds no `<`: the rewriter's fast path must not pass it unread
    import json

    from harness import sse_body
    from toolshim.chat import ChatStreamRewriter
    from toolshim.tools import RequestContext
    from wire import check_chat_stream

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
    context = RequestContext.from_body(json.dumps({"model": "openai/gpt-oss-120b", "messages": [], "tools": tools}).encode())
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-oss-120b"}
    pieces = [LEAD[:cut], LEAD[cut:]]
    chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    chunks += [{**base, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    rewriter = ChatStreamRewriter(context)
    result = check_chat_stream(b"".join(rewriter.feed(sse_body(chunks)) + rewriter.close()))
    assert not result["content"]
    assert [(c["name"], json.loads(c["arguments"])) for c in result["tool_calls"]] == [("get_weather", {"city": "Paris"})]


def test_harmony_start_is_not_idle_until_read():
    # a rewriter's fast path passes text unread while every lexer is idle: the start must not
    lexer = harmony(lead_recipient=True)
    assert not lexer.idle
    assert lexer.feed("") == [] and not lexer.idle
    assert lexer.feed(" to=functions.get") == [] and not lexer.idle
    assert merge(lexer.feed('_weather<|channel|>commentary<|message|>{}<|call|>')) == call("get_weather", "{}")
    assert merge(lexer.feed("ok")) == [Text("ok")] and lexer.idle
    assert harmony().idle and harmony().feed("Hi") == [Text("Hi")]


@pytest.mark.parametrize("first", ["", " ", " to=functions.get_weather"])
def test_harmony_start_through_the_responses_rewriter_for_a_gpt_oss_model(first):
    import json

    from responses import function_tool, responses_events, responses_request, responses_sse
    from toolshim.responses import ResponsesStreamRewriter
    from toolshim.tools import RequestContext
    from wire import check_responses_stream

    request = responses_request("gpt-oss-20b", "weather?", tools=[function_tool("get_weather", WEATHER)])
    context = RequestContext.from_body(json.dumps(request).encode())
    pieces = [first, LEAD[len(first) :]] if first.strip() else [first, LEAD[:25], LEAD[25:]]
    body = responses_sse(responses_events("gpt-oss-20b", pieces))
    rewriter = ResponsesStreamRewriter(context)
    result = check_responses_stream(b"".join(rewriter.feed(body) + rewriter.close()))
    assert [(c["name"], json.loads(c["arguments"])) for c in result["calls"]] == [("get_weather", {"city": "Paris"})]
    assert result["text"] == ""
