"""Leftover tokens, undeclared calls and escaped GLM blocks on the engine dialects (issue 20,
items 2, 3 and 8). Each rule says which reference parser it follows, and where vLLM, SGLang and
llama.cpp disagree, which way toolshim goes (README, "Dialects")."""

from __future__ import annotations

import json

import pytest

from toolshim.calls import UNKNOWN_NAME, CallScope, RewriteStats
from toolshim.lexers import DIALECTS, ScopeLexers, dialects_for
from toolshim.lexers.base import CallArgs, CallBegin, CallEnd, ReasoningText, Text
from toolshim.tools import RequestContext, ToolSpec

STRINGS = {"type": "object", "properties": {"city": {"type": "string"}, "path": {"type": "string"}, "content": {"type": "string"}}}
TOOLS = {
    "get_weather": ToolSpec("get_weather", STRINGS),
    "write_file": ToolSpec("write_file", STRINGS),
    "get_time": ToolSpec("get_time", {"type": "object", "properties": {}}),
    "todo_write": ToolSpec("todo_write", {"type": "object", "properties": {"todos": {"type": "array"}}}),
    "forecast": ToolSpec("forecast", {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}),
}


def scope(model: str, **kwargs) -> CallScope:
    return CallScope(RequestContext(tools=dict(TOOLS), model=model, **kwargs), RewriteStats())


def run(model: str, text: str, pieces: list[str] | None = None, *, reasoning: bool = False, s: CallScope | None = None):
    lx = ScopeLexers(s or scope(model), max_held=1 << 20).new_lexer(reasoning=reasoning)
    out = []
    for piece in pieces or [text]:
        out += lx.feed(piece)
    out += lx.finish()
    merged = []
    for seg in out:
        if type(seg) in (Text, ReasoningText, CallArgs) and merged and type(merged[-1]) is type(seg):
            merged[-1] = type(seg)(merged[-1].text + seg.text)
        else:
            merged.append(CallBegin("", seg.name) if type(seg) is CallBegin else seg)  # ids are minted
    return merged


def every_split(model: str, text: str, **kwargs) -> list:
    """The segments of `text` whole, checked equal at every two-piece split and one character at
    a time (texts here have no whitespace right before a marker: see README, "Known limits")."""
    whole = run(model, text, **kwargs)
    for cut in range(1, len(text)):
        assert run(model, text, [text[:cut], text[cut:]], **kwargs) == whole, cut
    assert run(model, text, list(text), **kwargs) == whole
    return whole


def call(name, args):
    return [CallBegin("", name), CallArgs(json.dumps(args, separators=(",", ":"), ensure_ascii=False)), CallEnd()]


QWEN = "Qwen/Qwen3-Coder-30B-A3B-Instruct"
FUNCTION = "<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>"


# -- item 2: an orphan closer after a bare Qwen3-Coder function --------------------------------------


def test_an_orphan_wrapper_end_after_a_bare_function_goes_with_the_call():
    # vLLM's qwen3_coder parser makes the call of a bare `<function=…>` and drops everything after
    # it, the stray `</tool_call>` included; SGLang's detector does the same; llama.cpp's grammar
    # has no bare function. Chosen: the closer is markup of the call, prose after it stays.
    assert every_split(QWEN, FUNCTION + "\n</tool_call>") == call("get_weather", {"city": "Oslo"})
    assert every_split(QWEN, "Sure." + FUNCTION + "\n</tool_call>\nDone.") == [Text("Sure."), *call("get_weather", {"city": "Oslo"}), Text("\nDone.")]
    # a closer cut short at the very end is markup too; a tag that is not the closer is not taken
    assert run(QWEN, FUNCTION + "\n</tool_") == call("get_weather", {"city": "Oslo"})
    assert every_split(QWEN, FUNCTION + "\n</tool>") == [*call("get_weather", {"city": "Oslo"}), Text("\n</tool>")]
    # only right after the function: a closer after prose is the model's text
    text = FUNCTION + " done </tool_call>"
    assert every_split(QWEN, text) == [*call("get_weather", {"city": "Oslo"}), Text(" done </tool_call>")]


