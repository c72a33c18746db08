"""The families added as specs on the dialect engine (issue 20 item 9): IBM Granite 3.x
(`specs.GRANITE`), NVIDIA Nemotron (`specs.NEMOTRON`) and Cohere Command R7B / A
(`specs.COMMAND`). Each case says which source it follows: the family's chat template, its
official parser (vLLM's, llama.cpp's grammar) or its documentation. Granite 4 and Nemotron 3
write markup of families read already (Hermes blocks, Qwen3-Coder XML): the registry runs those
for them."""

from __future__ import annotations

import json

import pytest

from toolshim.calls import INVALID_JSON, NOT_ALLOWED, STRICT_FAILURE, UNKNOWN_NAME, CallScope, RewriteStats
from toolshim.lexers import DIALECTS, MARKUP_STARTS, ScopeLexers, dialects_for
from toolshim.lexers.base import CallArgs, CallBegin, CallEnd, ReasoningText, Text
from toolshim.lexers.engine import lexer
from toolshim.lexers.specs import COMMAND, GRANITE, NEMOTRON
from toolshim.stream import markup_may_start
from toolshim.tools import RequestContext, ToolSpec

TOOLS = {
    "get_weather": ToolSpec("get_weather", {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}),
    "get_time": ToolSpec("get_time", {"type": "object", "properties": {"timezone": {"type": "string"}}}),
    "search": ToolSpec("search", {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"], "additionalProperties": False}, strict=True),
}
GRANITE_MODEL = "ibm-granite/granite-3.3-8b-instruct"
NEMOTRON_MODEL = "nvidia/NVIDIA-Nemotron-Nano-9B-v2"
COMMAND_MODEL = "CohereLabs/c4ai-command-a-03-2025"


def scope(tools=TOOLS, model="", **kwargs) -> CallScope:
    return CallScope(RequestContext(tools=dict(tools), model=model, **kwargs), RewriteStats())


def merged(out):
    result = []
    for seg in out:
        if type(seg) in (Text, ReasoningText, CallArgs) and result and type(result[-1]) is type(seg):
            result[-1] = type(seg)(result[-1].text + seg.text)
        else:
            result.append(CallBegin("", seg.name) if type(seg) is CallBegin else seg)  # ids are minted
    return result


def run(spec, text: str, pieces: list[str] | None = None, s: CallScope | None = None):
    lx = lexer(spec, s or scope())
    out = []
    for piece in pieces or [text]:
        out += lx.feed(piece)
    out += lx.finish()
    return merged(out)


def run_model(model: str, text: str, pieces: list[str] | None = None, s: CallScope | None = None):
    """Through the lexers the model name picks, on a content channel (think split included)."""
    lx = ScopeLexers(s or scope(model=model), max_held=1 << 20).new_lexer(reasoning=False)
    out = []
    for piece in pieces or [text]:
        out += lx.feed(piece)
    out += lx.finish()
    return merged(out)


def calls(segments):
    return [(seg.name, json.loads(args.text)) for seg, args in zip(segments, segments[1:]) if type(seg) is CallBegin]


def call(name, args, text=None):
    return [CallBegin("", name), CallArgs(text if text is not None else json.dumps(args, separators=(",", ":"))), CallEnd()]


def same_at_every_split(spec, text: str, s=scope) -> list:
    """`text` whole, at every two-piece split and one character at a time: the same segments.
    (No whitespace right before a marker in `text`: whitespace sent before the marker arrived
    stays sent, the one documented difference between splits.)"""
    whole = run(spec, text, s=s())
    for cut in range(1, len(text)):
        assert run(spec, text, [text[:cut], text[cut:]], s=s()) == whole, cut
    assert run(spec, text, list(text), s=s()) == whole
    return whole


# -- IBM Granite 3.x -------------------------------------------------------------------------------


def test_granite_template_call_after_content_is_a_call():
    # Granite 3.3's chat template renders an assistant turn with calls as its content, then
    # `<|tool_call|>[` + `{"name": "…", "arguments": …}` joined by ", " + `]`.
    text = 'Let me check the forecast.<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}, {"name": "get_time", "arguments": {"timezone": "Europe/Oslo"}}]'
    out = same_at_every_split(GRANITE, text)
    assert out == [Text("Let me check the forecast."), *call("get_weather", {"city": "Oslo", "days": 3}), *call("get_time", {"timezone": "Europe/Oslo"})]


def test_granite_has_no_closer_the_list_ends_the_call_and_prose_after_it_stays():
    # vLLM's `granite` parser reads a JSON list after `<|tool_call|>` to its end; llama.cpp's
    # Granite grammar: content until `<|tool_call|>`, `<|tool_call|>[` … `]`, an optional
    # `<|end_of_text|>`. Text after the list is not the list's: it stays (vLLM would not call).
    text = '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]\nI asked for the weather.'
    assert same_at_every_split(GRANITE, text) == [*call("get_weather", {"city": "Oslo"}), Text("\nI asked for the weather.")]
    # a `]` inside a string is no end; the call is made when the list closes, not at the end of the text
    lx = lexer(GRANITE, scope())
    out = lx.feed('<|tool_call|>[{"name": "get_weather", "arguments": {"city": "[Oslo]"}}]')
    assert merged(out) == call("get_weather", {"city": "[Oslo]"})


def test_granite_one_object_and_whitespace_after_the_marker():
    # The template always writes a list; a single object is read the same way (Hermes blocks too)
    text = '<|tool_call|>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    assert same_at_every_split(GRANITE, text) == call("get_weather", {"city": "Oslo"})


def test_granite_marker_in_prose_or_a_list_cut_short_stays_text():
    # prose about the token: shown at once (streams live), not held
    lx = lexer(GRANITE, scope())
    assert merged(lx.feed("Granite writes <|tool_call|> then")) == [Text("Granite writes <|tool_call|> then")]
    # the answer ends inside the list: nothing was a call, nothing is lost
    text = 'Sure.<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Os'
    assert run(GRANITE, text) == [Text(text)]


def test_granite_4_writes_hermes_blocks_and_the_registry_runs_both():
    # Granite 4.0's chat template (its system prompt, as Ollama and LM Studio ship it): "return a
    # json object with function name and arguments within <tool_call></tool_call> XML tags"
    assert [d.name for d in dialects_for("ibm-granite/granite-4.0-h-small", None)] == ["hermes", "granite"]
    text = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert run_model("ibm-granite/granite-4.0-h-small", text) == [Text("Checking."), *call("get_weather", {"city": "Oslo"})]
    g3 = '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]'
    assert run_model(GRANITE_MODEL, g3) == call("get_weather", {"city": "Oslo"})


# -- NVIDIA Nemotron --------------------------------------------------------------------------------


def test_nemotron_template_call_after_content_is_a_call():
    # The Nemotron-Nano-v2 chat template: the assistant's content, "\n\n" when there is some,
    # then `<TOOLCALL>[` + `{"name": "…", "arguments": …}` joined by ", " + `]</TOOLCALL>`.
    text = 'I will look both up.\n\n<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {"timezone": "UTC"}}]</TOOLCALL>'
    out = run(NEMOTRON, text)
    assert out == [Text("I will look both up."), *call("get_weather", {"city": "Oslo"}), *call("get_time", {"timezone": "UTC"})]
    compact = text.replace("\n\n", "")
    assert same_at_every_split(NEMOTRON, compact) == out


def test_nemotron_closer_inside_a_string_and_content_after_the_call():
    # llama.cpp's Nemotron v2 grammar: `<TOOLCALL>` JSON `</TOOLCALL>`, content before and after
    text = '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "</TOOLCALL>"}}]</TOOLCALL>Done.'
    assert same_at_every_split(NEMOTRON, text) == [*call("get_weather", {"city": "</TOOLCALL>"}), Text("Done.")]


def test_nemotron_3_writes_qwen_xml_and_the_registry_runs_both():
    # llama.cpp's Nemotron v3 format (Nemotron 3 Nano): <tool_call><function=…><parameter=…>
    assert [d.name for d in dialects_for("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B", None)] == ["qwen_xml", "nemotron"]
    # Llama-based Nemotrons also run the Llama dialect (their names say llama)
    assert "nemotron" in [d.name for d in dialects_for("nvidia/Llama-3_3-Nemotron-Super-49B-v1_5", None)]
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"
    assert run_model("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B", text) == call("get_weather", {"city": "Oslo", "days": 2})
    v2 = '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]</TOOLCALL>'
    assert run_model(NEMOTRON_MODEL, v2) == call("get_weather", {"city": "Oslo"})


# -- Cohere Command R7B / Command A ------------------------------------------------------------------


PLAN = "<|START_THINKING|>I will look up the weather in Oslo.<|END_THINKING|>"
ACTION = '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Oslo", "days": 2}},\n    {"tool_call_id": "1", "tool_name": "get_time", "parameters": {"timezone": "Europe/Oslo"}}\n]<|END_ACTION|>'


def test_command_template_action_is_calls_named_by_tool_name():
    # Command R7B's tool-use template renders a turn with calls as the plan in
    # <|START_THINKING|>…<|END_THINKING|>, then <|START_ACTION|>[ one {"tool_call_id", "tool_name",
    # "parameters"} a line ]<|END_ACTION|>; vLLM's `command` parser reads `tool_name` and
    # `parameters` the same way. The arguments are the model's own bytes.
    out = same_at_every_split(COMMAND, ACTION)
    assert out == [*call("get_weather", None, '{"city": "Oslo", "days": 2}'), *call("get_time", None, '{"timezone": "Europe/Oslo"}')]


def test_command_plan_is_reasoning_and_the_action_a_call():
    # llama.cpp's Command R7B parser: <|START_THINKING|>…<|END_THINKING|> is reasoning
    assert [d.name for d in dialects_for(COMMAND_MODEL, None)] == ["command"]
    assert [d.name for d in dialects_for("CohereForAI/c4ai-command-r7b-12-2024", None)] == ["command"]
    text = PLAN + ACTION
    whole = run_model(COMMAND_MODEL, text)
    assert whole[0] == ReasoningText("I will look up the weather in Oslo.")
    assert calls(whole) == [("get_weather", {"city": "Oslo", "days": 2}), ("get_time", {"timezone": "Europe/Oslo"})]
    assert [type(seg) for seg in whole] == [ReasoningText, CallBegin, CallArgs, CallEnd, CallBegin, CallArgs, CallEnd]
    for cut in range(1, len(text)):
        assert run_model(COMMAND_MODEL, text, [text[:cut], text[cut:]]) == whole, cut


def test_command_entries_need_tool_name_and_the_ids_are_minted():
    # vLLM's parser and llama.cpp's grammar read `tool_name`: an entry without it is no call
    s = scope()
    text = '<|START_ACTION|>[{"tool_call_id": "0", "name": "get_weather", "parameters": {}}]<|END_ACTION|>'
    assert run(COMMAND, text, s=s) == [Text(text)]
    assert s.stats.problems[INVALID_JSON] == 1
    # the model's `tool_call_id` counts the turn's calls ("0", "1"): not an id to pass on
    lx = lexer(COMMAND, scope())
    out = lx.feed('<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_time", "parameters": {}}]<|END_ACTION|>')
    assert out[0].id.startswith("call_") and out[0].id != "0"


# -- what every family shares ------------------------------------------------------------------------

BLOCKS = {
    "granite": (GRANITE, '<|tool_call|>[{"name": "%s", "arguments": %s}]'),
    "nemotron": (NEMOTRON, '<TOOLCALL>[{"name": "%s", "arguments": %s}]</TOOLCALL>'),
    "command": (COMMAND, '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "%s", "parameters": %s}]<|END_ACTION|>'),
}


@pytest.mark.parametrize("family", sorted(BLOCKS))
def test_undeclared_tool_strict_misfit_and_tool_choice_none_stay_text_exactly(family):
    spec, form = BLOCKS[family]
    s = scope()
    undeclared = "Sure. " + form % ("rm_rf", '{"path": "/"}') + " Done."
    assert same_at_every_split(spec, undeclared) == [Text(undeclared)]
    assert run(spec, undeclared, s=s) == [Text(undeclared)] and s.stats.problems[UNKNOWN_NAME] == 1
    s = scope()
    misfit = form % ("search", '{"x": 1}')
    assert run(spec, misfit, s=s) == [Text(misfit)] and s.stats.problems[STRICT_FAILURE] == 1
    declared = form % ("get_time", "{}")
    s = scope(tool_choice_none=True)
    lexers = ScopeLexers(s, max_held=1 << 20)
    assert merged(lexers.new_lexer(reasoning=False).feed(declared)) == [Text(declared)]
    s = scope(parallel_tool_calls=False)
    two = form % ("get_time", "{}") + form % ("get_time", "{}")
    assert run(spec, two, s=s) == [*call("get_time", {}, "{}" if family == "command" else None), Text(form % ("get_time", "{}"))]
    assert s.stats.problems[NOT_ALLOWED] == 1


@pytest.mark.parametrize("family", sorted(BLOCKS))
def test_without_declared_tools_everything_passes_at_once(family):
    spec, form = BLOCKS[family]
    lx = lexer(spec, scope({}))
    text = form % ("get_time", "{}")
    assert lx.feed(text[:20]) == [Text(text[:20])] and lx.idle


@pytest.mark.parametrize("family", sorted(BLOCKS))
def test_a_block_over_the_cap_is_text(family):
    spec, form = BLOCKS[family]
    text = form % ("get_weather", json.dumps({"city": "x" * 300}))
    lx = lexer(spec, scope(), max_held=100)
    out = []
    for piece in (text[:50], text[50:150], text[150:]):
        out += lx.feed(piece)
    out += lx.finish()
    assert merged(out) == [Text(text)]


def test_the_registry_knows_every_family_and_the_fast_path_sees_its_markers():
    names = [d.name for d in DIALECTS]
    assert {"granite", "nemotron", "command"} <= set(names)
    for start in ("<|tool_call|>", "<TOOLCALL>", "<|START_ACTION|>", "<|START_THINKING|>"):
        assert start in MARKUP_STARTS
        assert markup_may_start(json.dumps({"content": f"a {start} b"}).encode()), start
    # a model the table does not know runs every dialect, the new ones included
    assert [d.name for d in dialects_for("some-unknown-model", None)] == names
