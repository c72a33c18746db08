"""Property tests of the `<tool_call>` lexer: random model texts, fed in random pieces.

Oracles: (a) the output is the same however the text is split, (b) no character of text is
lost: the text out is the input minus the call blocks and their padding, (c) the calls are
exactly the valid blocks naming declared tools, (d) a valid block never reaches a Text. And the
scanner examines each character of a block a bounded number of times.
"""

from __future__ import annotations

from functools import partial

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolshim.calls import CallScope, RewriteStats
from toolshim.lexers.base import CallArgs, CallBegin, CallEnd, Text
from toolshim.lexers.engine import lexer
from toolshim.lexers.specs import HERMES
from toolshim.tools import RequestContext, ToolSpec

hermes_lexer = partial(lexer, HERMES)

TOOLS = {
    "bash": ToolSpec("bash", {"type": "object"}),
    "get_weather": ToolSpec("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}}),
    "mcp__portal__search-documents": ToolSpec("mcp__portal__search-documents", {"type": "object"}, strict=True),
}
NAMES = sorted(TOOLS)

# Prose, with look-alikes of the tags. No token can complete a tag begun by the one before it.
prose_tokens = st.sampled_from(
    ["ab", "c", " ", "\n", "é", "日", "x<y", "<b>", "<tool", "<tool_call", "</tool_call>", "{", "}", '"', "<tool_call> see", "<tool_calls>"]
)
prose = st.lists(prose_tokens, min_size=1, max_size=6).map("".join)
pad = st.sampled_from(["", " ", "\n", "\n\n", " \n "])
json_strings = st.text(alphabet="xy <>/\"\\é日", max_size=6) | st.sampled_from(["</tool_call>", "<tool_call>", "\\", '"', "<tool_call>{"])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | json_strings,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(alphabet="kz", min_size=1, max_size=3), children, max_size=3),
    max_leaves=6,
)
arguments = st.dictionaries(st.sampled_from(["command", "city", "q"]), json_values, max_size=3)


def dumps(draw, value) -> str:
    return json.dumps(value, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 2])))


@st.composite
def valid_block(draw):
    """A block naming declared tools: its text and the calls it makes."""
    entries, calls = [], []
    for _ in range(draw(st.integers(1, 2))):
        name = draw(st.sampled_from(NAMES))
        args = draw(arguments)
        key = draw(st.sampled_from(["arguments", "arguments", "parameters"]))
        encoded = dumps(draw, args) if draw(st.booleans()) else args  # seed 001 sends JSON text
        entries.append({"name": name, key: encoded})
        calls.append((name, args))
    value = entries if len(entries) > 1 or draw(st.integers(0, 3)) == 0 else entries[0]  # or a list of one
    return "<tool_call>" + draw(pad) + dumps(draw, value) + draw(pad), calls


invalid_blocks = st.sampled_from(
    [
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',  # undeclared
        '<tool_call>{"name": "bash", "arguments": "@@@"}</tool_call>',  # unrepairable arguments
        '<tool_call>["bash"]</tool_call>',  # not a call object
        '<tool_call>\n{"nome": "bash"}\n</tool_call>',
        '<tool_call>{"name": "mcp__portal__search-documents", "arguments": {"q": 1,}}</tool_call>',  # strict: no repair
        '<tool_call>[{"name": "bash"}, {"name": "nope"}]</tool_call>',  # a list is all or nothing
    ]
)


@st.composite
def model_text(draw):
    """Returns the text, the parts (kind, text), and the expected calls in order."""
    parts, calls = [], []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["prose", "pad", "call", "call", "invalid"]))
        if kind == "prose":
            parts.append(("text", draw(prose)))
        elif kind == "pad":
            parts.append(("text", draw(pad)))
        elif kind == "invalid":
            parts.append(("text", draw(invalid_blocks)))
        else:
            text, block_calls = draw(valid_block())
            parts.append(("call", text + "</tool_call>"))
            calls += block_calls
    if draw(st.integers(0, 4)) == 0:  # the last block left open until the end (vLLM accepts it)
        text, block_calls = draw(valid_block())
        parts.append(("call", text))
        calls += block_calls
        parts.append(("text", draw(pad)))
    return "".join(p for _, p in parts), parts, calls


def expected_text(parts) -> str:
    """The input minus the call blocks and their padding (the module docstring's rules)."""
    out, after_call = "", None
    for kind, text in parts:
        if kind == "call":
            out = out.rstrip()  # whitespace right before a call is its padding
            after_call = len(out)
        else:
            out += text
    if after_call is not None and not out[after_call:].strip():
        out = out[:after_call]  # whitespace after the last call, up to the end
    return out


def run(text: str, pieces: list[str]):
    lexer = hermes_lexer(CallScope(RequestContext(tools=dict(TOOLS)), RewriteStats()))
    segments = []
    for piece in pieces:
        segments += lexer.feed(piece)
    segments += lexer.finish()
    assert lexer.idle
    return segments


def merge(segments):
    merged = []
    for seg in segments:
        if isinstance(seg, CallBegin):
            seg = CallBegin("", seg.name)
        if merged and type(seg) in (Text, CallArgs) and type(merged[-1]) is type(seg):
            merged[-1] = type(seg)(merged[-1].text + seg.text)
        elif not (isinstance(seg, Text) and not seg.text):
            merged.append(seg)
    return merged