def test_an_orphan_closer_after_an_undeclared_bare_function_stays_text_exactly():
    s = scope(QWEN)
    text = FUNCTION.replace("get_weather", "rm_rf") + "\n</tool_call>"
    assert every_split(QWEN, text) == [Text(text)]
    assert run(QWEN, text, s=s) == [Text(text)] and s.stats.problems[UNKNOWN_NAME] == 1


# -- item 2: a wrapper of a known family around a call -------------------------------------------


def test_seed_oss_wrapper_is_read_with_its_call_where_qwen_xml_runs_too():
    # A model the table does not know runs every dialect; Qwen XML reads bare functions, and used
    # to take the call out of Seed-OSS's wrapper and leave `<seed:tool_call>` … `</seed:tool_call>`
    # in the text. Seed-OSS runs first now (vLLM's seed_oss parser reads the wrapper with its call).
    names = [d.name for d in DIALECTS]
    assert names.index("seed_oss") < names.index("qwen_xml")
    block = "<seed:tool_call>\n" + FUNCTION + "\n</seed:tool_call>"
    for model in ("my-finetune", "ByteDance-Seed/Seed-OSS-36B-Instruct"):
        assert every_split(model, "Sure." + block + "Done.") == [Text("Sure."), *call("get_weather", {"city": "Oslo"}), Text("Done.")], model
    # a bare function without the wrapper is still Qwen XML's
    assert every_split("my-finetune", FUNCTION) == call("get_weather", {"city": "Oslo"})


# -- item 2: non-call text between a section's markers ----------------------------------------------

MINIMAX = "MiniMaxAI/MiniMax-M2"
INVOKE_A = '<invoke name="get_weather"><parameter name="city">A</parameter></invoke>'
INVOKE_B = '<invoke name="get_weather"><parameter name="city">B</parameter></invoke>'


def test_text_between_the_calls_of_a_section_is_shown_in_its_place():
    # vLLM's minimax_m2 and qwen3_coder parsers (and SGLang's detectors) read every `<invoke>` /
    # `<function=…>` in the wrapper and drop the text between them; llama.cpp's grammars allow
    # none. Chosen: the calls, and the text shown where it was (nothing the model wrote is lost).
    text = f"<minimax:tool_call>\n{INVOKE_A}\nand also\n{INVOKE_B}\nthat is all\n</minimax:tool_call>"
    out = every_split(MINIMAX, text)
    assert out == [*call("get_weather", {"city": "A"}), Text("\nand also"), *call("get_weather", {"city": "B"}), Text("\nthat is all")]
    qwen = f"<tool_call>\n{FUNCTION}\nnote\n{FUNCTION}\n</tool_call>"
    assert every_split(QWEN, qwen) == [*call("get_weather", {"city": "Oslo"}), Text("\nnote"), *call("get_weather", {"city": "Oslo"})]
    seed = f"<seed:tool_call>{FUNCTION} (checking) </seed:tool_call>Done."
    assert every_split("seed-oss-36b", seed) == [*call("get_weather", {"city": "Oslo"}), Text(" (checking)Done.")]


def test_text_in_a_wrapper_left_open_is_shown_after_its_calls():
    # the wrapper never closes: every complete function is a call (vLLM's fallback regex makes
    # them too), and the text after it is shown
    text = f"<minimax:tool_call>\n{INVOKE_A}\nThe weather is coming."
    assert every_split(MINIMAX, text) == [*call("get_weather", {"city": "A"}), Text("\nThe weather is coming.")]


