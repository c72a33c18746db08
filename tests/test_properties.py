"""Property tests of the core: random Kimi outputs, random upstream event splits, random reads.

Oracles (DESIGN.md invariants): the stream is the same however its bytes are split; every call
the model wrote arrives whole; no character of prose is lost; no marker fragment reaches a text
field; every chunk sent obeys the wire rules (so nothing sent ever needs retracting).
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import sse_body, split_bytes
from kimi import chunk
from toolshim.chat import ChatStreamRewriter
from toolshim.lexers import deepseek, harmony, tokens
from toolshim.lexers import kimi as kimi_lexer
from toolshim.lexers.base import Marker, find_marker
from toolshim.tools import RequestContext
from wire import check_chat_stream

NAMES = ["bash", "read_file", "mcp__portal__search-documents", "get_weather"]
# Prose may hold angle brackets and pipes, but not the characters that spell markers ("_", "/").
prose = st.text(alphabet="ab c<|>é日\n.", min_size=1, max_size=12).filter(lambda s: s.strip())
pad = st.sampled_from(["", " ", "\n", " \n "])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(alphabet="xy <|>\"\\é", max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(alphabet="kz", min_size=1, max_size=3), children, max_size=3),
    max_leaves=6,
)


@st.composite
def kimi_output(draw):
    """Model text with its expected calls and the prose that must survive."""
    parts, calls, prose_parts = [], [], []
    counter = draw(st.integers(0, 20))
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.booleans()):
            text = draw(prose)
            parts.append(text)
            prose_parts.append(text)
        section = draw(st.booleans())
        if section:
            parts.append(draw(pad) + draw(st.sampled_from(["<|tool_calls_section_begin|>", "<|tool_call_section_begin|>"])))
        for _ in range(draw(st.integers(1, 2))):
            name = draw(st.sampled_from(NAMES))
            args = json.dumps(draw(st.dictionaries(st.sampled_from(["command", "path", "q"]), json_values, max_size=3)), ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 2])))
            header = f"functions.{name}:{counter}"
            calls.append({"id": header, "name": name, "arguments": args})
            counter += 1
            parts.append(draw(pad) + "<|tool_call_begin|>" + draw(pad) + header + draw(pad) + "<|tool_call_argument_begin|>" + draw(pad) + args + draw(pad))
            if draw(st.booleans()) or not section:
                parts.append("<|tool_call_end|>")
        if not section:
            # A bare call is closed by the next call or the end of the text: prose after it
            # would be read as its arguments, so the output ends here.
            return "".join(parts), calls, prose_parts
        parts.append(draw(pad) + draw(st.sampled_from(["<|tool_calls_section_end|>", "<|tool_call_section_end|>"])))
    if draw(st.booleans()):
        text = draw(prose)
        parts.append(draw(pad) + text)
        prose_parts.append(text)
    return "".join(parts), calls, prose_parts


@st.composite
def stream_case(draw):
    text, calls, prose_parts = draw(kimi_output())
    fields = draw(st.sampled_from([("content",), ("reasoning_content",), ("reasoning", "reasoning_content")]))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=len(text) // 2)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)]) if b > a]
    chunks = [chunk("m", {"role": "assistant", "content": ""})]
    chunks += [chunk("m", {f: piece for f in fields}) for piece in pieces]
    chunks.append(chunk("m", {}, "stop"))
    body = sse_body(chunks)
    byte_cuts = draw(st.lists(st.integers(0, len(body)), max_size=30))
    return body, fields, calls, prose_parts, byte_cuts


def rewrite(pieces: list[bytes]) -> bytes:
    rewriter = ChatStreamRewriter(RequestContext())
    out = []
    for piece in pieces:
        out += rewriter.feed(piece)
    out += rewriter.close()
    assert b"" not in out
    return b"".join(out)


def visible(s: str) -> str:
    return "".join(s.split())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream_case())
def test_random_kimi_streams(case):
    body, fields, calls, prose_parts, byte_cuts = case
    whole = rewrite([body])
    split = rewrite(split_bytes(body, byte_cuts))
    assert split == whole  # chunking invariance, byte for byte
    result = check_chat_stream(whole)  # wire rules hold on every chunk
    assert result["tool_calls"] == calls
    assert result["finish_reason"] == "tool_calls"
    text = result["content"] + result[fields[0]] if fields[0] != "content" else result["content"]
    assert visible(text) == visible("".join(prose_parts))  # all prose, and only prose
    for field in ("content", "reasoning", "reasoning_content"):
        assert "<|tool" not in result[field]
    if len(fields) == 2:
        assert result["reasoning"] == result["reasoning_content"]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab <|>_/é\n", max_size=40), st.lists(st.integers(0, 400), max_size=20))
def test_text_without_complete_markers_passes_through_whole(text, byte_cuts):
    body = sse_body([chunk("m", {"content": text}), chunk("m", {}, "stop")])
    out = rewrite(split_bytes(body, [c for c in byte_cuts if c <= len(body)]))
    assert check_chat_stream(out)["content"] == text


# -- the marker search ------------------------------------------------------------------------------

MARKER_SETS = (
    kimi_lexer._KIMI_MARKERS,
    kimi_lexer._KIMI_MARKERS + (tokens.THINK_END,),
    deepseek._TEXT_MARKERS_THINK_END,
    deepseek._INVOKE_MARKERS,
    harmony._TEXT_MARKERS,
    # made up to overlap: one marker the beginning of others, two of one length, another first character
    tuple(Marker(text, f"kind{n}") for n, text in enumerate(("<a", "<ab>", "<ab", "<b>", "<ac", "[X]", "[X"))),
)


def reference_find_marker(buf: str, start: int, markers: tuple[Marker, ...], final: bool) -> tuple[int, Marker | None] | None:
    """`find_marker` as its docstring states it, one place after another: the first place that
    holds a possible beginning of a marker (`final` aside), or a whole marker (the longest; of
    two as long, the first given)."""
    for i in range(start, len(buf)):
        rest = buf[i:]
        if not final and any(len(m.text) > len(rest) and m.text.startswith(rest) for m in markers):
            return i, None
        whole = [m for m in markers if rest.startswith(m.text)]
        if whole:
            return i, max(whole, key=lambda m: len(m.text))
    return None


@st.composite
def marker_search_case(draw):
    markers = draw(st.sampled_from(MARKER_SETS))
    pieces = draw(st.lists(st.one_of(st.sampled_from([m.text for m in markers]), st.text(alphabet="<|>[]X_abc /", max_size=6)), max_size=8))
    buf = "".join(pieces)
    if buf and draw(st.booleans()):
        buf = buf[: draw(st.integers(0, len(buf)))]  # cut anywhere: inside a marker as often as not
    return buf, draw(st.integers(0, len(buf))), markers, draw(st.booleans())


@settings(max_examples=1500, deadline=None)
@given(marker_search_case())
def test_find_marker_finds_what_its_definition_finds(case):
    buf, start, markers, final = case
    match = find_marker(buf, start, markers, final)
    assert (None if match is None else (match.pos, match.marker)) == reference_find_marker(buf, start, markers, final)
