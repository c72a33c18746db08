"""The sans-IO core on Kimi streams: one test per rule, then every byte boundary."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from harness import sse_body, split_bytes
from kimi import ARG_BEGIN, CALL_BEGIN, CALL_END, SECTION_BEGIN, SECTION_END, SEED_000, chunk, kimi_chunks
from toolshim.chat import ChatStreamRewriter, rewrite_chat_completion
from toolshim.lexers.base import CallArgs, CallBegin, CallEnd, Reporting, Text
from toolshim.calls import CallScope, RewriteStats
from toolshim.lexers.kimi import KimiCallNamer, KimiLexer
from toolshim.tools import RequestContext
from wire import check_chat_stream

TOOLS = [
    {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "exec", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}},
]


def context(tools=None, messages=None) -> RequestContext:
    return RequestContext.from_body(json.dumps({"model": "m", "tools": tools or [], "messages": messages or []}).encode())


def rewrite(body: bytes, pieces: list[bytes] | None = None, ctx: RequestContext | None = None) -> bytes:
    rewriter = ChatStreamRewriter(ctx or RequestContext())
    out = []
    for piece in pieces or [body]:
        out += rewriter.feed(piece)
    out += rewriter.close()
    assert b"" not in out
    return b"".join(out)


def lex(text: str, ctx: RequestContext | None = None, reasoning: bool = False, pieces: list[str] | None = None):
    lexer = KimiLexer(KimiCallNamer(CallScope(ctx or RequestContext(), RewriteStats())), reasoning=reasoning)
    segments = []
    for piece in pieces or [text]:
        segments += lexer.feed(piece)
    segments += lexer.finish()
    merged = []
    for seg in segments:  # join neighbouring text/argument pieces: splits must not matter
        if merged and type(seg) in (Text, CallArgs) and type(merged[-1]) is type(seg):
            merged[-1] = type(seg)(merged[-1].text + seg.text)
        else:
            merged.append(seg)
    return merged


def call(text_id, name, args):
    return [CallBegin(text_id, name), CallArgs(args), CallEnd()]


# -- markup spellings ---------------------------------------------------------------------------


def test_canonical_section_with_two_calls():
    text = f"{SECTION_BEGIN}{CALL_BEGIN}functions.bash:0{ARG_BEGIN}{{\"command\":\"ls\"}}{CALL_END}{CALL_BEGIN}functions.read_file:1{ARG_BEGIN}{{}}{CALL_END}{SECTION_END}"
    assert lex(text) == call("functions.bash:0", "bash", '{"command":"ls"}') + call("functions.read_file:1", "read_file", "{}")


def test_singular_section_tokens():
    text = f"<|tool_call_section_begin|>{CALL_BEGIN}functions.bash:3{ARG_BEGIN}{{}}{CALL_END}<|tool_call_section_end|>after"
    assert lex(text) == call("functions.bash:3", "bash", "{}") + [Text("after")]  # no padding to keep


def test_call_without_section_wrapper_and_without_end_marker():
    text = f"Let me look. {CALL_BEGIN}functions.bash:0{ARG_BEGIN}{{\"command\": \"pwd\"}}"
    assert lex(text) == [Text("Let me look.")] + call("functions.bash:0", "bash", '{"command": "pwd"}')


def test_next_call_begin_closes_a_call_missing_its_end():
    text = f"{SECTION_BEGIN}{CALL_BEGIN}functions.bash:0{ARG_BEGIN}{{\"a\":1}}{CALL_BEGIN}functions.bash:1{ARG_BEGIN}{{\"a\":2}}{SECTION_END}"
    assert lex(text) == call("functions.bash:0", "bash", '{"a":1}') + call("functions.bash:1", "bash", '{"a":2}')


def test_spaces_and_newlines_around_every_marker_are_padding():
    text = f" {SECTION_BEGIN} {CALL_BEGIN}\nfunctions.get_weather:0 {ARG_BEGIN} {{\"city\": \"Paris\"}} {CALL_END} {SECTION_END} "
    assert lex(text) == call("functions.get_weather:0", "get_weather", '{"city": "Paris"}')


def test_multi_line_arguments_keep_their_inner_whitespace():
    args = '{\n  "path": "a.py",\n  "content": "x = 1\\n"\n}'
    assert lex(f"{CALL_BEGIN}functions.write:0{ARG_BEGIN}\n{args}\n{CALL_END}") == call("functions.write:0", "write", args)


def test_truncated_section_end_is_recognised():
    text = f"{SECTION_BEGIN}{CALL_BEGIN}functions.bash:0{ARG_BEGIN}{{}}{CALL_END}<|tool_calls_section_end| Done."
    assert lex(text) == call("functions.bash:0", "bash", "{}") + [Text(" Done.")]


def test_text_before_and_after_a_section_in_one_piece():
    text = f"Hello {SECTION_BEGIN}{CALL_BEGIN}functions.bash:0{ARG_BEGIN}{{}}{CALL_END}{SECTION_END} world"
    assert lex(text) == [Text("Hello")] + call("functions.bash:0", "bash", "{}") + [Text(" world")]


def test_whitespace_and_marker_only_tails_are_dropped():
    text = f"{SECTION_BEGIN}{CALL_BEGIN}functions.bash:0{ARG_BEGIN}{{}}{CALL_END}{SECTION_END} \n {SECTION_END}\n"
    assert lex(text) == call("functions.bash:0", "bash", "{}")


def test_angle_brackets_inside_arguments_are_arguments():
    args = '{"html": "<div>a < b</div>", "t": "<|not a marker|>"}'
    assert lex(f"{CALL_BEGIN}functions.bash:0{ARG_BEGIN}{args}{CALL_END}") == call("functions.bash:0", "bash", args)


def test_stray_think_end_after_a_section_ends_reasoning():
    from toolshim.lexers.base import ReasoningEnd

    text = f"plan {SECTION_BEGIN}{CALL_BEGIN}functions.bash:0{ARG_BEGIN}{{}}{CALL_END}{SECTION_END}</think> The answer"
    assert lex(text, reasoning=True) == [Text("plan")] + call("functions.bash:0", "bash", "{}") + [ReasoningEnd(), Text("The answer")]
    # in content, or before any section, </think> is not ours to interpret
    assert lex("a </think> b", reasoning=True) == [Text("a </think> b")]


def test_plain_text_with_angle_brackets_passes_unchanged():
    text = "if a <b and c<|d then <think> x <| y"
    assert lex(text) == [Text(text)]
    assert lex(text, pieces=list(text)) == [Text(text)]


# -- ids and names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header, expected_id, expected_name",
    [
        ("functions.bash:15", "functions.bash:15", "bash"),
        ("bash:2", "bash:2", "bash"),
        ("\nfunctions.read_file:0 ", "functions.read_file:0", "read_file"),
        ("functionsexec5", "functionsexec5", "exec"),  # dot and colon lost (SGLang PR #21377)
        ("functions_read_file_1", "functions_read_file_1", "read_file"),  # client-sanitised ids
        ("call00003", "call00003", None),  # several tools, no name: decided by the argument keys
    ],
)
def test_odd_headers_resolve_against_declared_tools(header, expected_id, expected_name):
    namer = KimiCallNamer(CallScope(context(TOOLS), RewriteStats()))
    assert namer.name_for(header) == expected_name
    if expected_name:
        assert namer.id_for(header, expected_name) == expected_id


def test_bare_counter_is_resolved_from_argument_keys_and_given_a_minted_id():
    history = [{"role": "assistant", "tool_calls": [{"id": "functions.bash:7", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}]
    text = f"{CALL_BEGIN}3{ARG_BEGIN}{{\"path\": \"a\"}}{CALL_END}"
    assert lex(text, context(TOOLS, history)) == call("functions.read_file:8", "read_file", '{"path": "a"}')


def test_single_declared_tool_takes_an_unreadable_header():
    assert lex(f"{CALL_BEGIN}call00003{ARG_BEGIN}{{}}{CALL_END}", context(TOOLS[:1])) == call("call00003", "bash", "{}")


def test_undeclared_tool_stays_visible_text():
    text = f"{CALL_BEGIN}functions.rm_rf:0{ARG_BEGIN}{{}}{CALL_END}"
    assert lex(text, context(TOOLS)) == [Text(text)]


def test_unresolvable_header_without_declared_tools_stays_visible_text():
    text = f"{CALL_BEGIN}call00003{ARG_BEGIN}{{\"a\": 1}}{CALL_END}"
    assert lex(text) == [Text(text)]


def test_repeated_id_within_one_response_is_replaced_by_a_minted_one():
    text = f"{CALL_BEGIN}functions.bash:0{ARG_BEGIN}{{}}{CALL_END}{CALL_BEGIN}functions.bash:0{ARG_BEGIN}{{}}{CALL_END}"
    assert lex(text) == call("functions.bash:0", "bash", "{}") + call("functions.bash:1", "bash", "{}")


# -- cut-off streams ------------------------------------------------------------------------------


def test_cut_inside_arguments_closes_the_announced_call():
    assert lex(f"{CALL_BEGIN}functions.bash:0{ARG_BEGIN}{{\"command\": \"ls\"}}  <|tool_ca") == call(
        "functions.bash:0", "bash", '{"command": "ls"}'
    )


def test_cut_inside_header_releases_the_markup_as_text():
    assert lex(f"Checking {SECTION_BEGIN}{CALL_BEGIN}functions.ba") == [Text(f"Checking{CALL_BEGIN}functions.ba")]


def test_cut_after_argument_begin_gives_empty_object():
    assert lex(f"{CALL_BEGIN}functions.bash:0{ARG_BEGIN}") == call("functions.bash:0", "bash", "{}")


# -- the Chat stream ------------------------------------------------------------------------------

SEED_BODY = sse_body(kimi_chunks("kimi-k2.5", SEED_000))


def test_seed_stream_result():
    result = check_chat_stream(rewrite(SEED_BODY))
    assert result["reasoning"] == result["reasoning_content"] == "I will list the headers."
    assert result["content"] == ""
    assert [(c["id"], c["name"], json.loads(c["arguments"])) for c in result["tool_calls"]] == [
        ("functions.bash:15", "bash", {"command": "ls -la /usr/include | grep asm"}),
        ("functions.read_file:16", "read_file", {"path": "/usr/include/asm/unistd.h"}),
    ]
    assert result["finish_reason"] == "tool_calls"
    assert result["usage"]["total_tokens"] == 43339


def test_every_byte_boundary_gives_the_same_stream():
    whole = rewrite(SEED_BODY)
    for cut in range(1, len(SEED_BODY)):
        assert rewrite(SEED_BODY, split_bytes(SEED_BODY, [cut])) == whole, cut
    assert rewrite(SEED_BODY, [SEED_BODY[i : i + 1] for i in range(len(SEED_BODY))]) == whole


def test_utf8_split_across_reads_survives():
    body = sse_body(kimi_chunks("m", ["Größe 日本 ", SECTION_BEGIN, CALL_BEGIN, "functions.bash:0", ARG_BEGIN, '{"q": "ü"}', CALL_END, SECTION_END], fields=("content",)))
    whole = check_chat_stream(rewrite(body))
    assert whole["content"] == "Größe 日本 "  # the space came in its own event, before any marker
    assert json.loads(whole["tool_calls"][0]["arguments"]) == {"q": "ü"}
    for cut in range(1, len(body)):
        assert check_chat_stream(rewrite(body, split_bytes(body, [cut]))) == whole


def test_plain_stream_passes_byte_identical():
    body = sse_body(kimi_chunks("m", ["Hello", " <b>world</b>", "\n", "a <| b"], fields=("content",)))
    assert rewrite(body) == body
    assert rewrite(body, [body[i : i + 1] for i in range(len(body))]) == body


def test_crlf_and_comment_lines_are_framed_and_kept():
    body = sse_body(kimi_chunks("m", ["Hi ", SECTION_BEGIN, CALL_BEGIN, "functions.bash:0", ARG_BEGIN, "{}", CALL_END, SECTION_END], fields=("content",)))
    body = b": keep-alive\r\n\r\n" + body.replace(b"\n", b"\r\n")
    out = rewrite(body)
    assert out.startswith(b": keep-alive\r\n\r\n")
    assert check_chat_stream(out)["tool_calls"][0]["name"] == "bash"


def test_several_markers_in_one_event():
    pieces = [f"Text {SECTION_BEGIN}{CALL_BEGIN}functions.bash:0{ARG_BEGIN}{{\"a\":1}}{CALL_END}{CALL_BEGIN}functions.read_file:1{ARG_BEGIN}{{}}{CALL_END}{SECTION_END} tail"]
    result = check_chat_stream(rewrite(sse_body(kimi_chunks("m", pieces, fields=("content",)))))
    assert result["content"] == "Text tail"
    assert [c["name"] for c in result["tool_calls"]] == ["bash", "read_file"]


def test_length_cut_inside_a_header_releases_text_and_keeps_length():
    pieces = ["Let me check", " " + SECTION_BEGIN, " " + CALL_BEGIN, " functions.ba"]
    result = check_chat_stream(rewrite(sse_body(kimi_chunks("m", pieces, fields=("content",), finish_reason="length"))))
    assert result["content"] == f"Let me check{CALL_BEGIN} functions.ba"
    assert result["tool_calls"] == [] and result["finish_reason"] == "length"


def test_stream_ending_without_finish_or_done_flushes_held_text():
    body = sse_body([chunk("m", {"content": "a <|tool_calls_sec"})], done=False)
    result = check_chat_stream(rewrite(body))
    assert result["content"] == "a <|tool_calls_sec"


def test_reasoning_after_leaked_think_end_becomes_content():
    pieces = ["Plan.", SECTION_BEGIN, CALL_BEGIN, "functions.bash:0", ARG_BEGIN, "{}", CALL_END, SECTION_END, "</think>", "Running it now."]
    result = check_chat_stream(rewrite(sse_body(kimi_chunks("m", pieces, fields=("reasoning_content",)))))
    assert result["reasoning_content"] == "Plan."
    assert result["content"] == "Running it now."
    assert "</think>" not in json.dumps(result)


def test_native_tool_calls_after_ours_are_renumbered():
    chunks = kimi_chunks("m", [CALL_BEGIN, "functions.bash:0", ARG_BEGIN, "{}", CALL_END], fields=("content",), usage=None)
    native = chunk("m", {"tool_calls": [{"index": 0, "id": "call_x", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]})
    chunks.insert(-1, native)
    result = check_chat_stream(rewrite(sse_body(chunks)))
    assert [c["id"] for c in result["tool_calls"]] == ["functions.bash:0", "call_x"]


# -- non-streaming bodies -------------------------------------------------------------------------


def completion(message: dict, finish="stop") -> dict:
    return {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": [{"index": 0, "message": message, "finish_reason": finish}]}


def test_buffered_message_gets_tool_calls_and_null_content():
    body = completion({"role": "assistant", "content": f" {SECTION_BEGIN} {CALL_BEGIN} functions.bash:15 {ARG_BEGIN} {{\"command\": \"ls\"}} {CALL_END} {SECTION_END}"})
    assert rewrite_chat_completion(body, RequestContext()) is not None
    message = body["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [{"id": "functions.bash:15", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]
    assert body["choices"][0]["finish_reason"] == "tool_calls"


def test_buffered_message_without_markup_is_left_alone():
    body = completion({"role": "assistant", "content": "a <b> c"})
    assert rewrite_chat_completion(body, RequestContext()) is None
    assert body["choices"][0]["message"]["content"] == "a <b> c"


def test_buffered_and_streamed_give_the_same_calls():
    text = "".join(SEED_000)
    body = completion({"role": "assistant", "content": None, "reasoning_content": text, "reasoning": text})
    rewrite_chat_completion(body, RequestContext())
    message = body["choices"][0]["message"]
    streamed = check_chat_stream(rewrite(SEED_BODY))
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [
        (c["id"], c["name"], c["arguments"]) for c in streamed["tool_calls"]
    ]
    assert message["reasoning_content"] == message["reasoning"] == streamed["reasoning"]


# -- bounded memory -------------------------------------------------------------------------------


def test_arguments_held_for_name_inference_are_capped_then_shown_as_text():
    lexer = KimiLexer(KimiCallNamer(CallScope(context(TOOLS), RewriteStats())), max_held=1024)
    big = '{"path": "' + "x" * 2000 + '"}'
    segments = lexer.feed(f"{CALL_BEGIN}7{ARG_BEGIN}") + lexer.feed(big[:1500]) + lexer.feed(big[1500:] + CALL_END) + lexer.finish()
    assert not any(isinstance(s, CallBegin) for s in segments)
    assert "".join(s.text for s in segments if isinstance(s, Text)) == f"{CALL_BEGIN}7{ARG_BEGIN}{big}{CALL_END}"


def test_overlong_header_is_not_a_header():
    text = f"{CALL_BEGIN}{'h' * 300} and more text"
    assert lex(text) == [Text(text)]


def test_unterminated_last_event_is_forwarded_as_it_came_after_the_flush():
    tail = b'data: {"id": "cut'
    body = sse_body([chunk("m", {"content": "a <|tool_calls_sec"})], done=False) + tail
    out = rewrite(body)
    assert out.endswith(b"\n\n" + tail)
    assert check_chat_stream(out[: -len(tail)])["content"] == "a <|tool_calls_sec"


def test_whitespace_flood_inside_live_arguments_is_released_at_the_cap_and_nothing_is_lost():
    # Pieces of live arguments that end in whitespace hold it until more arguments come (a call's
    # arguments end without it); a flood of it, over max_held, goes out as it is.
    lexer = KimiLexer(KimiCallNamer(CallScope(context(TOOLS), RewriteStats())), max_held=1024)
    pieces = [f"{CALL_BEGIN}functions.read_file:0{ARG_BEGIN}", '{"path": "a', " b "] + ["  "] * 1000 + ['c"} ', " ", CALL_END]
    segments = [s for piece in pieces for s in lexer.feed(piece)] + lexer.finish()
    args = [s.text for s in segments if isinstance(s, CallArgs)]
    assert "".join(args) == '{"path": "a b ' + "  " * 1000 + 'c"}'
    assert len(args) > 3  # released along the way, not only with the `c`
    assert all(len(s) <= 1026 for s in args[2:-1])  # (each release at the cap: held no further)
    assert isinstance(segments[-1], CallEnd)


# -- the lanes' steady pieces ---------------------------------------------------------------------


def _through_feed_or_steady(lexer: KimiLexer, pieces: list[str], steady: bool, live: bool = True) -> tuple[list, list[int]]:
    """The segments of `pieces`, each fed, or first offered to `steady_piece` as a lane offers
    it (what it makes standing for `feed`'s one `CallArgs`); and where it took them."""
    segments: list = []
    taken = []
    for at, piece in enumerate(pieces):
        made = lexer.steady_piece(piece, live) if steady else None
        if made is None:
            segments += lexer.feed(piece)
        else:
            taken.append(at)
            segments += [CallArgs(made)] if made else []
    return segments + lexer.finish(), taken


@given(
    st.lists(st.sampled_from(["a", "bc", " ", "  ", "d ", " e", "\n", "\t x ", "<", "x<", "<|", "é ", '"', "}"]), max_size=40),
    st.sampled_from([8, 1024]),
    st.lists(st.sampled_from(["functions", ".read", "_file", ":0", " ", "x" * 100, "<", "<|"]), max_size=6),
)
@example(["a", *["  "] * 6, "b"], 8, [])  # (whitespace held past the cap: `feed` releases it)
@example([], 8, ["functions.read_file:0", "x" * 100, "x" * 100, "x" * 100])  # (a header past MAX_HEADER: released as text)
def test_steady_pieces_are_what_feed_makes_of_them(pieces, cap, header):
    """A lane offers a call's arguments and header to `steady_piece` before `feed` (chat.py's
    `ArgsLane`): what it makes of each piece (held whitespace, a `<` that may begin a marker, the
    cap on held whitespace, a header grown too long included) is exactly what `feed` would have
    made, and the call begins and ends the same."""
    opening = [f"{SECTION_BEGIN}{CALL_BEGIN}", *(header or ["functions.read_file:0"]), ARG_BEGIN, '{"path": "']
    closing = ['"}', CALL_END, SECTION_END]
    outs = []
    for steady in (False, True):
        lexer = KimiLexer(KimiCallNamer(CallScope(context(TOOLS), RewriteStats())), max_held=cap)
        outs.append(_through_feed_or_steady(lexer, [*opening, *pieces, *closing], steady))
    (fed, _), (offered, taken) = outs
    assert offered == fed
    # (Each taken where no `<` leaves anything for `feed`: the header's pieces while it is short
    # enough; the arguments' after the first when the header names the tool.)
    if not any("<" in piece for piece in header) and len("".join(header)) <= 256:
        assert set(range(1, 1 + len(header))) <= set(taken)
    if cap > 100 and not header and not any("<" in piece for piece in pieces):
        args_at = len(opening)
        assert set(range(args_at, args_at + len(pieces))) <= set(taken)


def _state(lexer: KimiLexer) -> dict:
    return {name: (list(value) if isinstance(value, list) else value) for name, value in vars(lexer).items()}


@given(
    st.lists(st.sampled_from(["a", "bc", " ", "d ", " e", "\n", "\u3000", "x<", "<|", "é", "é ", '"', "}"]), max_size=20),
    st.lists(st.text(st.characters(codec="utf-8"), min_size=1, max_size=6), min_size=1, max_size=20),
    st.booleans(),
)
def test_the_verbatim_state_makes_a_text_into_itself(before, texts, live):
    """`Lexer.steady_piece`'s verbatim state, as the lanes rely on it (`verbatim_stop`): once
    `steady_piece` made arguments of a text that ends in no whitespace, any text that is not
    empty, holds no `<` and ends in no whitespace is made into itself, the lexer unchanged."""
    lexer = KimiLexer(KimiCallNamer(CallScope(context(TOOLS), RewriteStats())))
    assert KimiLexer.verbatim_stop == "<"
    verbatim = False
    for piece in [f"{SECTION_BEGIN}{CALL_BEGIN}", "functions.read_file:0", ARG_BEGIN, '{"path": "', *before, *texts]:
        qualifies = "<" not in piece and not piece[-1].isspace()
        if verbatim and qualifies:
            state = _state(lexer)
            assert lexer.steady_piece(piece, live) is piece
            assert _state(lexer) == state
            continue
        made = lexer.steady_piece(piece, live)
        if made is None:
            lexer.feed(piece)
            verbatim = False
        else:
            verbatim = made != "" and not piece[-1].isspace()


@given(
    st.lists(
        st.sampled_from([
            SECTION_BEGIN, CALL_BEGIN, ARG_BEGIN, CALL_END, SECTION_END, "<|tool_calls_section_end|", "<|tool_arguments_begin|>",
            "functions.bash:0", "functions.exec:1", '{"command": "ls"}', " ", "\n", "prose ", "<", "<|tool_call", "_end|>", ">", "</think>",
        ]),
        max_size=30,
    ),
    st.booleans(),
)
@example([SECTION_BEGIN, CALL_BEGIN, "functions.bash:0", ARG_BEGIN, '{"command": "ls"}', "<|tool_calls_section_end|", ">", "prose "], False)
def test_kimi_feed_reads_as_the_generic_feed(pieces, reasoning):
    """`KimiLexer.feed` takes its commonest pieces itself (text with no `<`, a whole marker with
    nothing unread before it) where the generic `feed` searches the text: segment for segment,
    idle for idle, the same (a truncated marker's spelling is held as the beginning of a longer
    one, as `find_marker` holds it)."""
    lexers = [KimiLexer(KimiCallNamer(CallScope(context(TOOLS), RewriteStats())), reasoning=reasoning) for _ in range(2)]
    outs: list[list] = [[], []]
    for piece in pieces:
        outs[0] += lexers[0].feed(piece)
        outs[1] += Reporting.feed(lexers[1], piece)
        assert lexers[0].idle == lexers[1].idle
    fast, generic = (out + lexer.finish() for out, lexer in zip(outs, lexers))
    assert fast == generic


def test_a_steady_piece_is_refused_where_feed_must_read_it():
    """Outside a call's arguments, before any arguments, and where arguments may not be made
    (`live` off): no piece is taken, and the lexer is left as it was."""
    lexer = KimiLexer(KimiCallNamer(CallScope(context(TOOLS), RewriteStats())))
    assert lexer.steady_piece("prose", True) is None  # (text)
    lexer.feed(SECTION_BEGIN)
    assert lexer.steady_piece("stray", True) is None  # (text inside a section, between calls: shown)
    lexer.feed(f"{SECTION_BEGIN}{CALL_BEGIN}functions.read_file:0{ARG_BEGIN}")
    assert lexer.steady_piece('{"path"', True) is None  # (no arguments sent yet: the call's first piece is read)
    lexer.feed('{"path": "')
    assert lexer.steady_piece("a", False) is None and lexer.steady_piece("a <|", True) is None
    assert lexer.steady_piece("a", True) == "a"
    segments = lexer.feed('"}') + lexer.feed(CALL_END)
    assert [s.text for s in segments if isinstance(s, CallArgs)] == ['"}']