def test_text_before_the_first_call_of_a_section_makes_the_block_text():
    # Chosen (vLLM would drop the text and make the call): before its first function a wrapper
    # is not known to hold calls; prose that names the tag must stream live, so the block is
    # shown at once, as written
    text = f"<minimax:tool_call>\nLet me see.\n{INVOKE_A}\n</minimax:tool_call>"
    lx = ScopeLexers(scope(MINIMAX), max_held=1 << 20).new_lexer(reasoning=False)
    shown = "".join(seg.text for seg in lx.feed(text[:35]))
    assert shown == text[:35]  # released at "Let", nothing held
    assert every_split(MINIMAX, text) == [Text(text)]


def test_a_section_with_text_and_an_undeclared_call_stays_text_exactly():
    text = f"<minimax:tool_call>\n{INVOKE_A}\nand\n{INVOKE_B.replace('get_weather', 'rm_rf')}\n</minimax:tool_call>"
    assert every_split(MINIMAX, text) == [Text(text)]


# -- item 3: undeclared calls stay text exactly as written, in every engine dialect ----------------

UNDECLARED = {
    "hermes": ("Qwen/Qwen2.5-72B-Instruct", '<tool_call>\n{"name": "rm_rf", "arguments": {"path": "/"}}\n</tool_call>'),
    "qwen_xml": (QWEN, "<tool_call>\n<function=rm_rf>\n<parameter=path>\n/\n</parameter>\n</function>\n</tool_call>"),
    "qwen_xml bare": (QWEN, "<function=rm_rf>\n<parameter=path>\n/\n</parameter>\n</function>"),
    "seed_oss": ("seed-oss-36b", "<seed:tool_call>\n<function=rm_rf>\n<parameter=path>\n/\n</parameter>\n</function>\n</seed:tool_call>"),
    "glm": ("zai-org/GLM-4.6", "<tool_call>rm_rf\n<arg_key>path</arg_key>\n<arg_value>/</arg_value>\n</tool_call>"),
    "glm escaped": ("zai-org/GLM-4.6", "<tool_call>rm_rf\\n<arg_key>path</arg_key>\\n<arg_value>\\\"/\\\"</arg_value>\\n</tool_call>"),
    "minimax": (MINIMAX, '<minimax:tool_call>\n<invoke name="rm_rf">\n<parameter name="path">/</parameter>\n</invoke>\n</minimax:tool_call>'),
    "mistral v13": ("mistralai/Devstral-Small-2507", '[TOOL_CALLS]rm_rf[ARGS]{"path": "/"}'),
    "mistral list": ("mistralai/Mistral-7B-Instruct-v0.3", '[TOOL_CALLS][{"name": "rm_rf", "arguments": {"path": "/"}}]'),
    "llama function": ("meta-llama/Llama-3.1-8B-Instruct", '<function=rm_rf>{"path": "/"}</function>'),
    "llama pythonic": ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "<|python_start|>[rm_rf(path='/')]<|python_end|>"),
    "granite": ("ibm-granite/granite-3.3-8b-instruct", '<|tool_call|>[{"name": "rm_rf", "arguments": {"path": "/"}}]'),
    "nemotron": ("nvidia/NVIDIA-Nemotron-Nano-9B-v2", '<TOOLCALL>[{"name": "rm_rf", "arguments": {"path": "/"}}]</TOOLCALL>'),
    "command": ("CohereLabs/c4ai-command-a-03-2025", '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "rm_rf", "parameters": {"path": "/"}}]<|END_ACTION|>'),
}


@pytest.mark.parametrize("case", sorted(UNDECLARED))
def test_an_undeclared_call_stays_text_exactly_as_written(case):
    model, block = UNDECLARED[case]
    name = case.split()[0]
    assert name in [d.name for d in dialects_for(model, None)]
    for text in (block, f"Sure. {block} Done.", f"Sure.\n\n{block}\n\nDone."):
        s = scope(model)
        assert run(model, text, s=s) == [Text(text)], text
        assert s.stats.problems[UNKNOWN_NAME] == 1
        for cut in range(1, len(text)):
            assert run(model, text, [text[:cut], text[cut:]]) == [Text(text)], (text, cut)
        assert run(model, text, list(text)) == [Text(text)]
        # in a reasoning channel too
        assert run(model, text, reasoning=True) == [Text(text)]  # (the channel is reasoning)


