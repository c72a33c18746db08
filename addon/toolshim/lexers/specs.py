"""The dialects the engine reads, each one spec (engine.py says what the fields mean)."""

from __future__ import annotations

from .engine import JsonCalls, KeyValues, LlamaCalls, NamedCalls, Spec, XmlParams

# Hermes, Qwen2.5, Qwen3, QwQ:  <tool_call>{"name": "get_weather", "arguments": {"city": "NYC"}}</tool_call>
# ("parameters" for "arguments", a list of call objects, arguments as JSON text: see judge.py)
HERMES = Spec("hermes", JsonCalls(open="<tool_call>", close="</tool_call>"))

# Qwen3-Coder, Qwen3.5:  <tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>
# (also bare, without the wrapper). A function name has no whitespace, quotes or braces (vLLM:
# an unrendered Jinja `<function={{ name }}>` is not a call); a parameter name ends at `>`.
_QWEN_CODER = XmlParams(
    wrap=("<tool_call>", "</tool_call>"),
    function=("<function=", "</function>"),
    parameter=("<parameter=", "</parameter>"),
    bare=True,
    function_name_stop=r"""[<>\s{}"']""",
)
QWEN_XML = Spec("qwen_xml", _QWEN_CODER)

# ByteDance Seed-OSS: Qwen3-Coder's elements in its own wrapper, never bare (reasoning: `<seed:think>`).
SEED_OSS = Spec("seed_oss", _QWEN_CODER._replace(wrap=("<seed:tool_call>", "</seed:tool_call>"), bare=False))

# MiniMax-M2:  <minimax:tool_call><invoke name="NAME"><parameter name="KEY">VALUE</parameter></invoke></minimax:tool_call>
MINIMAX = Spec(
    "minimax",
    XmlParams(
        wrap=("<minimax:tool_call>", "</minimax:tool_call>"),
        function=("<invoke name=", "</invoke>"),
        parameter=("<parameter name=", "</parameter>"),
        quoted_names=True,
    ),
)

# GLM-4.5 to 4.7:  <tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value></tool_call>
# (4.5/4.6 put newlines between the parts; `<tool_call>NAME</tool_call>` is a call with `{}`).
# GLM-4.6 also writes a block as if escaped for a JSON string: a literal backslash-n for each
# newline and `\"` for each quote (vLLM and SGLang accept `\n` where a newline goes).
GLM = Spec(
    "glm",
    KeyValues(open="<tool_call>", close="</tool_call>", key=("<arg_key>", "</arg_key>"), value=("<arg_value>", "</arg_value>"), escaped="\\n"),
)

# IBM Granite 3.x:  <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Oslo"}}, …]
# (its chat template; vLLM's `granite` parser; llama.cpp's Granite grammar). No closer: the list
# ends the call, the turn ends after it.
GRANITE = Spec("granite", JsonCalls(open="<|tool_call|>", close=""))

# NVIDIA Nemotron (Llama-3.1/3.3-Nemotron Nano/Super/Ultra, Nemotron-Nano-9B/12B-v2):
#   <TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Oslo"}}, …]</TOOLCALL>
# (the Nano-v2 chat template; vLLM's `llama_nemotron_json`; llama.cpp's Nemotron v2 grammar).
NEMOTRON = Spec("nemotron", JsonCalls(open="<TOOLCALL>", close="</TOOLCALL>"))

# Cohere Command R7B / Command A:
#   <|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Oslo"}}]<|END_ACTION|>
# (the tool-use chat template; vLLM's `command` parser; llama.cpp's Command R7B grammar). The
# model's `tool_call_id` is a counter of the turn ("0", "1"): ids are minted. Its plan, in
# <|START_THINKING|>…<|END_THINKING|>, is reasoning (the registry's `reasoning_tags`).
COMMAND = Spec("command", JsonCalls(open="<|START_ACTION|>", close="<|END_ACTION|>", name_key="tool_name"))

# Mistral, after the `[TOOL_CALLS]` control token; the format depends on the tokenizer version:
#   v3 / v7   [TOOL_CALLS][{"name": "add", "arguments": {"a": 1}, "id": "abcDEF123"}]
#   v11       [TOOL_CALLS]add[CALL_ID]abcDEF123[ARGS]{"a": 1}[TOOL_CALLS]mul[CALL_ID]…
#   v13+      [TOOL_CALLS]add[ARGS]{"a": 1}mul[ARGS]{"b": 2}
# also `NAME{json}` (vLLM strips every control token but `[TOOL_CALLS]`) and a `▁` after the token.
# `[THINK]…[/THINK]` (v13+ reasoning) is the think splitter's.
MISTRAL = Spec("mistral", NamedCalls(open="[TOOL_CALLS]", args="[ARGS]", call_id="[CALL_ID]"))

# Llama:  3.1  <function=get_weather>{"city": "Oslo"}</function>   (also `<function name="…">`)
#         4    <|python_start|>[get_weather(city='Oslo', days=[1, 2])]<|python_end|>
#         3.x  <|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; {…}<|eom_id|>
# also `<function=NAME></function>` (`{}`), a missing `</function>` before the next tag or the end,
# a pythonic list without `<|python_end|>`, "arguments" for "parameters". Known limit: 3.x JSON
# without the tag is read only at the very start of a Llama model's text (prose holds JSON).
LLAMA = Spec(
    "llama",
    LlamaCalls(
        function=("<function=", '<function name="'),
        function_end="</function>",
        python=("<|python_start|>", "<|python_end|>"),
        tagged="<|python_tag|>",
        tagged_ends=("<|eom_id|>", "<|eot_id|>"),
        separator=";",
    ),
)