def without_sent_padding(merged):
    """Whitespace sent in an earlier piece than its tag stays sent: the one allowed difference."""
    out = []
    for i, seg in enumerate(merged):
        if isinstance(seg, Text) and i + 1 < len(merged) and isinstance(merged[i + 1], CallBegin):
            seg = Text(seg.text.rstrip())
            if not seg.text:
                continue
        out.append(seg)
    return out


def split(text: str, cuts: list[int]) -> list[str]:
    cuts = sorted({c for c in cuts if 0 < c < len(text)})
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model_text(), st.lists(st.integers(0, 2000), max_size=40))
def test_random_texts_in_random_pieces(case, cuts):
    text, parts, calls = case
    whole = merge(run(text, [text]))
    pieces = merge(run(text, split(text, [c % (len(text) + 1) for c in cuts])))
    # (a) chunking invariance
    assert without_sent_padding(pieces) == without_sent_padding(whole)
    if len(text) <= 300:
        assert without_sent_padding(merge(run(text, list(text)))) == without_sent_padding(whole)
    # (b) nothing lost, exactly
    out_text = "".join(seg.text for seg in whole if isinstance(seg, Text))
    assert out_text == expected_text(parts)
    # (c) the calls are the valid blocks
    got, args = [], []
    for seg in whole:
        if isinstance(seg, CallBegin):
            got.append(seg.name)
            args.append("")
        elif isinstance(seg, CallArgs):
            args[-1] += seg.text
        elif isinstance(seg, CallEnd):
            pass
    assert [(name, json.loads(a)) for name, a in zip(got, args)] == calls
    # (d) a valid block never shows as text, in whole or in pieces
    for kind, part in parts:
        if kind == "call":
            assert part not in out_text
            assert part not in "".join(seg.text for seg in pieces if isinstance(seg, Text))


@settings(max_examples=200, deadline=None)
@given(st.lists(prose_tokens, max_size=12).map("".join), st.lists(st.integers(0, 100), max_size=10))
def test_prose_alone_passes_through_whole(text, cuts):
    assert merge(run(text, split(text, cuts))) == ([Text(text)] if text else [])


def scanned(block_text: str, piece: int = 1) -> tuple[int, list]:
    lexer = hermes_lexer(CallScope(RequestContext(tools=dict(TOOLS)), RewriteStats()))
    out = []
    for i in range(0, len(block_text), piece):
        out += lexer.feed(block_text[i : i + piece])
    out += lexer.finish()
    return lexer.examined, merge(out)


def test_scanning_work_is_linear_in_the_block():
    n = 200_000
    dense = 'a\\"<tool_call></tool_call>' * (n // 26)
    text = '<tool_call>{"name": "bash", "arguments": {"command": ' + json.dumps(dense) + "}}</tool_call>"
    examined, out = scanned(text)
    assert out[0] == CallBegin("", "bash") and json.loads(out[1].text) == {"command": dense}
    assert examined <= 2 * len(text)
    # "<" outside strings, each a possible tag until the next character arrives
    text = "<tool_call>[" + "<" * n + "]</tool_call>"
    examined, out = scanned(text)
    assert out == [Text(text)]
    assert examined <= 4 * len(text)


# Strings holding brackets and quotes: what the bulk of a held block must not count as nesting.
bracket_strings = st.text(alphabet='{}[]"\\ x<', max_size=5)
bracket_values = st.recursive(
    st.none() | st.integers(-5, 5) | bracket_strings,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(bracket_strings, children, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(model_text().map(lambda case: case[0]), bracket_values.map(lambda v: f"<tool_call>{json.dumps({'name': 'bash', 'arguments': v})}</tool_call> after")),
       st.lists(st.integers(1, 6), min_size=1, max_size=40))  # fmt: skip
def test_a_held_blocks_bulk_is_read_as_the_scanner_reads_it(text, sizes):
    """`JsonCallsLexer.feed` takes a piece of a held block without the scanner's loop where it
    can: the same segments and the same state after every piece as the generic step's."""
    from toolshim.lexers.engine import BlockLexer

    def state(lexer):
        scanner = lexer._scanner
        return (lexer._state, lexer._tail, lexer._raw.text(), lexer._size, lexer.examined, lexer.idle, scanner.depth, scanner.in_string, scanner.escape)

    fast, generic = (hermes_lexer(CallScope(RequestContext(tools=dict(TOOLS)), RewriteStats())) for _ in range(2))
    at, n = 0, 0
    while at < len(text):
        piece = text[at : at + sizes[n % len(sizes)]]
        at, n = at + len(piece), n + 1
        assert unnamed(fast.feed(piece)) == unnamed(BlockLexer.feed(generic, piece)), piece
        assert state(fast) == state(generic), piece
    assert unnamed(fast.finish()) == unnamed(generic.finish())


def unnamed(segments):
    """The segments, a call's minted id left out (each lexer mints its own)."""
    return [CallBegin("", seg.name) if isinstance(seg, CallBegin) else seg for seg in segments]