# -- item 8: GLM blocks whose separators arrive escaped ------------------------------------------

GLM46 = "zai-org/GLM-4.6"


def test_glm_block_escaped_as_a_json_string_becomes_a_call():
    # SGLang PR #12456's GLM-4.6 output: separators as a literal backslash-n, quotes as `\"`. Its
    # parser and vLLM's glm4_moe both accept `\n` where a newline goes and read a value that is
    # not JSON as the text of a JSON string (unescaped), then as JSON.
    text = (
        "<tool_call>todo_write\\n<arg_key>todos</arg_key>\\n<arg_value>[{\\\"id\\\": \\\"1\\\", \\\"task\\\": \\\"检查后端代码\\\", "
        "\\\"status\\\": \\\"in_progress\\\"}]</arg_value>\\n</tool_call>"
    )
    assert every_split(GLM46, text) == call("todo_write", {"todos": [{"id": "1", "task": "检查后端代码", "status": "in_progress"}]})


def test_glm_escaped_block_string_values_are_unescaped_too():
    # Chosen (vLLM and SGLang keep a string value as written, backslashes and all): in a block
    # whose separators are escaped the values are escaped too, so a multi-line file arrives with
    # its newlines and quotes; a value that is no valid JSON string text stays as written.
    text = '<tool_call>write_file\\n<arg_key>path</arg_key>\\n<arg_value>a.py</arg_value>\\n<arg_key>content</arg_key>\\n<arg_value>print(\\"hi\\")\\nprint(2)</arg_value>\\n</tool_call>'
    assert every_split(GLM46, text) == call("write_file", {"path": "a.py", "content": 'print("hi")\nprint(2)'})
    regex = "<tool_call>write_file\\n<arg_key>content</arg_key>\\n<arg_value>\\d+ \"x\"</arg_value>\\n</tool_call>"
    assert every_split(GLM46, regex) == call("write_file", {"content": '\\d+ "x"'})
    # typed by the schema after unescaping; a call without arguments
    assert every_split(GLM46, "<tool_call>forecast\\n<arg_key>days</arg_key>\\n<arg_value>3</arg_value>\\n</tool_call>") == call("forecast", {"days": 3})
    assert every_split(GLM46, "<tool_call>get_time\\n</tool_call>") == call("get_time", {})


def test_glm_plain_blocks_keep_their_backslashes():
    # with real newlines (or none, GLM-4.7) nothing is unescaped: `\n` in a value is the model's text
    text = '<tool_call>write_file\n<arg_key>content</arg_key>\n<arg_value>print("a\\nb")</arg_value>\n</tool_call>'
    assert every_split(GLM46, text) == call("write_file", {"content": 'print("a\\nb")'})
    glm47 = '<tool_call>write_file<arg_key>content</arg_key><arg_value>x\\ny</arg_value></tool_call>'
    assert every_split("zai-org/GLM-4.7", glm47) == call("write_file", {"content": "x\\ny"})
    # a value end followed by an escaped newline and more text was part of the value: no escaping
    inner = '<tool_call>write_file\n<arg_key>content</arg_key>\n<arg_value>a</arg_value>\\nb\\nc</arg_value>\n</tool_call>'
    assert every_split(GLM46, inner) == call("write_file", {"content": "a</arg_value>\\nb\\nc"})


def test_glm_escaped_separator_cut_short_at_the_end_keeps_the_block_text():
    text = "<tool_call>get_weather\\n<arg_key>city</arg_key>\\"
    assert run(GLM46, text) == [Text(text)]
    assert run(GLM46, text, list(text)) == [Text(text)]
