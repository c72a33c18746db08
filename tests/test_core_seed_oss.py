"""ByteDance Seed-OSS, the family added as one spec (`specs.SEED_OSS`): Qwen3-Coder's function and
parameter elements inside `<seed:tool_call>`, reasoning in `<seed:think>`."""

from __future__ import annotations

import json

from toolshim.calls import STRICT_FAILURE, UNKNOWN_NAME, CallScope, RewriteStats
from toolshim.lexers import DIALECTS, MARKUP_STARTS, ScopeLexers, dialects_for
from toolshim.lexers.base import CallArgs, CallBegin, CallEnd, ReasoningText, Text
from toolshim.lexers.engine import lexer
from toolshim.lexers.specs import SEED_OSS
from toolshim.stream import markup_may_start
from toolshim.tools import RequestContext, ToolSpec

TOOLS = {
    "get_weather": ToolSpec("get_weather", {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}),
    "search": ToolSpec("search", {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"], "additionalProperties": False}, strict=True),
}
CALL = "<seed:tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</seed:tool_call>"


def scope(tools=TOOLS, **kwargs) -> CallScope:
    return CallScope(RequestContext(tools=dict(tools), model="Seed-OSS-36B-Instruct", **kwargs), RewriteStats())


def run(text: str, pieces: list[str] | None = None, s: CallScope | None = None):
    lx = lexer(SEED_OSS, s or scope())
    out = []
    for piece in pieces or [text]:
        out += lx.feed(piece)
    out += lx.finish()
    merged = []
    for seg in out:
        if type(seg) is Text and merged and type(merged[-1]) is Text:
            merged[-1] = Text(merged[-1].text + seg.text)
        else:
            merged.append(CallBegin("", seg.name) if type(seg) is CallBegin else seg)  # ids are minted
    return merged


def calls(segments):
    return [(seg.name, json.loads(args.text)) for seg, args in zip(segments, segments[1:]) if type(seg) is CallBegin]


def test_a_call_between_text_becomes_a_call_with_values_typed_by_the_schema():
    out = run(f"Let me look.\n{CALL}\nDone.")
    assert out[0] == Text("Let me look.")
    assert calls(out) == [("get_weather", {"city": "Oslo", "days": 3})]
    assert type(out[3]) is CallEnd and out[4] == Text("\nDone.")


def test_the_same_at_every_two_piece_split():
    text = f"Hi:{CALL} bye"  # (whitespace sent before a marker stays sent: none here)
    whole = run(text)
    for cut in range(1, len(text)):
        assert run(text, [text[:cut], text[cut:]]) == whole, cut


def test_two_functions_in_one_wrapper_and_a_wrapper_left_open_at_the_end():
    text = "<seed:tool_call><function=get_weather><parameter=city>A</parameter></function><function=get_weather><parameter=city>B</parameter></function>"
    assert calls(run(text)) == [("get_weather", {"city": "A"}), ("get_weather", {"city": "B"})]


def test_an_undeclared_tool_or_a_strict_misfit_stays_text_exactly():
    s = scope()
    undeclared = CALL.replace("get_weather", "rm_rf")
    assert run(undeclared, s=s) == [Text(undeclared)]
    assert s.stats.problems[UNKNOWN_NAME] == 1
    s = scope()
    misfit = "<seed:tool_call><function=search><parameter=x>1</parameter></function></seed:tool_call>"
    assert run(misfit, s=s) == [Text(misfit)]
    assert s.stats.problems[STRICT_FAILURE] == 1


def test_qwen_and_hermes_blocks_are_not_seed_markup():
    for text in ('<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>', "<tool_call><function=get_weather></function></tool_call>", "<function=get_weather></function>"):
        assert run(text) == [Text(text)]


def test_without_declared_tools_everything_passes_at_once():
    lx = lexer(SEED_OSS, scope({}))
    assert lx.feed("<seed:tool_call><function=") == [Text("<seed:tool_call><function=")]
    assert lx.idle


def test_the_model_name_picks_the_dialect_and_reasoning_is_split_off():
    assert [d.name for d in dialects_for("ByteDance-Seed/Seed-OSS-36B-Instruct", None)] == ["seed_oss"]
    lexers = ScopeLexers(scope(), max_held=1 << 20)
    lx = lexers.new_lexer(reasoning=False)
    out = lx.feed("<seed:think>Weather, so a tool.</seed:think>")
    assert not lexers.idle and lexers.idle == lx.idle  # reported by the lexers, not walked
    out += lx.feed(CALL) + lx.feed("Sunny.")
    assert lexers.idle and lexers.idle == lx.idle
    out += lx.finish()
    assert out[0] == ReasoningText("Weather, so a tool.")
    assert [type(seg) for seg in out[1:]] == [CallBegin, CallArgs, CallEnd, Text]


def test_every_registered_start_is_seen_by_the_sse_fast_path():
    for start in MARKUP_STARTS:
        assert markup_may_start(json.dumps({"content": f"a {start} b"}).encode()), start
    assert "<seed:tool_call>" in MARKUP_STARTS and "[TOOL_CALLS]" in MARKUP_STARTS
    assert not markup_may_start(b'{"choices":[{"delta":{"content":"a [b] c"},"logprobs":[]}]}')
    assert {t for d in DIALECTS for t in d.starts} <= set(MARKUP_STARTS)
