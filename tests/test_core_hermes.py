"""The `<tool_call>` (Hermes / Qwen) lexer: one test per rule, then every split of one stream."""

from __future__ import annotations

from functools import partial

import json
import os
import random
import re

import pytest

from toolshim import calls as calls_module
from toolshim.calls import (
    INVALID_JSON,
    INVALID_SCHEMA,
    NOT_ALLOWED,
    REPAIRED_JSON,
    SCHEMA_MISMATCH,
    STRICT_FAILURE,
    UNKNOWN_NAME,
    CallScope,
    RewriteStats,
)
from toolshim.lexers.base import CallArgs, CallBegin, CallEnd, Text
from toolshim.judge import ToolCallJudge
from toolshim.lexers.engine import lexer
from toolshim.lexers.specs import HERMES
from toolshim.tools import RequestContext, ToolSpec

hermes_lexer = partial(lexer, HERMES)

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = {
    "get_weather": ToolSpec("get_weather", WEATHER),
    "toolName": ToolSpec("toolName", {"type": "object"}),
    "strict_weather": ToolSpec("strict_weather", {**WEATHER, "additionalProperties": False}, strict=True),
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


def lex(text: str, scope: CallScope | None = None, pieces: list[str] | None = None, **kwargs):
    lexer = hermes_lexer(scope or make_scope(), **kwargs)
    segments = []
    for piece in pieces or [text]:
        segments += lexer.feed(piece)
    segments += lexer.finish()
    return merge(segments)


def call(name, args):
    return [CallBegin(ID, name), CallArgs(args), CallEnd()]


def block(obj, before="", after="") -> str:
    return f"<tool_call>{before}{json.dumps(obj)}{after}</tool_call>"


# -- what a block is ----------------------------------------------------------------------------


def test_object_arguments_become_a_call_with_compact_json():
    text = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>'
    assert lex(text) == [Text("Let me check.")] + call("get_weather", '{"city":"Zürich"}')


def test_string_encoded_arguments_are_the_models_bytes_verbatim():
    text = '<tool_call>{"name":"toolName","arguments":"{\\"k\\": \\"v\\"}"}</tool_call>'  # seed 001
    assert lex(text) == call("toolName", '{"k": "v"}')


def test_parameters_is_an_alias_and_missing_arguments_are_empty():
    assert lex('<tool_call>{"name": "toolName", "parameters": {"a": 1}}</tool_call>') == call("toolName", '{"a":1}')
    assert lex('<tool_call>{"name": "toolName"}</tool_call>') == call("toolName", "{}")


def test_several_blocks_with_text_before_between_and_after():
    first = block({"name": "get_weather", "arguments": {"city": "NYC"}})
    second = block({"name": "toolName", "arguments": {}})
    text = f"Checking both. {first} then {second} Done."
    assert lex(text) == [Text("Checking both.")] + call("get_weather", '{"city":"NYC"}') + [Text(" then")] + call("toolName", "{}") + [Text(" Done.")]


def test_spaces_and_newlines_inside_the_tags_are_allowed():
    text = '<tool_call>\n  \n{\n  "name": "get_weather",\n  "arguments": {"city": "Oslo"}\n}\n  \n</tool_call>'
    assert lex(text) == call("get_weather", '{"city":"Oslo"}')


def test_end_tag_inside_a_json_string_does_not_close_the_block():
    args = {"city": "a</tool_call>b<tool_call>c \\\" \\\\"}
    text = block({"name": "get_weather", "arguments": args}) + "after"
    assert lex(text) == call("get_weather", json.dumps(args, separators=(",", ":"))) + [Text("after")]
    # and in string-encoded arguments, where the quotes inside are escaped
    encoded = json.dumps({"city": "</tool_call>"})
    assert lex(block({"name": "get_weather", "arguments": encoded})) == call("get_weather", encoded)


def test_list_of_calls_in_one_block():
    text = block([{"name": "get_weather", "arguments": {"city": "A"}}, {"name": "toolName", "arguments": "{}"}])
    assert lex(text) == call("get_weather", '{"city":"A"}') + call("toolName", "{}")


def test_list_is_all_or_nothing():
    scope = make_scope()
    text = block([{"name": "get_weather", "arguments": {"city": "A"}}, {"name": "rm_rf", "arguments": {}}])
    assert lex(text, scope) == [Text(text)]
    assert scope.stats.problems[UNKNOWN_NAME] == 1 and scope.stats.calls == 0


def test_integers_beyond_64_bits_stay_exact():
    text = '<tool_call>{"name": "toolName", "arguments": {"n": 123456789012345678901234567890}}</tool_call>'
    assert lex(text) == call("toolName", '{"n":123456789012345678901234567890}')


# -- what stays text ----------------------------------------------------------------------------


def test_undeclared_name_stays_text_and_is_noted():
    scope = make_scope()
    text = "Hi " + block({"name": "rm_rf", "arguments": {}}) + " bye"
    assert lex(text, scope) == [Text(text)]
    assert scope.stats.problems[UNKNOWN_NAME] == 1


def test_no_declared_tools_means_no_calls_and_nothing_held():
    text = block({"name": "get_weather", "arguments": {"city": "NYC"}})
    assert lex(text, make_scope({})) == [Text(text)]
    lexer = hermes_lexer(make_scope({}))
    assert lexer.feed(text[:20]) == [Text(text[:20])] and lexer.idle


def test_prose_mentioning_the_tag_streams_live():
    lexer = hermes_lexer(make_scope())
    # the first character after the tag decides: the text comes out of the same piece
    assert merge(lexer.feed("Wrap calls in <tool_call> tags, like")) == [Text("Wrap calls in <tool_call> tags, like")]
    assert merge(lexer.feed(" <tool_call>\nname")) == [Text(" <tool_call>\nname")]
    assert lexer.feed(" and <tool_call>") == [Text(" and")]  # the tag waits for its next character
    assert merge(lexer.feed("x")) == [Text(" <tool_call>x")]
    assert lexer.finish() == [] and lexer.idle


def test_look_alikes_pass_unchanged():
    text = "a <tool b <tool_call c </tool_call> d <b> e <tool_calls> f"
    assert lex(text) == [Text(text)]
    assert lex(text, pieces=list(text)) == [Text(text)]


# -- strict and non-strict tools (seed 001, D5 / D5a) -------------------------------------------


def test_strict_tool_with_valid_arguments_is_a_call():
    assert lex(block({"name": "strict_weather", "arguments": {"city": "Rome"}})) == call("strict_weather", '{"city":"Rome"}')


def test_strict_tool_with_schema_violating_arguments_stays_text():
    scope = make_scope()
    text = block({"name": "strict_weather", "arguments": {"city": 5}})
    assert lex(text, scope) == [Text(text)]
    assert scope.stats.problems[STRICT_FAILURE] == 1 and scope.stats.calls == 0


def test_strict_tool_with_invalid_json_stays_text_without_repair():
    scope = make_scope()
    broken_args = '<tool_call>{"name": "strict_weather", "arguments": "{\\"city\\": \\"Rome\\",}"}</tool_call>'
    broken_block = '<tool_call>{"name": "strict_weather", "arguments": {"city": "Rome",}}</tool_call>'
    assert lex(broken_args, scope) == [Text(broken_args)]
    assert lex(broken_block, scope) == [Text(broken_block)]
    assert scope.stats.problems[STRICT_FAILURE] == 2 and scope.stats.problems[REPAIRED_JSON] == 0


def test_non_strict_trailing_comma_is_repaired_and_noted():
    scope = make_scope()
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome",},}</tool_call>'
    assert lex(text, scope) == call("get_weather", '{"city":"Rome"}')
    assert scope.stats.problems[REPAIRED_JSON] == 1
    # string-encoded arguments get the same one pass
    text = '<tool_call>{"name": "get_weather", "arguments": "{\'city\': \'Rome\'}"}</tool_call>'
    assert lex(text, scope) == call("get_weather", '{"city":"Rome"}')
    assert scope.stats.problems[REPAIRED_JSON] == 2


def test_non_strict_unrepairable_stays_text():
    scope = make_scope()
    text = '<tool_call>{"name": "get_weather", "arguments": "@@@ not json"}</tool_call>'
    assert lex(text, scope) == [Text(text)]
    assert scope.stats.problems[INVALID_JSON] == 1 and scope.stats.calls == 0


def test_non_strict_schema_mismatch_is_emitted_and_noted():
    scope = make_scope()
    assert lex(block({"name": "get_weather", "arguments": {"town": "X"}}), scope) == call("get_weather", '{"town":"X"}')
    assert scope.stats.problems[SCHEMA_MISMATCH] == 1 and scope.stats.calls == 1


def test_invalid_schema_means_no_schema_and_is_noted():
    scope = make_scope({"odd": ToolSpec("odd", {"type": "no-such-type"}, strict=True)})
    assert lex(block({"name": "odd", "arguments": {"x": 1}}), scope) == call("odd", '{"x":1}')
    assert scope.stats.problems[INVALID_SCHEMA] == 1


def test_tool_choice_none_keeps_every_block_text():
    scope = make_scope(tool_choice_none=True)
    text = block({"name": "get_weather", "arguments": {"city": "NYC"}})
    assert lex(text, scope) == [Text(text)]
    assert scope.stats.problems[NOT_ALLOWED] == 1


def test_parallel_tool_calls_false_keeps_the_second_block_text():
    scope = make_scope(parallel_tool_calls=False)
    first = block({"name": "get_weather", "arguments": {"city": "A"}})
    second = block({"name": "get_weather", "arguments": {"city": "B"}})
    assert lex(first + "\n" + second, scope) == call("get_weather", '{"city":"A"}') + [Text("\n" + second)]
    assert scope.stats.problems[NOT_ALLOWED] == 1 and scope.stats.calls == 1
    # a list of several calls is one unit: it stays text before anything is admitted
    scope = make_scope(parallel_tool_calls=False)
    both = block([{"name": "get_weather", "arguments": {"city": "A"}}, {"name": "get_weather", "arguments": {"city": "B"}}])
    assert lex(both, scope) == [Text(both)]
    assert scope.stats.calls == 0


# -- blocks that do not end properly ------------------------------------------------------------


def test_unclosed_block_with_complete_json_is_a_call_at_finish():
    assert lex('Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "NYC"}}\n') == [Text("Sure.")] + call("get_weather", '{"city":"NYC"}')
    # a half-written end tag at the end is part of the markup
    assert lex('<tool_call>{"name": "toolName"}</tool_ca') == call("toolName", "{}")


def test_unclosed_block_with_incomplete_json_is_text_at_finish():
    text = 'Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "NY'
    assert lex(text) == [Text(text)]
    assert lex("<tool_call>\n ") == [Text("<tool_call>\n ")]
    # a value followed by prose is not a block left open: without its end tag it stays text
    text = '<tool_call>{"name": "toolName"} and then I said'
    assert lex(text) == [Text(text)]


def test_next_tag_closes_a_block_missing_its_end_tag():
    text = '<tool_call>{"name": "toolName"}\n<tool_call>{"name": "get_weather", "arguments": {"city": "B"}}</tool_call>'
    assert lex(text) == call("toolName", "{}") + call("get_weather", '{"city":"B"}')
    # a value cut short by the next tag is text, and the next block still counts
    text = '<tool_call>{"name": "toolName", "arguments": <tool_call>{"name": "toolName"}</tool_call>'
    assert lex(text) == [Text('<tool_call>{"name": "toolName", "arguments":')] + call("toolName", "{}")


def test_block_over_the_cap_is_released_as_text():
    text = block({"name": "get_weather", "arguments": {"city": "x" * 200}})
    assert lex(text, max_held=100) == [Text(text)]
    assert lex(text, pieces=[text[i : i + 7] for i in range(0, len(text), 7)], max_held=100) == [Text(text)]
    assert lex(text, max_held=len(text)) == call("get_weather", json.dumps({"city": "x" * 200}, separators=(",", ":")))


# -- whitespace ---------------------------------------------------------------------------------


def test_whitespace_around_calls_is_padding():
    a = block({"name": "toolName", "arguments": {}})
    assert lex(f"Plan: \n{a}\n{a}\n\n") == [Text("Plan:")] + call("toolName", "{}") * 2
    assert lex(f"{a}\n\nThe answer") == call("toolName", "{}") + [Text("\n\nThe answer")]


def test_whitespace_around_text_blocks_is_kept_exactly():
    unknown = block({"name": "rm_rf", "arguments": {}})
    text = f"Plan: \n{unknown}\n more"
    assert lex(text) == [Text(text)]


def test_whitespace_sent_in_an_earlier_piece_stays_sent():
    lexer = hermes_lexer(make_scope())
    assert lexer.feed("Plan: \n") == [Text("Plan: \n")]
    out = lexer.feed(block({"name": "toolName", "arguments": {}})) + lexer.finish()
    assert merge(out) == call("toolName", "{}")


# -- ids and reuse ------------------------------------------------------------------------------


def test_minted_ids_are_openai_shaped_and_unique():
    a = block({"name": "toolName", "arguments": {}})
    lexer = hermes_lexer(make_scope())
    out = lexer.feed(a * 20) + lexer.finish()
    ids = [seg.id for seg in out if isinstance(seg, CallBegin)]
    assert len(ids) == 20 and len(set(ids)) == 20
    assert all(re.fullmatch(r"call_[A-Za-z0-9]{24}", i) for i in ids)


def test_id_characters_are_read_in_bulk_and_handed_out_once(monkeypatch: pytest.MonkeyPatch):
    """Ids come from random bytes read 4 KB at a time (a read of the system's source per id was a
    system call per call), each character handed out once, across refills too; every
    alphanumeric turns up, none else."""
    reads: list[bytes] = []
    rng = random.Random(7)

    class CountingSecrets:
        @staticmethod
        def token_bytes(count: int) -> bytes:
            reads.append(rng.randbytes(count))
            return reads[-1]

    monkeypatch.setattr(calls_module, "secrets", CountingSecrets)
    monkeypatch.setattr(calls_module, "_ID_CHARACTERS", calls_module.IdCharacters())
    ids = [calls_module.random_id("call_") for _ in range(1_000)]
    assert len(set(ids)) == 1_000 and all(re.fullmatch(r"call_[A-Za-z0-9]{24}", i) for i in ids)
    assert 5 <= len(reads) <= 8 and {len(read) for read in reads} == {4096}  # (24,000 characters, about 3,870 a read)
    # Handed out once, in order: the ids are the reads' bytes mapped onto the alphabet (the bytes
    # past its last multiple dropped), one after the other, across the reads' ends.
    alphabet = calls_module._ID_ALPHABET
    stream = "".join(alphabet[byte % len(alphabet)] for read in reads for byte in read if byte < len(alphabet) * (256 // len(alphabet)))
    assert "".join(i[5:] for i in ids) == stream[: 24 * 1_000]
    assert set(stream) == set(alphabet)


def test_a_forked_child_reads_its_own_id_characters():
    """A worker forked after the addon made ids (mitmproxy's own processes, a test's) hands out
    none of the characters its parent read ahead."""
    calls_module.random_id("call_")  # the parent holds characters read ahead
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.write(writer, calls_module.random_id("").encode())
        os._exit(0)
    os.close(writer)
    os.waitpid(pid, 0)
    child = os.read(reader, 64).decode()
    os.close(reader)
    ahead = calls_module._ID_CHARACTERS.take(4_000)  # all the parent still holds, and more
    assert len(child) == 24 and child not in ahead


def test_finish_leaves_the_lexer_as_new():
    lexer = hermes_lexer(make_scope())
    a = block({"name": "toolName", "arguments": {}})
    for held in ["<tool_c", '<tool_call>{"name": "to', "x" + a + "  ", ""]:
        lexer.feed(held)
        lexer.finish()
        assert lexer.idle
        assert merge(lexer.feed("hi " + a) + lexer.finish()) == [Text("hi")] + call("toolName", "{}")


def test_idle_only_when_nothing_is_held():
    lexer = hermes_lexer(make_scope())
    assert lexer.idle
    lexer.feed("abc <tool")
    assert not lexer.idle
    lexer.feed("s> x")
    assert lexer.idle


def test_judge_is_usable_without_the_lexer():
    scope = make_scope()
    judge = ToolCallJudge(scope)
    calls = judge.verdict('{"name": "get_weather", "arguments": "{\\"city\\":\\"P\\"}"}')
    assert calls == [("get_weather", '{"city":"P"}', None)]
    assert judge.verdict('{"name": "nope"}') is None


# -- every split --------------------------------------------------------------------------------

STREAM = (
    "Let me look.  <tool_call>\n"
    + json.dumps({"name": "get_weather", "arguments": {"city": 'New </tool_call> "York" \\ 日本'}})
    + "\n</tool_call>\n<tool_call>"
    + json.dumps({"name": "toolName", "arguments": json.dumps({"k": "<tool_call>"})})
    + "</tool_call>\n\nAnd <tool_call> is the tag; <tool_call>"
    + json.dumps({"name": "rm_rf"})
    + "</tool_call> stays."
)


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_every_two_piece_split_gives_the_same_output(cut):
    whole = lex(STREAM)
    assert whole == (
        [Text("Let me look.")]
        + call("get_weather", json.dumps({"city": 'New </tool_call> "York" \\ 日本'}, ensure_ascii=False, separators=(",", ":")))
        + call("toolName", json.dumps({"k": "<tool_call>"}))
        + [Text('\n\nAnd <tool_call> is the tag; <tool_call>{"name": "rm_rf"}</tool_call> stays.')]
    )
    split = lex(STREAM, pieces=[STREAM[:cut], STREAM[cut:]])
    padding = STREAM.index("  <tool_call>")
    if padding < cut < padding + 2 + 1:
        # whitespace sent before its tag arrived stays sent: the one difference splits make
        assert split == [Text(STREAM[:cut])] + whole[1:]
    else:
        assert split == whole
