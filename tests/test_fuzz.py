"""Fuzzing of the core with the design invariants as oracles (DESIGN.md, "Invariants").

Targets: the SSE framer, every dialect lexer (one dialect forced at a time, and all together),
and both stream rewriters. Inputs are random, built from each format's own vocabulary (markers,
fragments of markers, look-alikes, prose, JSON, unicode), fed in random pieces.

Budget: each target has a small number of examples under the default profile ("repeatable":
derandomized, so CI is repeatable); `HYPOTHESIS_PROFILE=fuzz` (tests/conftest.py) multiplies
every budget by `FUZZ_SCALE` and draws fresh examples.
"""

from __future__ import annotations

import copy
import json
import re

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from toolshim.calls import CallScope, RewriteStats
from toolshim.lexers import DIALECT_NAMES, ScopeLexers, dialects_for
from toolshim.lexers.base import CallArgs, CallBegin, CallEnd, ReasoningEnd, ReasoningText, Text
from toolshim.sse import SseFramer, parse_block
from toolshim.tools import RequestContext, ToolSpec

# The loaded profile's default budget is 100 examples; the "fuzz" profile raises it.
FUZZ_SCALE = max(1, settings().max_examples // 100)


def budget(examples: int):
    return settings(
        max_examples=examples * FUZZ_SCALE,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


def split_at(data, cuts):
    """`data` (str or bytes) cut at the given offsets (any order, out of range ignored)."""
    points = sorted({c for c in cuts if 0 < c < len(data)})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]


def by_event(body: bytes) -> list[bytes]:
    """The body cut after every blank line: one event a read, as streaming servers write them
    (the framer and the rewriters take such reads by a shorter path)."""
    return split_at(body, [m.end() for m in re.finditer(rb"\n\n", body)])


# ---------------------------------------------------------------------------------------------
# The SSE framer
# ---------------------------------------------------------------------------------------------

_LINE_END = re.compile(rb"\r\n|\r|\n")


def reference_blocks(data: bytes) -> tuple[list[bytes], bytes]:
    """The blocks of a whole body (a block ends at an empty line), and the unterminated tail."""
    blocks, start, line_start = [], 0, 0
    for m in _LINE_END.finditer(data):
        if m.start() == line_start:
            blocks.append(data[start : m.end()])
            start = m.end()
        line_start = m.end()
    return blocks, data[start:]


def reference_fields(raw: bytes) -> tuple[str | None, str | None]:
    """(data, event) of a block, per the SSE spec's field rules."""
    text = raw.decode("utf-8")
    data, event = [], None
    for line in re.split(r"\r\n|\r|\n", text):
        if not line or line[0] == ":":
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
    return ("\n".join(data) if data else None), event


def frame(pieces: list[bytes]) -> tuple[list[bytes], bytes]:
    framer = SseFramer()
    blocks = []
    for piece in pieces:
        blocks += framer.feed(piece)
        assert framer.pending <= sum(map(len, pieces))
    blocks += framer.close()
    return blocks, framer.take_pending()


sse_lines = st.lists(
    st.sampled_from(["data: ", "data:", "data", "event: ", "event:x", "id: 7", "retry: 10", ": comment", ":", " data: x", "dat", "é", "\u2028", "{\"a\":1}", "[DONE]"])
    | st.text(alphabet="ab :\n\r{}\"é", max_size=8),
    max_size=12,
).map("".join)
sse_texts = st.lists(st.tuples(sse_lines, st.sampled_from(["\n", "\r\n", "\r", "\n\n", "\r\n\r\n", "\r\r", "\n\r\n", ""])), max_size=10).map(
    lambda pairs: "".join(a + b for a, b in pairs)
)


@budget(200)
@given(st.one_of(st.binary(max_size=200), sse_texts.map(lambda s: s.encode("utf-8"))), st.lists(st.integers(0, 400), max_size=30))
def test_fuzz_sse_framer(data, cuts):
    """Blocks and tail joined give back the input; the same blocks for any split; each block is
    exactly the spec's (ends at its first empty line), and its fields parse as the spec says."""
    whole = frame([data])
    assert whole == reference_blocks(data)
    blocks, tail = whole
    assert b"".join(blocks) + tail == data  # nothing lost, nothing added
    assert frame(split_at(data, cuts)) == whole  # chunking invariance
    assert frame([data[i : i + 1] for i in range(len(data))]) == whole
    assert frame(by_event(data)) == whole
    for raw in blocks:
        check_fields(raw)


def check_fields(raw: bytes) -> None:
    """The block's fields parse as the spec says (`reference_fields`), or it is not UTF-8."""
    event = parse_block(raw)
    assert event.raw == raw
    try:
        expected = reference_fields(raw)
    except UnicodeDecodeError:
        assert event.malformed and event.data is None
    else:
        assert not event.malformed and (event.data, event.event) == expected


field_values = st.one_of(st.text(alphabet="ab :{}\"é\u2028", max_size=6).map(str.encode), st.binary(max_size=4).filter(lambda b: b"\n" not in b and b"\r" not in b))


@budget(100)
@given(field_values, field_values, st.sampled_from([b"event:", b"event: "]), st.sampled_from([b"data:", b"data: "]))
def test_fuzz_named_events_read_alone(name, value, event_field, data_field):
    """`event:…` then one `data:…` line: the shape the Responses and Messages APIs stream, which
    the framer and the parser take without a search of its lines (`sse.named_data_at`)."""
    raw = event_field + name + b"\n" + data_field + value + b"\n\n"
    assert SseFramer().feed(raw) == [raw]
    check_fields(raw)


# ---------------------------------------------------------------------------------------------
# The dialect lexers
# ---------------------------------------------------------------------------------------------

STRINGS = {"type": "object", "properties": {"command": {"type": "string"}, "path": {"type": "string"}}}
TOOLS = {
    "bash": ToolSpec("bash", STRINGS),
    "get_weather": ToolSpec(
        "get_weather", {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
    ),
    "search": ToolSpec(
        "search",
        {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"], "additionalProperties": False},
        strict=True,
    ),
}
KEYS = ["command", "path", "city", "days", "q", "x"]

# Witnesses: characters no vocabulary uses, each placed once in the input (in prose and in
# argument values). They make "nothing lost" checkable whatever the markup around them did: each
# must come out exactly once, in the visible text (in input order) or in a call.
WITNESS_BASE = 0x3400  # CJK Extension A


def is_witness(c: str) -> bool:
    return WITNESS_BASE <= ord(c) < WITNESS_BASE + 4096


class Witnesses:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> str:
        self.n += 1
        return chr(WITNESS_BASE + self.n - 1)


BAR, SP = "\uff5c", "\u2581"


def ds(name: str) -> str:
    return f"<{BAR}{name.replace(' ', SP)}{BAR}>"


DSML = f"{BAR}DSML{BAR}"
# Every dialect's markers, as the lexers spell them, and a few look-alikes of each.
MARKERS = {
    "kimi": [
        "<|tool_calls_section_begin|>", "<|tool_call_section_begin|>", "<|tool_calls_section_end|>",
        "<|tool_call_section_end|>", "<|tool_calls_section_end|", "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>", "<|tool_arguments_begin|>", "<|tool_call_end|>", "</think>",
        "functions.bash:3", "functions.get_weather:0", "functions.search:1", "functions.rm_rf:2", "bash:1",
        "functionsbash5", "7", "functions.", "<|tool_call|>", "<|tool_calls_begin|>",
    ],
    "deepseek": [
        ds("tool calls begin"), ds("tool calls end"), ds("tool call begin"), ds("tool sep"), ds("tool call end"),
        f"<{DSML}function_calls>", f"<{DSML}tool_calls>", f"</{DSML}function_calls>", f"</{DSML}tool_calls>",
        f"<{DSML}invoke", ' name="bash">', ' name="get_weather">', ' name="rm_rf">', ">", f"</{DSML}invoke>",
        f'<{DSML}parameter name="command" string="true">', f'<{DSML}parameter name="days" string="false">',
        f'<{DSML}parameter name="city">', f"</{DSML}parameter>", "function", "bash", "get_weather", "search",
        "\n```json\n", "\n```", "```", "</think>", "<|tool▁calls▁begin|>", "<｜tool_calls_begin｜>", "<｜DSML|invoke",
    ],
    "harmony": [
        "<|start|>", "assistant", "<|channel|>", "analysis", "commentary", "final", " to=functions.bash",
        " to=functions.get_weather", " to=functions.search", " to=functions.rm_rf", " to=browser.search",
        "<|constrain|>", "json", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "commentary to=functions.bash json",
        "<|channel>", "<channel|>",
    ],
    "mistral": [
        "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "abcDEF123", "bash", "get_weather", "search", "rm_rf", SP,
        "[THINK]", "[/THINK]", "[TOOL_CALL]", "[TOOL_CALLS", "[args]", "[{", "}]",
    ],
    "hermes": ["<tool_call>", "</tool_call>", "<tool_calls>", "<tool-call>", "<toolcall>", "</tool_calls>", "<tool_call >"],
    "qwen_xml": [
        "<tool_call>", "</tool_call>", "<function=bash>", "<function=get_weather>", "<function=rm_rf>",
        "</function>", "<parameter=command>", "<parameter=days>", "<parameter=x>", "</parameter>",
        "<function = bash>", "<parameter>",
    ],
    "seed_oss": [
        "<seed:tool_call>", "</seed:tool_call>", "<function=bash>", "<function=get_weather>", "<function=rm_rf>",
        "</function>", "<parameter=command>", "<parameter=days>", "</parameter>", "<seed:toolcall>", "<tool_call>",
    ],
    "glm": [
        "<tool_call>", "</tool_call>", "bash", "get_weather", "search", "rm_rf", "<arg_key>", "</arg_key>",
        "<arg_value>", "</arg_value>", "<arg_keys>", "<argkey>",
    ],
    "minimax": [
        "<minimax:tool_call>", "</minimax:tool_call>", '<invoke name="bash">', '<invoke name="get_weather">',
        '<invoke name="rm_rf">', "</invoke>", '<parameter name="command">', '<parameter name="days">',
        "</parameter>", "<minimax:toolcall>", "<invoke>",
    ],
    "llama": [
        "<function=bash>", "<function=get_weather>", "<function=rm_rf>", '<function name="bash">', "</function>",
        "<|python_start|>", "<|python_end|>", "<|python_tag|>", "<|eom_id|>", "<|eot_id|>", "; ",
        "[bash(command='ls')]", "[get_weather(city='Oslo', days=3)]", "[rm_rf()]", "bash(", ")", "<function>",
    ],
    "granite": ["<|tool_call|>", "<|tool_call |>", "<|tool_calls|>", "<tool_call>", "<|end_of_text|>", "[", "]", '{"name": "bash"'],
    "nemotron": ["<TOOLCALL>", "</TOOLCALL>", "</TOOLCALL", "<TOOL_CALL>", "<toolcall>", "[", "]", '{"name": "bash"'],
    "command": [
        "<|START_ACTION|>", "<|END_ACTION|>", "<|START_THINKING|>", "<|END_THINKING|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>",
        "<|START_ACTION |>", "<|start_action|>", '"tool_name": "bash"', '"tool_call_id": "0"', "[", "]",
    ],
    # the reasoning split runs in every content channel
    "think": ["<think>", "</think>", "<reasoning>", "</reasoning>", "<thought>", "</thought>", "<seed:think>", "</seed:think>", "[THINK]", "[/THINK]", "<thinking>"],
}
COMMON = [" ", "\n", "\n\n", "\t", " \n ", "<", ">", "|", "<|", "|>", "</", "<b>", "[", "]", "{", "}", '"', "\\", ":", ",", "{}", "[]", "é", "日本", "\u2028", "🙂", "```"]


@st.composite
def string_value(draw, witness, dialect):
    """An argument value: a witness, and characters that are hard for the dialect."""
    tricky = st.sampled_from(["a", "b c", " ", "\n", '"', "\\", "<", ">", "/", "{", "}", "[", "]", "é", "'"])
    parts = draw(st.lists(st.one_of(tricky, tricky, tricky, st.sampled_from(MARKERS[dialect])), max_size=4))
    parts.insert(draw(st.integers(0, len(parts))), witness())
    return "".join(parts)


@st.composite
def arguments(draw, witness, dialect):
    keys = draw(st.lists(st.sampled_from(KEYS), max_size=3, unique=True))
    args = {}
    for key in keys:
        args[key] = draw(st.integers(-3, 99)) if key == "days" and draw(st.booleans()) else draw(string_value(witness, dialect))
    return args


def py_literal(value) -> str:
    return repr(value)


# What the engine reads since it replaced the lexers of lexers/legacy (issue 20): the new
# families, and shapes the older dialects now read otherwise (an orphan wrapper end after a bare
# Qwen function, text between the calls of a section, GLM blocks with escaped separators, a
# `functions.` recipient on Harmony's analysis channel).
# This file's tests and the corpus of tests/test_dialect_corpus.py draw them (`new=True`).
NEW_FAMILIES = ("granite", "nemotron", "command")
NEW_MODELS = ("granite-3.3-8b-instruct", "granite-4.0-h-small", "NVIDIA-Nemotron-Nano-9B-v2", "Llama-3_3-Nemotron-Super-49B-v1_5", "command-a-03-2025")


def call_list(calls, key="name", arguments="arguments", indent=None, extra=None) -> str:
    """A JSON list of call objects, as the JSON-list families write it."""
    return json.dumps([{**(extra or {}), key: name, arguments: args} for name, args in calls], ensure_ascii=False, indent=indent)


@st.composite
def dialect_call(draw, dialect, witness, new=False):
    """One well-formed call (or block of calls) in the dialect's own markup (`new`: also the
    shapes of NEW_FAMILIES' comment)."""
    name = draw(st.sampled_from(["bash", "bash", "get_weather", "get_weather", "search", "rm_rf"]))  # rm_rf: undeclared
    args = draw(arguments(witness, dialect))
    js = json.dumps(args, ensure_ascii=False, indent=draw(st.sampled_from([None, 2])))
    pad = draw(st.sampled_from(["", " ", "\n"]))
    if dialect in ("granite", "nemotron", "command"):
        calls = [(name, args)]
        if draw(st.booleans()):
            calls.append((draw(st.sampled_from(["bash", "get_weather", "rm_rf"])), draw(arguments(witness, dialect))))
        indent = draw(st.sampled_from([None, 4]))
        if dialect == "granite":
            return f"<|tool_call|>{pad}" + call_list(calls, indent=indent)
        if dialect == "nemotron":
            return f"<TOOLCALL>{pad}" + call_list(calls, indent=indent) + f"{pad}</TOOLCALL>"
        plan = f"<|START_THINKING|>{draw(string_value(witness, dialect))}<|END_THINKING|>" if draw(st.booleans()) else ""
        return plan + "<|START_ACTION|>" + call_list(calls, "tool_name", "parameters", indent, {"tool_call_id": "0"}) + "<|END_ACTION|>"
    if new and dialect == "qwen_xml" and draw(st.booleans()):
        params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
        function = f"<function={name}>\n{params}</function>"
        if draw(st.booleans()):  # a bare function and the wrapper end it lacks the opener of
            return function + f"{pad}</tool_call>"
        between = draw(string_value(witness, dialect))  # text between the calls of the wrapper
        return f"<tool_call>\n{function}\n{between}\n<function=get_weather>\n</function>\n</tool_call>"
    if new and dialect in ("minimax", "seed_oss") and draw(st.booleans()):
        if dialect == "minimax":
            params = "".join(f'<parameter name="{k}">{v}</parameter>' for k, v in args.items())
            first, wrap = f'<invoke name="{name}">{params}</invoke>', ("<minimax:tool_call>", "</minimax:tool_call>")
            second = '<invoke name="get_weather"></invoke>'
        else:
            params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
            first, wrap = f"<function={name}>\n{params}</function>", ("<seed:tool_call>", "</seed:tool_call>")
            second = "<function=get_weather>\n</function>"
        between = draw(string_value(witness, dialect))
        after = draw(st.sampled_from(["", second]))
        return f"{wrap[0]}{pad}{first}{pad}{between}{pad}{after}{pad}{wrap[1]}"
    if new and dialect == "glm" and draw(st.booleans()):  # escaped as for a JSON string (GLM-4.6)
        esc = lambda v: json.dumps(v if isinstance(v, str) else json.dumps(v), ensure_ascii=False)[1:-1]  # noqa: E731
        params = "".join(f"<arg_key>{k}</arg_key>\\n<arg_value>{esc(v)}</arg_value>\\n" for k, v in args.items())
        return f"<tool_call>{name}\\n{params}</tool_call>"
    if dialect == "kimi":
        header = draw(st.sampled_from([f"functions.{name}:{draw(st.integers(0, 9))}", f"{name}:1", f"functions{name}3"]))
        call = f"<|tool_call_begin|>{pad}{header}{pad}<|tool_call_argument_begin|>{pad}{js}{pad}" + draw(st.sampled_from(["<|tool_call_end|>", ""]))
        if draw(st.booleans()):
            return f"<|tool_calls_section_begin|>{pad}{call}{pad}<|tool_calls_section_end|>"
        return call
    if dialect == "deepseek":
        form = draw(st.sampled_from(["v3", "v31", "dsml"]))
        if form == "v3":
            call = f"{ds('tool call begin')}function{ds('tool sep')}{name}\n```json\n{js}\n```{ds('tool call end')}"
        elif form == "v31":
            call = f"{ds('tool call begin')}{name}{ds('tool sep')}{js}{ds('tool call end')}"
        else:
            params = "".join(
                f'<{DSML}parameter name="{k}" string="{"false" if isinstance(v, int) else "true"}">{v}</{DSML}parameter>{pad}'
                for k, v in args.items()
            )
            tag = draw(st.sampled_from(["function_calls", "tool_calls"]))
            return f'<{DSML}{tag}>{pad}<{DSML}invoke name="{name}">{pad}{params}</{DSML}invoke>{pad}</{DSML}{tag}>'
        return f"{ds('tool calls begin')}{pad}{call}{pad}{ds('tool calls end')}" if draw(st.booleans()) else call
    if dialect == "harmony":
        kind = draw(st.sampled_from(["call", "analysis", "final", "commentary"]))
        start = draw(st.sampled_from(["", "<|start|>assistant"]))
        end = draw(st.sampled_from(["<|end|>", "<|call|>", "<|return|>", ""]))
        if kind == "call":
            constrain = draw(st.sampled_from([" <|constrain|>json", "", " json"]))
            # a `functions.` recipient on the analysis channel is a call too (issue 20 item 4)
            channel = draw(st.sampled_from(["commentary", "analysis"])) if new else "commentary"
            return f"{start}<|channel|>{channel} to=functions.{name}{constrain}<|message|>{js}{end}"
        return f"{start}<|channel|>{kind}<|message|>{draw(string_value(witness, dialect))}{end}"
    if dialect == "mistral":
        form = draw(st.sampled_from(["list", "v11", "v13", "bare"]))
        if form == "list":
            return "[TOOL_CALLS]" + json.dumps([{"name": name, "arguments": args}], ensure_ascii=False)
        if form == "v11":
            return f"[TOOL_CALLS]{name}[CALL_ID]abcDEF123[ARGS]{js}"
        if form == "v13":
            return f"[TOOL_CALLS]{name}[ARGS]{js}"
        return f"[TOOL_CALLS]{name}{js}"
    if dialect == "hermes":
        key = draw(st.sampled_from(["arguments", "parameters"]))
        value = json.dumps(args) if draw(st.booleans()) else args
        return f"<tool_call>{pad}{json.dumps({'name': name, key: value}, ensure_ascii=False)}{pad}</tool_call>"
    if dialect == "qwen_xml":
        params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
        function = f"<function={name}>\n{params}</function>"
        return f"<tool_call>\n{function}\n</tool_call>" if draw(st.booleans()) else function
    if dialect == "seed_oss":
        params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
        return f"<seed:tool_call>{pad}\n<function={name}>\n{params}</function>\n</seed:tool_call>"
    if dialect == "glm":
        params = "".join(f"<arg_key>{k}</arg_key>{pad}<arg_value>{v}</arg_value>{pad}" for k, v in args.items())
        return f"<tool_call>{name}{pad}{params}</tool_call>"
    if dialect == "minimax":
        params = "".join(f'<parameter name="{k}">{v}</parameter>' for k, v in args.items())
        return f'<minimax:tool_call>{pad}<invoke name="{name}">{params}</invoke>{pad}</minimax:tool_call>'
    if dialect == "llama":
        form = draw(st.sampled_from(["tag", "named", "pythonic", "python_tag"]))
        if form == "tag":
            return f"<function={name}>{js}</function>"
        if form == "named":
            return f'<function name="{name}">{js}</function>'
        if form == "pythonic":
            kwargs = ", ".join(f"{k}={py_literal(v)}" for k, v in args.items())
            return f"<|python_start|>[{name}({kwargs})]<|python_end|>"
        first = "<|python_tag|>" + json.dumps({"name": name, "parameters": args}, ensure_ascii=False)
        if new and draw(st.booleans()):  # calls after `;`, a newline, any whitespace or nothing (issue 20 item 7)
            second = json.dumps({"name": draw(st.sampled_from(["bash", "get_weather", "rm_rf"])), "parameters": draw(arguments(witness, dialect))}, ensure_ascii=False)
            return first + draw(st.sampled_from(["; ", ";", "\n", " ", "", "\n\n", " ;\n"])) + second
        return first
    assert dialect == "think"
    return f"<think>{draw(string_value(witness, dialect))}</think>"


@st.composite
def dialect_text(draw, dialects, witness=None, new=False):
    """A model text made of the dialects' markup, calls, fragments of markers, prose and JSON."""
    witness = witness or Witnesses()
    atoms = []
    for _ in range(draw(st.integers(1, 10))):
        dialect = draw(st.sampled_from(dialects))
        kind = draw(st.sampled_from(["prose", "prose", "common", "marker", "fragment", "call", "call", "call"]))
        if kind == "prose":
            words = draw(st.lists(st.sampled_from(["Let me", "check", " ", "x < y", "a|b", "é", "\n"]), max_size=3))
            words.insert(draw(st.integers(0, len(words))), witness())
            atoms.append("".join(words))
        elif kind == "common":
            atoms.append(draw(st.sampled_from(COMMON)))
        elif kind == "marker":
            atoms.append(draw(st.sampled_from(MARKERS[dialect])))
        elif kind == "fragment":
            marker = draw(st.sampled_from(MARKERS[dialect]))
            cut = draw(st.integers(1, max(1, len(marker) - 1)))
            atoms.append(marker[:cut] if draw(st.booleans()) else marker[cut:])
        else:
            atoms.append(draw(dialect_call(dialect, witness, new)))
    return "".join(atoms)


MODELS = [
    "kimi-k2.5", "deepseek-v3.1", "deepseek-r1", "gpt-oss-120b", "mistral-small-3.2", "devstral", "qwen3-coder-30b",
    "Qwen3-30B-A3B-Thinking", "QwQ-32B", "glm-4.6", "MiniMax-M2", "Llama-3.3-70B-Instruct", "llama-4-scout",
    "seed-oss-36b", "some-unknown-model", *NEW_MODELS,
]
MINTED_ID = re.compile(r"call_[A-Za-z0-9]{24}")
PLAIN = "plain text, no markup. "  # what an idle lexer must pass at once


@st.composite
def lexer_case(draw, forced, new=False):
    """A text of the forced dialects' vocabulary (`new`: NEW_FAMILIES and their shapes too)."""
    names = [n for n in DIALECT_NAMES if new or n not in NEW_FAMILIES]
    if forced == "all":
        dialects, vocabulary = tuple(DIALECT_NAMES), [*names, "think"]
    elif forced == "by model":
        dialects, vocabulary = None, [*names, "think"]
    else:
        dialects, vocabulary = (forced,), [forced, forced, forced, "think"]
    model = draw(st.sampled_from([m for m in MODELS if new or m not in NEW_MODELS]))
    context = RequestContext(
        tools=dict(TOOLS),
        model=model,
        dialects=dialects,
        reasoning_preopened=draw(st.sampled_from([None, None, True, False])),
        # Not with two call dialects in one chain: which call is "the first" then depends on the
        # split (test_known_limit_parallel_false_across_two_dialects_depends_on_the_split, below).
        parallel_tool_calls=len(dialects_for(model, dialects)) > 1 or draw(st.integers(0, 4)) > 0,
        tool_choice_none=draw(st.integers(0, 15)) == 0,
    )
    text = draw(dialect_text(vocabulary, new=new))
    cuts = draw(st.lists(st.integers(0, max(0, len(text))), max_size=25))
    return {
        "forced": forced,
        "context": context,
        "reasoning": draw(st.integers(0, 3)) == 0,
        "max_held": draw(st.sampled_from([1 << 20, 1 << 20, 1 << 20, draw(st.integers(8, 300))])),
        "text": text,
        "pieces": split_at(text, cuts),
    }


def run_lexer(case, pieces, idle_checks: int = 0):
    """Feed the pieces; check the segment grammar (never retract: a call once begun is ended by
    finish(), nothing is sent inside a call but its arguments, names are declared tools, the
    request's policy holds) and, at up to `idle_checks` points
    where the lexer says it is idle, that plain text passes at once (the rewriters' fast paths
    rely on it)."""
    scope = CallScope(copy.deepcopy(case["context"]), RewriteStats())
    lexer = ScopeLexers(scope, max_held=case["max_held"]).new_lexer(reasoning=case["reasoning"])
    segments = []
    for piece in pieces:
        segments += lexer.feed(piece)
        if idle_checks and lexer.idle:
            idle_checks -= 1
            probe = copy.deepcopy(lexer)
            assert probe.feed(PLAIN) == [Text(PLAIN)], "an idle lexer held or changed plain text"
            assert probe.idle
    segments += lexer.finish()
    assert lexer.finish() == []  # finish() released everything
    open_call = False
    calls = 0
    for seg in segments:
        if type(seg) is CallBegin:
            assert not open_call, "a call began inside a call"
            assert seg.name in TOOLS and seg.id, seg
            open_call = True
            calls += 1
        elif type(seg) is CallArgs:
            assert open_call, "arguments outside a call"
        elif type(seg) is CallEnd:
            assert open_call, "a call ended twice"
            open_call = False
        else:
            assert not open_call, f"{seg} inside a call"
            if type(seg) is not ReasoningEnd:
                assert seg.text, "an empty text segment"
    assert not open_call, "a call left open by finish()"
    context = case["context"]
    if context.tool_choice_none:
        assert calls == 0
    if not context.parallel_tool_calls:
        assert calls <= 1
    return segments


def normalised(segments):
    """Adjacent texts and arguments joined, minted ids blanked (they are random)."""
    out = []
    for seg in segments:
        if type(seg) is CallBegin:
            seg = CallBegin(MINTED_ID.sub("call_*", seg.id), seg.name)
        if out and type(seg) in (Text, ReasoningText, CallArgs) and type(out[-1]) is type(seg):
            out[-1] = type(seg)(out[-1].text + seg.text)
        else:
            out.append(seg)
    return out


def markup_follows(text: str, cut: int) -> bool:
    """Is the cut inside or at the end of whitespace that markup follows (`<` or `[` next)?"""
    if cut <= 0 or not text[cut - 1].isspace():
        return False
    rest = text[cut:].lstrip()
    return rest[:1] in ("<", "[")


def keeping_padding(text: str, pieces: list[str]) -> list[str]:
    """The same pieces, except that whitespace right before markup stays with the markup.

    The one documented difference between splits (README, "Known limits"): whitespace that
    arrived in an earlier piece than the markup after it was already sent, and stays; in one
    piece with the markup it is the markup's padding, and dropped. So the exact comparison uses
    splits that never cut there; every other split is compared with whitespace left out."""
    cuts, at = [], 0
    for piece in pieces[:-1]:
        at += len(piece)
        if not markup_follows(text, at):
            cuts.append(at)
    return split_at(text, cuts)


def without_whitespace(segments):
    out = []
    for seg in normalised(segments):
        if type(seg) in (Text, ReasoningText):
            seg = type(seg)(re.sub(r"\s+", "", seg.text))
            if not seg.text:
                continue
        out.append(seg)
    return normalised(out)


def visible(segments) -> str:
    return "".join(seg.text for seg in segments if type(seg) in (Text, ReasoningText))


def call_text(call_id: str, name: str, arguments: str) -> str:
    """A call's id, name and arguments, also JSON-decoded (so an escaped witness counts)."""
    try:
        decoded = json.dumps(json.loads(arguments), ensure_ascii=False)
    except ValueError:
        decoded = ""
    return "\x00".join((call_id, name, arguments, decoded))


def call_texts(segments) -> list[str]:
    calls = []
    for seg in segments:
        if type(seg) is CallBegin:
            calls.append([seg.id, seg.name, ""])
        elif type(seg) is CallArgs:
            calls[-1][2] += seg.text
    return [call_text(*call) for call in calls]


# A parameter's name, in each dialect that names parameters with tags, or a JSON key, or a
# Python keyword argument.
PARAMETER_NAME = re.compile(
    r'<parameter=([^>\n]*)>|<parameter name="([^"]*)">|<arg_key>([^<]*)</arg_key>|<\uff5cDSML\uff5cparameter name="([^"]*)"'
    r'|"(\w+)"\s*:|\b(\w+)='
)
OBJECT_END = re.compile(r"[{}()\[\]]|<\|tool_call_end\|>")  # a JSON key's or keyword's object ends


def overwritten(text: str, shown: str) -> set[int]:
    """Positions from a parameter's name to the same name again in the same call: a parameter
    written twice takes its last value (as vLLM, and JSON objects, do), the first one goes. "The
    same call": nothing between the two was shown as text (a closing tag may be part of a value,
    so tags cannot tell), and for JSON keys and keywords, no bracket between them."""
    spans, last = set(), {}
    for m in PARAMETER_NAME.finditer(text):
        kind, name = next((i, g) for i, g in enumerate(m.groups()) if g is not None)
        before = last.get((kind, name))
        if before is not None and not (kind >= 4 and OBJECT_END.search(text, before, m.start())):
            between = range(before, m.start())
            if not any(is_witness(text[i]) and text[i] in shown for i in between):
                spans.update(between)
        last[kind, name] = m.start()
    return spans


def check_witnesses(texts: tuple[str, ...], shown: str, calls: list[str], harmony: bool) -> None:
    """Nothing lost: each witness of the input `texts` is in the visible text `shown` or in one
    call, exactly once. Only markup may take one with it: a Harmony header (`harmony`: the
    dialect ran) or the first value of a parameter written twice in one call."""
    for text in texts:
        markup = overwritten(text, shown) | (in_harmony_header(text) if harmony else set())
        for at, w in enumerate(text):
            if is_witness(w):
                found = shown.count(w) + sum(1 for call in calls if w in call)
                assert found == 1 or (found == 0 and at in markup), (w, shown, calls)


HARMONY_TOKEN = re.compile(r"<\|(start|channel|constrain|message|end|call|return)\|>")


def in_harmony_header(text: str) -> set[int]:
    """Positions inside a Harmony message header (`<|start|>…<|message|>`): role, channel and
    recipient are markup, dropped once the message is read."""
    inside, opened = set(), None
    for token in HARMONY_TOKEN.finditer(text):
        if token.group(1) in ("start", "channel", "constrain"):
            opened = token.end() if opened is None else opened
        elif token.group(1) == "message" and opened is not None:
            inside.update(range(opened, token.start()))
            opened = None
        else:
            opened = None
    return inside


def is_subsequence(small: str, big: str) -> bool:
    it = iter(big)
    return all(c in it for c in small)


@pytest.mark.parametrize("forced", [*DIALECT_NAMES, "all", "by model"])
@budget(60)
@given(data=st.data())
def test_fuzz_lexers(forced, data):
    """One dialect forced at a time, all of them, or those the model name picks: random texts of
    the dialects' markup in random pieces. Oracles: no exception; the segment grammar holds as
    segments come (never retract); the same segments for any split; the visible text is a
    subsequence of the input; every witness comes out exactly once (nothing lost)."""
    case = data.draw(lexer_case(forced, new=True))
    text, pieces = case["text"], case["pieces"]
    whole = run_lexer(case, [text])
    # chunking invariance: exact when whitespace before markup comes with the markup, modulo
    # whitespace for any split
    split = run_lexer(case, keeping_padding(text, pieces), idle_checks=3)
    assert normalised(split) == normalised(whole)
    if len(text) <= 150:
        by_char = run_lexer(case, keeping_padding(text, list(text)))
        assert normalised(by_char) == normalised(whole)
    any_split = run_lexer(case, pieces)
    assert without_whitespace(any_split) == without_whitespace(whole)
    event(f"calls made: {sum(type(seg) is CallBegin for seg in whole) > 0}")
    harmony = "harmony" in [d.name for d in dialects_for(case["context"].model, case["context"].dialects)]
    for segments in (whole, split, any_split):
        shown = visible(segments)
        # nothing invented, nothing reordered: the visible text is the input with markup taken out
        assert is_subsequence(shown, text), (shown, text)
        # nothing lost: every witness comes out exactly once, as text or inside a call
        check_witnesses((text,), shown, call_texts(segments), harmony)


def test_known_limit_parallel_false_across_two_dialects_depends_on_the_split():
    """Found by fuzzing, documented in the README (Known limits), asserted as it is so that a
    change is noticed. Qwen models run Hermes then Qwen XML on one channel. With
    `parallel_tool_calls: false` the first call in the text should be made and the second stay
    text: so it is when the blocks arrive apart. In one piece the Hermes stage admits its JSON
    block before the XML stage has judged the earlier XML block, which then stays text. One call
    is made either way and nothing is lost; which one depends on the split."""
    xml = "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>"
    hermes = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    case = {
        "context": RequestContext(tools=dict(TOOLS), model="qwen3-coder", parallel_tool_calls=False),
        "reasoning": False,
        "max_held": 1 << 20,
    }
    assert normalised(run_lexer(case, [xml, hermes])) == [
        CallBegin("call_*", "bash"), CallArgs('{"command":"ls"}'), CallEnd(), Text(hermes),
    ]  # fmt: skip
    assert normalised(run_lexer(case, [xml + hermes])) == [
        Text(xml), CallBegin("call_*", "get_weather"), CallArgs('{"city":"Oslo"}'), CallEnd(),
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The stream rewriters
# ---------------------------------------------------------------------------------------------

ANY_MINTED = re.compile(rb"\b(call|fc|msg|rs)_[A-Za-z0-9]{24}\b")


def without_minted_ids(body: bytes) -> bytes:
    """Minted ids are random: each is replaced by its rank of first appearance, so the bodies
    compare equal exactly when they agree on everything else, and on which ids are the same."""
    seen: dict[bytes, bytes] = {}
    return ANY_MINTED.sub(lambda m: seen.setdefault(m.group(), m.group(1) + b"_#%d" % len(seen)), body)


def stream_rewrite(make, pieces: list[bytes]) -> tuple[bytes, object]:
    rewriter = make()
    out = []
    for piece in pieces:
        sent = rewriter.feed(piece)
        assert b"" not in sent  # an empty piece mid-stream ends an HTTP/1.1 chunked body
        out += sent
    out += rewriter.close()
    return b"".join(out), rewriter


def same_however_cut(make, body: bytes, pieces: list[bytes], by_byte_up_to: int) -> bytes:
    """The body rewritten whole, after checking that it comes out the same (minted ids aside)
    cut into `pieces`, one event a read, and (when short) one byte a read; no failure."""
    whole, rewriter = stream_rewrite(make, [body])
    assert rewriter.failure is None, repr(rewriter.failure)
    cuts = [pieces, by_event(body)] + ([[body[i : i + 1] for i in range(len(body))]] if len(body) <= by_byte_up_to else [])
    for cut in cuts:
        out, rewriter = stream_rewrite(make, cut)
        assert rewriter.failure is None, repr(rewriter.failure)
        assert without_minted_ids(out) == without_minted_ids(whole)
    return whole


# An id line's own line end: fields carried onto another event keep none of them (a lone `\r`
# put before an LF blank line would make a CRLF of it, and the event would not end).
ID_EOLS = (b"\n", b"\r", b"\r\n")


def check_event_ids(case, body: bytes) -> None:
    """Upstream numbered its events with `id:` lines: whatever was rewritten or held, the client
    sees each id at most once, never going back, and ends on upstream's last (the SSE client's
    last event id, which it sends when it reconnects)."""
    if not case["numbered"]:
        return
    id_line = re.compile(rb"(?:^|(?<=[\r\n]))id: (\d+)(?=[\r\n])")  # any line end, CR alone too
    sent = [int(n) for n in id_line.findall(case["body"])]
    seen = [int(n) for n in id_line.findall(body)]
    assert seen == sorted(set(seen)), seen
    if not case.get("cut") and case.get("ending") != "cut":
        assert seen[-1] == sent[-1]


def chat_tools():
    return [
        {"type": "function", "function": {"name": spec.name, "parameters": spec.parameters, "strict": spec.strict}}
        for spec in TOOLS.values()
    ]


def text_pieces(draw, text: str) -> list[str]:
    cuts = draw(st.lists(st.integers(1, max(1, len(text) - 1)), max_size=12))
    return split_at(text, cuts)


def witnesses_of(text: str) -> list[str]:
    return [c for c in text if is_witness(c)]


# Events a broken or odd upstream sends: passed on, never an exception.
OPAQUE_EVENTS = [
    b": keep-alive\n\n", b"data: not json\n\n", b"data: [1, 2]\n\n", b'data: {"no": "choices"}\n\n',
    b'data: {"choices": 5}\n\n', b"event: ping\ndata: {}\n\n", b"id: 7\nretry: 100\n\n", b"data: \xff\xfe\n\n",
    b'data: {"error": {"message": "overloaded"}, "choices": []}\n\n', b"data:\n\n", b"\n\n",
    b'data: {"choices": [1]}\n\n', b'data: {"choices": [{"delta": "x"}]}\n\n',
]
# JSON chunks with odd values in their fields: rewritten or passed on, never an exception.
ODD_CHOICES = [
    {"index": 0, "delta": None}, {"index": 0, "delta": {"content": 5}}, {"index": "0", "delta": {"content": "x"}},
    {"index": None, "delta": {"content": "<tool_call>"}}, {"index": True, "delta": {}}, {"index": 0, "delta": {}, "finish_reason": 7},
    {"index": 0, "delta": {"tool_calls": "x"}}, {"index": 0, "delta": {"tool_calls": [None, 1, {"index": "a"}]}},
    {"index": 0, "delta": {"tool_calls": [{"function": {"arguments": {"a": 1}}}]}}, {"index": 0, "delta": {"reasoning": ["x"]}},
    {"index": 0, "delta": {"content": "a", "reasoning_content": "b", "reasoning": "c"}}, {"index": 1, "delta": {"content": "<|tool_call_begin|>"}},
    {"index": 0, "delta": {"role": "assistant", "content": None, "tool_calls": None}}, {"index": -1, "delta": {"content": "x"}},
]
NATIVE_CALL = [
    {"index": 0, "id": "call_upstream", "type": "function", "function": {"name": "bash", "arguments": ""}},
    {"index": 0, "function": {"arguments": '{"command": '}},
    {"index": 0, "function": {"arguments": '"ls"}'}},
]
EOLS = [b"\n\n", b"\n\n", b"\r\n\r\n", b"\r\r"]
NO_WITNESS = {WITNESS_BASE + i: "w" for i in range(4096)}  # the second choice's text: choice 0's witnesses stay unique


@st.composite
def chat_case(draw):
    """A Chat Completions stream of a random model: leaked markup in its text fields, in random
    pieces; sometimes upstream's own call first; a finish, usage and `[DONE]`, or a cut-off.
    Broken cases add opaque events and chunks with odd field values."""
    model = draw(st.sampled_from(MODELS))
    vocabulary = [d.name for d in dialects_for(model, None)] + ["think"]
    request = {"model": model, "messages": [], "tools": chat_tools(), "stream": True}
    if len(dialects_for(model, None)) == 1 and draw(st.integers(0, 5)) == 0:  # one dialect: see test_known_limit_parallel_false_…
        request["parallel_tool_calls"] = False
    context = RequestContext.from_body(json.dumps(request).encode())
    broken = draw(st.booleans())
    layout = draw(st.sampled_from(["content", "content", "reasoning_content", "reasoning", "mirrored"]))

    def chunk(delta, finish=None, **extra):
        return {"id": "chatcmpl-f", "object": "chat.completion.chunk", "created": 1, "model": model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra}

    chunks = [chunk({"role": "assistant", "content": ""})]
    if draw(st.integers(0, 4)) == 0:
        chunks += [chunk({"tool_calls": [entry]}) for entry in NATIVE_CALL]
    witness = Witnesses()  # one sequence for both texts: each witness is unique in the body
    reasoning_text = draw(dialect_text(vocabulary, witness, new=True)) if layout != "content" else ""
    content_text = draw(dialect_text(vocabulary, witness, new=True))
    if layout != "content":
        keys = ("reasoning", "reasoning_content") if layout == "mirrored" else (layout,)
        chunks += [chunk({key: piece for key in keys}) for piece in text_pieces(draw, reasoning_text)]
    chunks += [chunk({"content": piece}) for piece in text_pieces(draw, content_text)]
    # n=2: a second choice with markup of its own, interleaved once choice 0's content began (a
    # choice whose content starts after another's may pass its start unread: README, known limits)
    second = draw(st.integers(0, 5)) == 0
    if second:
        other = [{**chunk({"content": piece}), "choices": [{"index": 1, "delta": {"content": piece}, "logprobs": None, "finish_reason": None}]}
                 for piece in text_pieces(draw, draw(dialect_text(vocabulary, Witnesses(), new=True)).translate(NO_WITNESS))]
        began = next((i for i, c in enumerate(chunks) if (c["choices"][0]["delta"].get("content") or " ").strip()), len(chunks) - 1)
        for c in other:
            chunks.insert(draw(st.integers(began + 1, len(chunks))), c)
    ending = draw(st.sampled_from(["stop", "stop", "length", "tool_calls", "cut"]))
    if ending != "cut":
        if second:
            chunks.append({**chunk({}), "choices": [{"index": 1, "delta": {}, "logprobs": None, "finish_reason": "stop"}]})
        chunks.append(chunk({}, ending))
        if draw(st.booleans()):
            chunks.append({**chunk({}), "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}})
    events = [b"data: " + json.dumps(c, ensure_ascii=draw(st.booleans())).encode() for c in chunks]
    if ending != "cut":
        events.append(b"data: [DONE]")
    events = [e + draw(st.sampled_from(EOLS)) for e in events]
    numbered = draw(st.booleans())  # an `id:` line on every event: where do they end up?
    if numbered:
        events = [b"id: %d" % n + draw(st.sampled_from(ID_EOLS)) + e for n, e in enumerate(events)]
    if broken:
        for _ in range(draw(st.integers(1, 4))):
            odd = draw(st.sampled_from(OPAQUE_EVENTS)) if draw(st.booleans()) else (
                b"data: " + json.dumps({**chunk({}), "choices": [draw(st.sampled_from(ODD_CHOICES))]}).encode() + b"\n\n"
            )
            events.insert(draw(st.integers(0, len(events))), odd)
    body = b"".join(events)
    cuts = draw(st.lists(st.integers(0, len(body)), max_size=30))
    message = {"role": "assistant", "content": content_text}
    if layout != "content":
        message.update({key: reasoning_text for key in keys})
    if '"call_upstream"' in body.decode("utf-8", "replace"):
        message["tool_calls"] = [{"id": "call_upstream", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]
    completion = {"id": "chatcmpl-f", "object": "chat.completion", "created": 1, "model": model,
                  "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
    return {"context": context, "body": body, "pieces": split_at(body, cuts), "broken": broken, "layout": layout, "numbered": numbered,
            "texts": (reasoning_text, content_text), "model": model, "completion": completion, "ending": ending}


@budget(120)
@given(chat_case())
def test_fuzz_chat_stream_rewriter(case):
    """No exception (`failure` stays None: failing open is for bugs); the same bytes for any
    split (minted ids aside); a well-formed upstream gives a well-formed stream (tests/wire.py)
    in which every witness of the text arrives exactly once, as text or in a call."""
    from toolshim.chat import ChatStreamRewriter, rewrite_chat_completion
    from wire import check_chat_stream

    body = case["body"]
    make = lambda: ChatStreamRewriter(copy.deepcopy(case["context"]))  # noqa: E731
    whole = same_however_cut(make, body, case["pieces"], by_byte_up_to=1500)
    if case["broken"]:
        for raw in OPAQUE_EVENTS:
            if raw in body and raw.strip():
                assert raw in whole  # passed on as it came
        return
    check_event_ids(case, whole)
    result = check_chat_stream(whole)
    if case["layout"] == "mirrored":
        assert result["reasoning"] == result["reasoning_content"]
    shown = result["content"] + (result["reasoning_content"] if case["layout"] != "reasoning" else result["reasoning"])
    calls = [call_text(call["id"], call["name"], call["arguments"]) for call in result["tool_calls"]]
    check_witnesses(case["texts"], shown, calls, harmony="harmony" in [d.name for d in dialects_for(case["model"], None)])
    event(f"calls: {bool(result['tool_calls'])}")
    # the streamed result is the one-shot rewrite of the same text (whitespace aside: streamed
    # text keeps what was sent before the markup after it, the buffered one is stripped)
    completion = copy.deepcopy(case["completion"])
    rewrite_chat_completion(completion, copy.deepcopy(case["context"]))
    message = completion["choices"][0]["message"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []] == [
        (c["name"], c["arguments"]) for c in result["tool_calls"]
    ]
    if case["texts"][1].lstrip(" \t\r\n")[:1].isspace():
        return  # Unicode whitespace first (U+2028…): the stream takes it for the start of the content
    for key in ("content", "reasoning", "reasoning_content"):
        assert re.sub(r"\s+", "", message.get(key) or "") == re.sub(r"\s+", "", result[key]), key


def responses_tools():
    return [{"type": "function", "name": s.name, "parameters": s.parameters, "strict": s.strict} for s in TOOLS.values()]


def native_call_events(index: int) -> tuple[list[dict], dict]:
    """Upstream's own function_call item at `index`: its events, and its done item."""
    item = {"id": "fc_upstream", "type": "function_call", "call_id": "call_upstream", "name": "bash", "arguments": "", "status": "in_progress"}
    done = {**item, "arguments": '{"command":"ls"}', "status": "completed"}
    return [
        {"type": "response.output_item.added", "output_index": index, "item": item},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_upstream", "output_index": index, "delta": '{"command":'},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_upstream", "output_index": index, "delta": '"ls"}'},
        {"type": "response.function_call_arguments.done", "item_id": "fc_upstream", "output_index": index, "name": "bash", "arguments": done["arguments"]},
        {"type": "response.output_item.done", "output_index": index, "item": done},
    ], done


# Broken upstreams: events a well-formed stream would not hold (passed on, never an exception).
ODD_EVENTS = [
    {"type": "response.made_up"}, {"type": "response.output_text.delta"}, {"type": "response.output_text.delta", "output_index": 0, "delta": 5},
    {"type": "response.output_text.delta", "output_index": 0, "item_id": "msg_test", "content_index": "0", "delta": "<tool_call>"},
    {"type": "response.output_text.delta", "output_index": 9, "item_id": "x", "content_index": 0, "delta": "<|tool_call_begin|>"},
    {"type": "response.output_item.added", "output_index": 0, "item": None}, {"type": "response.output_item.added", "output_index": "0", "item": {"type": "message"}},
    {"type": "response.output_item.added", "output_index": 5, "item": {"type": "message", "id": "msg_other", "content": []}},
    {"type": "response.output_item.done", "output_index": 0, "item": {"type": "message", "id": 7}},
    {"type": "response.content_part.added", "output_index": 0, "item_id": "msg_test", "content_index": 3, "part": {"type": "output_text", "text": ""}},
    {"type": "response.content_part.done", "output_index": 0, "item_id": "msg_test", "content_index": 0, "part": 1},
    {"type": "response.output_text.done", "output_index": 0, "item_id": "msg_test", "content_index": 0, "text": None},
    {"type": "response.completed", "response": {"output": "x"}}, {"type": "response.completed", "response": None},
    {"type": "response.reasoning_summary_text.delta", "output_index": 0, "item_id": "rs_test", "summary_index": 0, "delta": "s"},
    {"type": "response.in_progress", "sequence_number": "x"}, {"type": "error", "message": "overloaded"}, {"no": "type"}, [1, 2],
]


@st.composite
def responses_case(draw):
    """A Responses API stream of a random model (tests/responses.py builds the canonical one):
    markup in its reasoning and message text, in random pieces, sometimes after an upstream
    function_call item; with or without `event:` lines; cut off or not. Broken cases drop,
    repeat or add events (odd fields, made-up types, no JSON)."""
    from responses import number_events, response_json, responses_events

    model = draw(st.sampled_from(MODELS))
    vocabulary = [d.name for d in dialects_for(model, None)] + ["think"]
    request = {"model": model, "input": "hi", "tools": responses_tools(), "stream": True}
    if len(dialects_for(model, None)) == 1 and draw(st.integers(0, 5)) == 0:  # one dialect: see test_known_limit_parallel_false_…
        request["parallel_tool_calls"] = False
    context = RequestContext.from_body(json.dumps(request).encode())
    witness = Witnesses()
    reasoning_text = draw(dialect_text(vocabulary, witness, new=True)) if draw(st.booleans()) else None
    content_text = draw(dialect_text(vocabulary, witness, new=True))
    events = responses_events(
        model,
        text_pieces(draw, content_text),
        reasoning_pieces=None if reasoning_text is None else text_pieces(draw, reasoning_text),
        tools=responses_tools(),
    )
    body_json = response_json(model, content_text, reasoning=reasoning_text, tools=responses_tools())
    if draw(st.integers(0, 4)) == 0:  # upstream's own call, after the text items
        completed = events.pop()
        native, done = native_call_events(len(completed["response"]["output"]))
        events += native
        completed["response"]["output"].append(done)
        events.append(completed)
        body_json["output"].append(done)
    broken = draw(st.booleans())
    cut = draw(st.integers(0, 5)) == 0
    if cut:
        events = events[: draw(st.integers(1, len(events) - 1))]
    if broken:
        for _ in range(draw(st.integers(1, 3))):
            what = draw(st.sampled_from(["drop", "repeat", "add"]))
            at = draw(st.integers(0, len(events) - 1))
            if what == "drop" and len(events) > 1:
                del events[at]
            elif what == "repeat":
                events.insert(at, copy.deepcopy(events[at]))
            else:
                events.insert(at, copy.deepcopy(draw(st.sampled_from(ODD_EVENTS))))
    named = draw(st.booleans())
    raw_events = []
    for item in number_events([e for e in events if isinstance(e, dict)]) if not broken else events:
        payload = json.dumps(item, ensure_ascii=draw(st.booleans())).encode()
        name = item.get("type") if isinstance(item, dict) else None
        head = b"event: " + str(name).encode() + b"\n" if named and isinstance(name, str) else b""
        raw_events.append(head + b"data: " + payload + draw(st.sampled_from(EOLS)))
    numbered = draw(st.booleans())
    if numbered:
        raw_events = [b"id: %d" % n + draw(st.sampled_from(ID_EOLS)) + raw for n, raw in enumerate(raw_events)]
    if broken and draw(st.booleans()):
        raw_events.insert(draw(st.integers(0, len(raw_events))), draw(st.sampled_from(OPAQUE_EVENTS)))
    body = b"".join(raw_events)
    cuts = draw(st.lists(st.integers(0, len(body)), max_size=30))
    return {"context": context, "body": body, "pieces": split_at(body, cuts), "broken": broken or cut, "numbered": numbered, "cut": cut,
            "texts": tuple(t for t in (reasoning_text, content_text) if t is not None), "model": model, "json": body_json}


@budget(120)
@given(responses_case())
def test_fuzz_responses_stream_rewriter(case):
    """No exception; the same bytes for any split (minted ids aside); a well-formed upstream
    gives a stream every client accepts (tests/wire.py: numbering, item ids, every `.done` copy
    agreeing with the deltas) in which every witness arrives exactly once, as text or in a call."""
    from toolshim.responses import ResponsesStreamRewriter, rewrite_response_body
    from wire import check_responses_stream

    body = case["body"]
    make = lambda: ResponsesStreamRewriter(copy.deepcopy(case["context"]))  # noqa: E731
    whole = same_however_cut(make, body, case["pieces"], by_byte_up_to=3000)
    event(f"broken: {case['broken']}")
    if case["broken"]:
        return
    check_event_ids(case, whole)
    result = check_responses_stream(whole)
    event(f"calls: {bool(result['calls'])}")
    calls = [call_text(c["call_id"], c["name"], c["arguments"]) for c in result["calls"]]
    check_witnesses(case["texts"], result["text"] + result["reasoning"], calls,
                    harmony="harmony" in [d.name for d in dialects_for(case["model"], None)])
    # the streamed result is the one-shot rewrite of the same text (whitespace aside)
    body_json = copy.deepcopy(case["json"])
    rewrite_response_body(body_json, copy.deepcopy(case["context"]))
    items = body_json["output"]
    assert [(i["name"], i["arguments"]) for i in items if i["type"] == "function_call"] == [(c["name"], c["arguments"]) for c in result["calls"]]
    texts = {"message": "", "reasoning": ""}
    for item in items:
        if item["type"] in texts:
            texts[item["type"]] += "".join(part.get("text", "") for part in item.get("content") or [])
    assert re.sub(r"\s+", "", texts["message"]) == re.sub(r"\s+", "", result["text"])
    assert re.sub(r"\s+", "", texts["reasoning"]) == re.sub(r"\s+", "", result["reasoning"])


def opaque(raw: bytes) -> bool:
    """A block no rewriter reads: no data, not UTF-8, not a JSON object."""
    event = parse_block(raw)
    if event.data is None or event.malformed:
        return True
    try:
        return not isinstance(json.loads(event.data), dict)
    except ValueError:
        return True


@budget(80)
@given(
    st.sampled_from(["chat", "responses"]),
    st.lists(st.binary(max_size=40) | sse_texts.map(str.encode) | st.sampled_from(OPAQUE_EVENTS), max_size=8).map(b"".join),
    st.lists(st.integers(0, 400), max_size=20),
    st.sampled_from(MODELS),
)
def test_fuzz_rewriters_with_hostile_bytes(api, body, cuts, model):
    """Bytes that are no stream of the API: nothing raises out of feed/close, no empty piece is
    sent, the same bytes come out for any split, and every block no rewriter can read leaves as
    it came, in order, and so does an unterminated tail."""
    from toolshim.chat import ChatStreamRewriter
    from toolshim.responses import ResponsesStreamRewriter

    context = RequestContext(tools=dict(TOOLS), model=model)
    make = (lambda: ChatStreamRewriter(copy.deepcopy(context))) if api == "chat" else (lambda: ResponsesStreamRewriter(copy.deepcopy(context)))
    whole, rewriter = stream_rewrite(make, [body])
    assert rewriter.failure is None, repr(rewriter.failure)
    split, _ = stream_rewrite(make, split_at(body, cuts))
    assert without_minted_ids(split) == without_minted_ids(whole)
    blocks, tail = reference_blocks(body)
    at = 0
    for raw in blocks:
        if opaque(raw):
            found = whole.find(raw, at)
            assert found >= 0, raw
            at = found + len(raw)
    assert whole.endswith(tail)
    if all(opaque(raw) for raw in blocks):
        assert whole == body


# ---------------------------------------------------------------------------------------------
# Regressions: the minimal failing examples the fuzzing found, each fixed in toolshim
# ---------------------------------------------------------------------------------------------


def lex(dialect: str, pieces: list[str], *, model: str = "m", reasoning: bool = False):
    case = {"context": RequestContext(tools=dict(TOOLS), model=model, dialects=(dialect,)), "reasoning": reasoning, "max_held": 1 << 20}
    return normalised(run_lexer(case, pieces))


def test_kimi_text_inside_a_section_keeps_its_spaces_in_any_pieces():
    # lexers/kimi.py stripped the leading whitespace of every piece inside a section
    text = "<|tool_calls_section_begin|>hello world"
    assert lex("kimi", [text]) == lex("kimi", ["<|tool_calls_section_begin|>hello", " world"]) == [Text("hello world")]


def test_kimi_whitespace_before_a_marker_split_after_its_first_character_is_padding():
    # lexers/kimi.py sent the space in front of a possible marker's beginning ("a <")
    assert lex("kimi", ["a <", "|tool_calls_section_begin|>"], reasoning=True) == lex("kimi", ["a <|tool_calls_section_begin|>"], reasoning=True) == [Text("a")]


def test_whitespace_before_a_possible_closing_tag_in_preopened_reasoning_stays_with_it():
    # lexers/think.py sent " " ahead of a held "<" (a possible `</think>`): the dialect behind
    # got it alone, and a call following it kept it as reasoning text
    pieces = ["x", " <", "function=bash>\n</function>"]
    whole = lex("qwen_xml", ["".join(pieces)], model="deepseek-r1")
    assert lex("qwen_xml", pieces, model="deepseek-r1") == whole
    assert whole[0] == ReasoningText("x")


def test_a_crlf_event_after_the_last_blank_line_of_a_fast_path_read_is_not_dropped():
    # stream.py's fast path left the events after the read's last "\n\n" to the framer and
    # dropped what it completed: here `data: [DONE]\r\n\r\n`
    from toolshim.chat import ChatStreamRewriter

    def chunk(delta, finish=None):
        body = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    body = chunk({"content": "a"}) + chunk({"content": "b"}) + chunk({}, "stop") + b"data: [DONE]\r\n\r\n"
    cut = body.index(b'"b"')  # the first read ends inside the second event
    out, rewriter = stream_rewrite(lambda: ChatStreamRewriter(RequestContext(model="m")), [body[:cut], body[cut:]])
    assert out == body and rewriter.failure is None


def test_a_buffered_chat_message_with_an_upstream_call_makes_no_second_call_when_parallel_is_false():
    # chat.py's rewrite_chat_completion did not count upstream's own calls (streaming does)
    from toolshim.chat import rewrite_chat_completion

    markup = "<|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>{}<|tool_call_end|>"
    native = [{"id": "call_upstream", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]
    body = {"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": markup, "tool_calls": native}}]}
    rewrite_chat_completion(body, RequestContext(tools=dict(TOOLS), model="kimi-k2", parallel_tool_calls=False))
    message = body["choices"][0]["message"]
    assert message["tool_calls"] == native and message["content"] == markup  # shown, as when streamed


def chat_through(model: str, deltas: list[dict]) -> dict:
    from toolshim.chat import ChatStreamRewriter
    from wire import check_chat_stream

    def chunk(delta, finish=None):
        return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    body = b"".join(b"data: " + json.dumps(chunk(d)).encode() + b"\n\n" for d in [{"role": "assistant", "content": ""}, *deltas])
    body += b"data: " + json.dumps(chunk({}, "stop")).encode() + b"\n\ndata: [DONE]\n\n"
    rewriter = ChatStreamRewriter(RequestContext(tools=dict(TOOLS), model=model))
    return check_chat_stream(b"".join(rewriter.feed(body) + rewriter.close()))


def test_reasoning_after_a_harmony_message_ended_in_it_is_content_in_any_events():
    # chat.py took the choice for idle once the message ended, and passed the next reasoning
    # event as it came: "Let me" stayed reasoning when it came in an event of its own
    text = "<|channel|>final<|message|>A<|end|>B"
    one = chat_through("gpt-oss-120b", [{"reasoning_content": text + "Let me"}])
    two = chat_through("gpt-oss-120b", [{"reasoning_content": text}, {"reasoning_content": "Let me"}])
    assert one["content"] == two["content"] == "ABLet me" and two["reasoning_content"] == ""


def test_whitespace_alone_does_not_start_the_content_before_a_think_block():
    # chat.py's fast path counted `"content": " "` as the start of the content, so a `<think>`
    # that followed was read as content (the buffered rewrite reads it as reasoning)
    result = chat_through("kimi-k2.5", [{"content": " "}, {"content": "<think>hm</think>Hi"}])
    assert result["reasoning_content"] == "hm" and result["content"].strip() == "Hi"
