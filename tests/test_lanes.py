"""The lanes (stream.py) against the full path: the same bytes, lanes on and off.

A lane reads a steady state from an event's bytes alone (plain text while nothing is held, the
arguments or the held text of markup being read) and must answer exactly what the full path
answers. Every recorded flow (flows/), the fuzz targets of the three APIs (tests/test_fuzz.py,
tests/test_core_messages.py) and an every-split sweep of streams made to stay in the lanes go
through the rewriters with the lanes on and off: the bytes sent must be identical (minted ids
are made deterministic for the comparison). A second check counts that the lanes were taken at
all, so that a lane that silently never fires does not pass as equal.
"""

from __future__ import annotations

import copy
import json
import random
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness import PROJECT_ROOT, read_flows
from test_core_messages import hostile_messages
from test_fuzz import MODELS, TOOLS, budget, by_event, chat_case, responses_case, sse_texts, split_at
from toolshim import calls
from toolshim import chat as chat_module
from toolshim.apis import CHAT, MESSAGES, RESPONSES, api_of
from toolshim.chat import ChatStreamRewriter
from toolshim.messages import MessagesStreamRewriter
from toolshim.responses import ResponsesStreamRewriter
from toolshim.tools import RequestContext

FLOW_FILES = sorted((PROJECT_ROOT / "flows").glob("*.flow"))
REWRITERS = {CHAT: ChatStreamRewriter, RESPONSES: ResponsesStreamRewriter, MESSAGES: MessagesStreamRewriter}


class CountingSecrets:
    """`secrets` for `calls.random_id`: the same ids in every run (reset per run)."""

    def __init__(self) -> None:
        self._rng = random.Random(0)

    def token_bytes(self, count: int) -> bytes:
        return self._rng.randbytes(count)


def rewrite(api: str, context: RequestContext, pieces: list[bytes], lanes: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, object]:
    monkeypatch.setattr(calls, "secrets", CountingSecrets())
    monkeypatch.setattr(calls, "_ID_CHARACTERS", calls.IdCharacters())  # (none read ahead by an earlier run)
    rewriter = REWRITERS[api](copy.deepcopy(context))
    rewriter.lanes = lanes
    out: list[bytes] = []
    for piece in pieces:
        sent = rewriter.feed(piece)
        assert b"" not in sent
        out += sent
    out += rewriter.close()
    return b"".join(out), rewriter


def check(api: str, context: RequestContext, body: bytes, cuts: list[list[bytes]], monkeypatch: pytest.MonkeyPatch) -> bytes:
    """The body through the full path whole, and through the lanes in each of `cuts`, whole
    and in reads of eight events: the same bytes, the same failure (none, unless the full path
    has one too), the same verdict of the echo check (does the client assemble otherwise?)."""
    reference, full = rewrite(api, context, [body], False, monkeypatch)
    events = by_event(body)
    bursts = [b"".join(events[at : at + 8]) for at in range(0, len(events), 8)]  # several events a read
    for pieces in [*cuts, [body], bursts]:
        off, unlaned = rewrite(api, context, pieces, False, monkeypatch)
        on, laned = rewrite(api, context, pieces, True, monkeypatch)
        assert on == off == reference, (api, [len(p) for p in pieces][:20])
        assert (laned.failure is None) is (full.failure is None)
        assert laned.changed is unlaned.changed, (api, [len(p) for p in pieces][:20])
    return reference


# -- recorded flows ------------------------------------------------------------------------------


def recorded_streams():
    for path in FLOW_FILES:
        for n, flow in enumerate(read_flows(path)):
            api = api_of(flow)
            if api is None or flow.response is None or "event-stream" not in flow.response.headers.get("content-type", ""):
                continue
            yield pytest.param(api, flow.request.content, flow.response.content, id=f"{path.name.removesuffix('.flow')}#{n}")


def contexts(request_body: bytes) -> list[RequestContext]:
    """The request's context, and the same with the options that change the stream's rules."""
    plain = RequestContext.from_body(request_body)
    error_chunk = copy.deepcopy(plain)
    error_chunk.parse_error_chunk = True
    content_field = copy.deepcopy(plain)
    content_field.reasoning_field = "reasoning"
    return [plain, error_chunk, content_field]


def event_cuts(body: bytes, seed: int) -> list[list[bytes]]:
    """One event a read; two; each event cut once (at a random byte); random splits."""
    events = by_event(body)
    rng = random.Random(seed)
    halves = []
    for event in events:
        at = rng.randint(1, max(1, len(event) - 1))
        halves += [event[:at], event[at:]] if len(event) > 1 else [event]
    pairs = [b"".join(events[i : i + 2]) for i in range(0, len(events), 2)]
    randoms = [split_at(body, [rng.randint(0, len(body)) for _ in range(rng.randint(1, 40))]) for _ in range(4)]
    return [events, pairs, halves, *randoms]


@pytest.mark.parametrize(("api", "request_body", "body"), list(recorded_streams()))
def test_every_recorded_stream_is_the_same_through_the_lanes(api, request_body, body, monkeypatch):
    for context in contexts(request_body):
        check(api, context, body, event_cuts(body, len(body)), monkeypatch)


# -- the fuzz targets ------------------------------------------------------------------------------


@budget(120)
@given(chat_case())
def test_fuzz_chat_lanes(case):
    with pytest.MonkeyPatch.context() as monkeypatch:
        check(CHAT, case["context"], case["body"], [case["pieces"], by_event(case["body"])], monkeypatch)


@budget(120)
@given(responses_case())
def test_fuzz_responses_lanes(case):
    with pytest.MonkeyPatch.context() as monkeypatch:
        check(RESPONSES, case["context"], case["body"], [case["pieces"], by_event(case["body"])], monkeypatch)


@budget(100)
@given(hostile_messages(), st.lists(st.integers(1, 5000), max_size=10), st.sampled_from(["kimi-k2", "MiniMax-M2", "qwen3", "llama-3"]))
def test_fuzz_messages_lanes(body, cuts, model):
    context = RequestContext.from_request({"model": model, "tools": [{"name": "Bash", "input_schema": {"type": "object"}}]})
    with pytest.MonkeyPatch.context() as monkeypatch:
        check(MESSAGES, context, body, [split_at(body, [c % len(body) for c in cuts]), by_event(body)], monkeypatch)


@budget(80)
@given(
    st.sampled_from([CHAT, RESPONSES, MESSAGES]),
    st.lists(st.binary(max_size=40) | sse_texts.map(str.encode), max_size=8).map(b"".join),
    st.lists(st.integers(0, 400), max_size=20),
    st.sampled_from(MODELS),
)
def test_fuzz_hostile_bytes_lanes(api, body, cuts, model):
    context = RequestContext(tools=dict(TOOLS), model=model)
    with pytest.MonkeyPatch.context() as monkeypatch:
        check(api, context, body, [split_at(body, cuts), by_event(body)], monkeypatch)


# Pieces of a few characters, one event each: marker starts held and released, runs of prose long
# enough for the quiet frame, closers and section markers cut anywhere.
_SMALL_PIECES = st.sampled_from([
    "<", "<", "l", "a", " ", "\n", "x y", "</", "think>", "</think>", "<think>", "<|", "tool_calls_section_begin|>",
    "<|tool_calls_section_begin|>", "<|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>", '{"command": "ls"}',
    "<|tool_call_end|>", "<|tool_calls_section_end|>", "<tool_call>", '{"name": "bash", "arguments": {}}', "</tool_call>",
])  # fmt: skip


@budget(100)
@given(
    st.sampled_from(["kimi-k2.5", "moonshotai/Kimi-K2.5", "deepseek-r1", "Qwen3-30B-A3B-Thinking", "QwQ-32B", "qwen3-coder-30b"]),
    st.sampled_from([("content",), ("reasoning_content",), ("reasoning", "reasoning_content"), "text", "thinking"]),
    st.lists(_SMALL_PIECES, min_size=1, max_size=30),
)
def test_fuzz_small_pieces_one_event_a_read(model, fields, pieces):
    """Chat (a text field, or the mirrored pair) and Messages (a text or a thinking block)."""
    from anthropic_stream import block_events, stream

    if isinstance(fields, str):
        api, context = MESSAGES, messages_context(model)
        events = by_event(stream(model, block_events(0, fields, pieces)))
    else:
        api, context = CHAT, RequestContext.from_body(json.dumps({"model": model, "tools": [BASH_CHAT], "stream": True}).encode())
        events = [chat_chunk(model, dict.fromkeys(fields, piece)) for piece in pieces] + [chat_chunk(model, {}, "stop"), b"data: [DONE]\n\n"]
    with pytest.MonkeyPatch.context() as monkeypatch:
        check(api, context, b"".join(events), [events], monkeypatch)


# -- every split of streams that stay in the lanes --------------------------------------------------

BASH_CHAT = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}


def chat_chunk(model: str, delta: dict, finish=None, **extra) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": model,
             "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}], **extra}  # fmt: skip
    return b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n"


def pieces_of(text: str, seed: int) -> list[str]:
    rng, out, at = random.Random(seed), [], 0
    while at < len(text):
        size = rng.randint(1, 4)
        out.append(text[at : at + size])
        at += size
    return out


KIMI_TEXT = (
    "Let me look. <|tool_calls_section_begin|> <|tool_call_begin|> functions.bash:0 <|tool_call_argument_begin|> "
    '{"command": "grep -n \\"a<b\\" é\u3000x  y\\n"} <|tool_call_end|> <|tool_call_begin|> functions.bash:1 '
    '<|tool_call_argument_begin|> {"command": "ls  -la <x>"} <|tool_call_end|> <|tool_calls_section_end|> Done, it is there.'
)
PLAIN_TEXT = 'Plain prose, with "quotes", a [bracket], a tab\tand a "reasoning" aside, \\"escapes\\" and \\\\ too. ' * 3
HERMES_TEXT = 'Checking.\n<tool_call>\n{"name": "bash", "arguments": {"command": "cat a<b \\u003c é"}}\n</tool_call>\nAnd now prose after it, plain.'
# Prose and calls taking turns: the lanes hand over to each other (the text after a call closes,
# the quiet lane taken up again once nothing is held).
KIMI_TURNS = (
    "First some prose here. <|tool_calls_section_begin|><|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>"
    '{"command": "ls"}<|tool_call_end|><|tool_calls_section_end|>/usr/lib is next, and more prose follows it. '
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.bash:1<|tool_call_argument_begin|>"
    '{"command": "pwd"}<|tool_call_end|><|tool_calls_section_end|> Then the end of it all.'
)
# Qwen3-Coder: its blocks pass through Hermes's lexer (the chain's first stage, idle) to the XML
# one; values with a `<`, a `[` and a Hermes tag (which that first stage must read) among plain ones.
XML_TEXT = (
    "Let me see.\n<tool_call>\n<function=bash>\n<parameter=command>\ngrep -n 'a<b' x [y] && ls -la /usr/lib\n</parameter>\n"
    "</function>\n</tool_call>\nNow prose again.\n<tool_call>\n<function=bash>\n<parameter=command>\npwd; echo "
    '<tool_call>{"name": "bash", "arguments": {"command": "id"}}</tool_call> done\n</parameter>\n'
    "</function>\n</tool_call>"
)
HERMES_TURNS = (
    'One.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\ncode path and words after it.\n'
    '<tool_call>\n{"name": "bash", "arguments": {"command": "pwd"}}\n</tool_call>\nMore words, and the end.'
)


def lane_streams() -> list[tuple[str, str, RequestContext, bytes]]:
    """(name, api, context, body): streams whose events mostly take a lane."""
    from anthropic_stream import block_events, stream
    from responses import number_events, responses_events, responses_sse

    streams = []
    for name, model, text, fields, *extra in (
        ("kimi in content", "moonshotai/Kimi-K2.5", KIMI_TEXT, ("content",)),
        ("kimi in mirrored reasoning", "moonshotai/Kimi-K2.5", KIMI_TEXT, ("reasoning", "reasoning_content")),
        ("hermes in content", "Qwen/Qwen2.5-72B-Instruct", HERMES_TEXT, ("content",)),
        ("plain", "some-model", PLAIN_TEXT, ("content",)),
        ("qwen3-coder xml in content", "Qwen/Qwen3-Coder-480B-A35B-Instruct", XML_TEXT, ("content",)),
        ("kimi: prose and calls in turn", "moonshotai/Kimi-K2.5", KIMI_TURNS, ("content",)),
        ("hermes: prose and blocks in turn", "Qwen/Qwen2.5-72B-Instruct", HERMES_TURNS, ("content",)),
        # (vLLM's continuous usage stats without numbers: `"usage": null` in every chunk, rendered too)
        ("kimi: prose and calls in turn, usage in each chunk", "moonshotai/Kimi-K2.5", KIMI_TURNS, ("content",), {"usage": None}),
        ("hermes: prose and blocks in turn, usage in each chunk", "Qwen/Qwen2.5-72B-Instruct", HERMES_TURNS, ("content",), {"usage": None}),
        # (The role in every delta, as some servers send it: the full path sends it in a chunk of
        # its own before each piece of arguments, so the lane sends two events for one.)
        ("kimi, the role in every delta", "moonshotai/Kimi-K2.5", KIMI_TEXT, ("content",), {}, {"role": "assistant"}),
    ):
        context = RequestContext.from_body(json.dumps({"model": model, "tools": [BASH_CHAT], "stream": True}).encode())
        chunk_extra, delta_extra = (*extra, {}, {})[:2]
        events = [chat_chunk(model, {"role": "assistant", "content": ""})]
        events += [chat_chunk(model, {**delta_extra, **{key: piece for key in fields}}, **chunk_extra) for piece in pieces_of(text, 1)]
        events.append(chat_chunk(model, {}, "stop", usage=None))
        events.append(b"data: [DONE]\n\n")
        streams.append((name, CHAT, context, b"".join(events)))
    bash = {"type": "function", "name": "bash", "parameters": BASH_CHAT["function"]["parameters"]}
    for name, model, text in (
        ("responses: kimi", "moonshotai/Kimi-K2.5", KIMI_TEXT),
        ("responses: hermes", "Qwen/Qwen2.5-72B-Instruct", HERMES_TEXT),
        ("responses: plain", "some-model", PLAIN_TEXT),
    ):
        context = RequestContext.from_body(json.dumps({"model": model, "input": "hi", "tools": [bash], "stream": True}).encode())
        body = responses_sse(number_events(responses_events(model, pieces_of(text, 2), tools=[bash])))
        streams.append((name, RESPONSES, context, body))
    for name, model, kind, text in (
        ("messages: kimi in thinking", "moonshotai/Kimi-K2.5", "thinking", KIMI_TEXT),
        ("messages: hermes in text", "Qwen/Qwen2.5-72B-Instruct", "text", HERMES_TEXT),
        ("messages: plain", "some-model", "text", PLAIN_TEXT),
    ):
        context = RequestContext.from_request({"model": model, "tools": [{"name": "bash", "input_schema": BASH_CHAT["function"]["parameters"]}]})
        streams.append((name, MESSAGES, context, stream(model, block_events(0, kind, pieces_of(text, 3)))))
    return streams


STRING_BODY = re.compile(rb'"(?:content|reasoning|reasoning_content|delta|text|thinking)":"((?:[^"\\]|\\.)*)"')


def cut_points(event: bytes, every: bool) -> list[int]:
    """Where to cut an event: every byte from three before its text's string to three after,
    its first and last bytes (the blank line), and (`every`) every 17th byte of the rest."""
    points = {1, 2, len(event) - 2, len(event) - 1}
    found = STRING_BODY.search(event)
    if found is not None:
        points |= set(range(found.start(1) - 3, found.end(1) + 4))
    if every:
        points |= set(range(3, len(event), 17))
    return sorted(at for at in points if 0 < at < len(event))


@pytest.mark.parametrize(("name", "api", "context", "body"), lane_streams(), ids=lambda v: v if isinstance(v, str) else "")
def test_the_gate_is_never_stale_after_a_read(name, api, context, body):
    """After every read, one event or eight at a time, the lane `feed` takes straight (`_gate`) is
    the one the rewriter's state allows now (`_open_gate` worked out again gives the same): a read
    that armed a lane, or left the echo check waiting, opened or closed the gate itself. (A stale
    gate costs the next read the framed path; the checked lane's own re-opening is held by this.)"""
    events = by_event(body)
    for size in (1, 8):
        rewriter = REWRITERS[api](copy.deepcopy(context))
        for at in range(0, len(events), size):
            rewriter.feed(b"".join(events[at : at + size]))
            gate = rewriter._gate
            rewriter._open_gate()
            assert rewriter._gate is gate, (size, at, gate, rewriter._gate)


@pytest.mark.parametrize(("name", "api", "context", "body"), lane_streams(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_split_through_the_lanes(name, api, context, body, monkeypatch):
    """One event a read, but one event cut in two, at each byte in turn: the lanes meet reads
    that hold part of an event, then whole events. Every byte around each event's text is a cut
    (the lanes read that string alone), the rest of every fourth event every few bytes (it is
    the same JSON in every event)."""
    reference, _ = rewrite(api, context, [body], False, monkeypatch)
    events = by_event(body)
    for i, event in enumerate(events):
        for at in cut_points(event, i % 4 == 0):
            pieces = [*events[:i], event[:at], event[at:], *events[i + 1 :]]
            on, _ = rewrite(api, context, pieces, True, monkeypatch)
            assert on == reference, (name, i, at)


def test_the_lanes_are_taken(monkeypatch):
    """The lanes fire on the streams made for them (equal bytes alone would not tell): most
    events are not parsed at all."""
    from toolshim import chat, sse

    parsed = {"events": 0}

    def counting(original):
        def parse_block(raw):
            parsed["events"] += 1
            return original(raw)

        return parse_block

    monkeypatch.setattr(chat, "parse_block", counting(chat.parse_block))
    monkeypatch.setattr(sse, "parse_block", counting(sse.parse_block))
    for name, api, context, body in lane_streams():
        if "the role in every delta" in name:
            # (The lanes take its events, but the echo check reads those before its first call
            # into what a client assembles: the role goes out in a chunk of its own, which
            # changes the bytes, not what is assembled, until the call does.)
            continue
        parsed["events"] = 0
        events = by_event(body)
        rewrite(api, context, events, True, monkeypatch)
        assert parsed["events"] < len(events) / 2, (name, parsed, len(events))


def test_a_rewriter_in_a_lane_is_freed_by_reference_counting():
    """No rewriter holds itself (a lane taken from `feed` is a function called with it): freed
    when its flow lets go of it, not at the garbage collector's next full collection."""
    import gc
    import weakref

    enabled = gc.isenabled()
    gc.disable()
    try:
        for name, api, context, body in lane_streams():
            rewriter = REWRITERS[api](copy.deepcopy(context))
            for event in by_event(body):
                rewriter.feed(event)
            rewriter.close()
            ref = weakref.ref(rewriter)
            del rewriter
            assert ref() is None, name
    finally:
        if enabled:
            gc.enable()


def test_prose_after_a_call_takes_the_quiet_lane_again(monkeypatch):
    """Once a call closed and nothing is held, the plain text that follows is taken by the
    quiet lane straight from `feed` (the lane learned before the call is taken up again), and
    the text that closed it leaves as it came: none of it is framed."""
    read: list[bytes] = []

    def framed(self, data, *args, original=ChatStreamRewriter._framed):
        read.append(data)
        return original(self, data, *args)

    monkeypatch.setattr(ChatStreamRewriter, "_framed", framed)
    for name, api, context, body in lane_streams():
        if "in turn" not in name:
            continue
        events = by_event(body)
        read.clear()
        rewrite(api, context, events, True, monkeypatch)
        texts = [json.loads(event[6:])["choices"][0]["delta"]["content"] for event in events[1:-2]]  # role, finish, [DONE] aside
        whole = "".join(texts)
        closes = max(whole.rfind("<|tool_calls_section_end|>") + 26, whole.rfind("</tool_call>") + 12)
        closed = next(i for i in range(len(texts)) if len("".join(texts[: i + 1])) >= closes) + 1
        after = events[closed + 2 : -2]  # the prose after the last call, but its first event
        assert len(after) > 5, name
        assert not any(event in read for event in after), (name, [e for e in after if e in read])


# A Kimi call's arguments in pieces: ending in whitespace (a Unicode one among them), with a `<`,
# an escape, a non-ASCII letter, and runs of plain ones between.
VERBATIM_ARGS = ['{"', "comm", 'and"', ":", ' "', "grep", " -n", " 'a", "<b'", " src", "/ ", "x", "y", "z  ", "\\n", "é", "\u3000", "wc", "-l", "|", "so", "rt", '"}']


def verbatim_stream(api: str, fields: tuple[str, ...] | str) -> tuple[RequestContext, bytes]:
    from anthropic_stream import block_events, stream
    from responses import number_events, responses_events, responses_sse

    model = "moonshotai/Kimi-K2.5"
    texts = ["Looking.", "<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions.bash:0", "<|tool_call_argument_begin|>",
             *VERBATIM_ARGS, "<|tool_call_end|>", "<|tool_calls_section_end|>", "Done."]  # fmt: skip
    if api == CHAT:
        events = [chat_chunk(model, dict.fromkeys(fields, text)) for text in texts] + [chat_chunk(model, {}, "stop"), b"data: [DONE]\n\n"]
        return RequestContext.from_body(json.dumps({"model": model, "tools": [BASH_CHAT], "stream": True}).encode()), b"".join(events)
    if api == RESPONSES:
        bash = {"type": "function", "name": "bash", "parameters": BASH_CHAT["function"]["parameters"]}
        context = RequestContext.from_body(json.dumps({"model": model, "input": "hi", "tools": [bash], "stream": True}).encode())
        return context, responses_sse(number_events(responses_events(model, texts, tools=[bash])))
    context = RequestContext.from_request({"model": model, "tools": [{"name": "bash", "input_schema": BASH_CHAT["function"]["parameters"]}]})
    return context, stream(model, block_events(0, fields, texts))


@pytest.mark.parametrize(
    ("api", "fields"), [(CHAT, ("content",)), (CHAT, ("reasoning", "reasoning_content")), (RESPONSES, ""), (MESSAGES, "thinking"), (MESSAGES, "text")]
)
def test_kimi_arguments_in_the_verbatim_state_take_no_steady_call(api, fields, monkeypatch):
    """Once the Kimi lexer made arguments of a piece that ends in no whitespace, a lane takes
    the next such piece without a marker's `<` as it is (`Lexer.steady_piece`'s verbatim
    state), without the call: `steady_piece` is not asked of a piece of arguments that follows
    such a piece and is one itself (past the arguments' first two: the lane is armed after the
    first), and is asked of the others a lane reads; the bytes are the full path's, one event
    a read and in reads of several."""
    from toolshim.lexers.kimi import KimiLexer

    asked: list[str] = []

    def steady_piece(self, text, live, original=KimiLexer.steady_piece):
        asked.append(text)
        return original(self, text, live)

    monkeypatch.setattr(KimiLexer, "steady_piece", steady_piece)
    plain = [not (piece[-1].isspace() or "<" in piece) for piece in VERBATIM_ARGS]
    verbatim = {piece for n, piece in enumerate(VERBATIM_ARGS) if n > 1 and plain[n] and plain[n - 1]}
    assert len(verbatim) >= 8 and len(verbatim) < len(VERBATIM_ARGS) - 8
    context, body = verbatim_stream(api, fields)
    rewrite(api, context, by_event(body), True, monkeypatch)
    assert not verbatim & set(asked), sorted(verbatim & set(asked))
    assert {piece for n, piece in enumerate(VERBATIM_ARGS) if n > 1 and not plain[n]} <= set(asked)
    asked.clear()
    check(api, context, body, [by_event(body)], monkeypatch)  # (the full path's bytes, the lanes on and off)


def test_a_quiet_frame_with_a_finish_reason_is_not_taken_up_after_a_call(monkeypatch):
    """A quiet lane learned from events that carry `"finish_reason":"stop"` (odd, but seen) is
    not taken up again after a call: such an event must then be read (`stop` becomes
    `tool_calls`). Lanes on and off: the same bytes, and the last event says tool_calls."""
    model = "Qwen/Qwen2.5-72B-Instruct"
    context = RequestContext.from_body(json.dumps({"model": model, "tools": [BASH_CHAT], "stream": True}).encode())
    events = [chat_chunk(model, {"role": "assistant", "content": ""})]
    events += [chat_chunk(model, {"content": piece}, "stop") for piece in ["Hi", " there", " all", " of", " you", " now"]]
    events += [chat_chunk(model, {"content": piece}) for piece in pieces_of('\n<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>\n', 4)]
    events += [chat_chunk(model, {"content": piece}, "stop") for piece in ["Done", " and", " done", " again"]]
    events.append(b"data: [DONE]\n\n")
    body = b"".join(events)
    reference = check(CHAT, context, body, [events], monkeypatch)
    finishes = re.findall(rb'"finish_reason":"(\w+)"', reference)
    assert finishes[-1] == b"tool_calls" and b"stop" not in finishes[-4:], finishes


@given(st.lists(st.sampled_from([b"\\", b"u", b"003", b"0", b"3c", b"a", b'"']), max_size=60))
def test_escaped_markup_is_found_as_a_search_finds_it(pieces):
    """The backslashes looked at one by one, then the escape searched for: the same answer as a
    search for `\\u003`, with few backslashes or many."""
    from toolshim.stream import _escaped_markup

    raw = b"".join(pieces)
    assert _escaped_markup(raw) is (raw.find(b"\\u003") >= 0)


def test_an_escape_is_looked_for_only_where_a_backslash_is(monkeypatch):
    """`markup_may_start` asks `_escaped_markup` only of bytes that hold a backslash (a call
    fewer on the commonest read), and answers as before: an escaped `<` may begin a marker."""
    from toolshim import stream

    asked = []
    look = stream._escaped_markup
    monkeypatch.setattr(stream, "_escaped_markup", lambda raw: asked.append(raw) or look(raw))
    assert not stream.markup_may_start(b'{"content":"plain words"}') and asked == []
    assert stream.markup_may_start(b'{"content":"a \\u003ctool_call>"}') and len(asked) == 1
    assert not stream.markup_may_start(b'{"content":"a \\"quote\\""}') and len(asked) == 2


def test_quoted_prose_takes_the_quiet_lane(monkeypatch):
    """A text whose JSON string holds escaped quotes (about one token in thirty of prose) leaves
    the quiet frame whole: its events pass in the lane, unframed. Not one that holds
    `"reasoning` while no reasoning field was seen (the full path looks for that name in the
    raw bytes), nor an unescaped quote (a different JSON). Lanes on and off: the same bytes."""
    taken: list[bytes] = []

    def counted_lane(frame, echo, refuse=None, original=chat_module.quiet_lane):
        lane = original(frame, echo, refuse)

        def counted(rewriter, data):
            out = lane(rewriter, data)
            if out is not None:
                taken.append(data)
            return out

        counted.waits_for = lane.waits_for
        return counted

    monkeypatch.setattr(chat_module, "quiet_lane", counted_lane)
    model = "some-model"
    context = RequestContext.from_body(json.dumps({"model": model, "stream": True}).encode())
    # (each round's pieces their own: events are told apart by their bytes)
    pieces = [f"{piece}{n}" for n in range(4) for piece in ("Say", ' "hi"', " and", ' \\"', " then", ' "reasoning"', " \\\\", ' q"', " end")]
    events = [chat_chunk(model, {"role": "assistant", "content": ""}), *[chat_chunk(model, {"content": piece}) for piece in pieces]]
    events.append(b"data: [DONE]\n\n")
    rewrite(CHAT, context, events, True, monkeypatch)
    not_taken = [json.loads(event[6:])["choices"][0]["delta"].get("content") for event in events[:-1] if event not in taken]
    # (the first events, passed by the fast path, teach the lane its frame)
    assert not_taken == ["", "Say0", *[f' "reasoning"{n}' for n in range(4)]], not_taken
    # An unescaped quote in the string's place is another JSON: not the lane's.
    rewriter = REWRITERS[CHAT](copy.deepcopy(context))
    for event in events[:20]:
        rewriter.feed(event)
    quiet = rewriter._quiet_frame
    odd = quiet.head + b'x","content":"y' + quiet.tail
    taken.clear()
    assert rewriter.feed(odd) == [odd] and taken == []
    check(CHAT, context, b"".join(events), [events], monkeypatch)


def test_an_empty_block_in_a_read_of_several_events(monkeypatch):
    """A blank line more between events (`\\n\\n\\n`: an empty block) inside reads of several
    events, while the lanes take them: the event after it begins with a line end, which no lane
    takes (the framer reads it). Lanes on and off: the same bytes, and the lanes were taken."""
    taken = {"events": 0}

    def counting(self, raw, original=ChatStreamRewriter._args_read):
        out = original(self, raw)
        taken["events"] += out is not None
        return out

    monkeypatch.setattr(ChatStreamRewriter, "_args_read", counting)
    for name, api, context, body in lane_streams():
        if api != CHAT or not name.startswith("kimi"):
            continue
        events = by_event(body)
        events = [event + b"\n" if i % 5 == 3 else event for i, event in enumerate(events)]
        reads = [b"".join(events[at : at + 8]) for at in range(0, len(events), 8)]
        taken["events"] = 0
        check(api, context, b"".join(events), [reads], monkeypatch)
        assert taken["events"] > len(events) / 4, (name, taken)


@pytest.mark.parametrize("burst", [False, True])
def test_a_lane_that_raises_fails_open(burst, monkeypatch):
    """A lane that raises on an event (a bug of ours): that event goes as it came, the failure is
    kept, and the rest of the stream passes unchanged, whether the event came alone or in a read
    of several."""
    [(name, api, context, body)] = [s for s in lane_streams() if s[0] == "kimi in content"]
    events = by_event(body)
    rewriter = REWRITERS[api](copy.deepcopy(context))
    out: list[bytes] = []
    for event in events[:40]:
        out += rewriter.feed(event)
    assert rewriter._gate is not None, "the stream is in a lane by then"

    def raising(_rewriter, data):
        if data.count(b"\n\n") > 1:
            return None  # a lane takes no read of several: `feed` cuts it into events
        raise RuntimeError("lane bug")

    rewriter._direct = raising
    rest = events[40:]
    reads = [b"".join(rest[at : at + 8]) for at in range(0, len(rest), 8)] if burst else rest
    sent: list[bytes] = []
    for read in reads:
        sent += rewriter.feed(read)
    sent += rewriter.close()
    assert isinstance(rewriter.failure, RuntimeError)
    assert b"".join(sent) == b"".join(rest)


# -- Messages: a block's lexer made when a delta needs one -----------------------------------------


def messages_context(model: str) -> RequestContext:
    return RequestContext.from_request({"model": model, "tools": [{"name": "bash", "input_schema": BASH_CHAT["function"]["parameters"]}]})


def test_a_plain_messages_block_makes_no_lexer(monkeypatch):
    """With the lanes on, a text or thinking block whose deltas hold no markup never makes its
    lexer (an unknown model's is a chain of every dialect); with them off, each block makes one.
    The bytes are the same (`check`)."""
    from anthropic_stream import block_events, stream

    from toolshim.lexers import ScopeLexers

    made = {"lexers": 0}
    original = ScopeLexers.new_lexer

    def counting(self, **options):
        made["lexers"] += 1
        return original(self, **options)

    monkeypatch.setattr(ScopeLexers, "new_lexer", counting)
    prose = 'Plain prose, with "quotes", a tab\tand \\"escapes\\" too, no bracket. ' * 3
    body = stream("some-model", block_events(0, "thinking", pieces_of("Thinking it over, plainly.", 4)), block_events(1, "text", pieces_of(prose, 5)))
    context = messages_context("some-model")
    for lanes, lexers in ((True, 0), (False, 2)):
        for pieces in (by_event(body), [body]):
            made["lexers"] = 0
            rewrite(MESSAGES, context, pieces, lanes, monkeypatch)
            assert made["lexers"] == lexers, (lanes, len(pieces))
    check(MESSAGES, context, body, event_cuts(body, 4), monkeypatch)


@pytest.mark.parametrize(
    "pieces",
    [
        ["  ", "\n", "<think>", "a thought", "</think>", "The answer."],  # whitespace first: the start is still open
        ["Hello", " <think>", "not a thought", "</think>", " after."],  # text first: no reasoning block can open
        ["Hello", " there", " [TOOL_CALLS]", '[{"name": "bash", "arguments": {"command": "ls"}}]'],
        ["Hi", " first.", " <tool_call>", '\n{"name": "bash", "arguments": {"command": "pwd"}}\n', "</tool_call>", " end"],
    ],
)
def test_a_messages_block_made_late_reads_as_one_made_at_its_start(pieces, monkeypatch):
    """Text that went as it came with no lexer made, then markup: the lexer made then reads the
    rest as one made at the block's start would (the lanes off), in every cut and in bursts."""
    from anthropic_stream import block_events, stream

    model = "Qwen/Qwen3-32B"  # (a `<think>` family, and `<tool_call>`)
    for text_pieces in (pieces, [piece for text in pieces for piece in pieces_of(text, 6)]):
        body = stream(model, block_events(0, "text", text_pieces))
        check(MESSAGES, messages_context(model), body, event_cuts(body, 5), monkeypatch)


MINIMAX_CALL = '<minimax:tool_call>\n<invoke name="bash">\n<parameter name="command">ls -la</parameter>\n</invoke>\n</minimax:tool_call>\n'
MESSAGES_PROSE = 'Plain prose with "quotes", a [bracket], a back\\slash, a tab\tand a café, 中文 and 😀 emoji; then more words. '


def test_messages_prose_after_a_call_goes_out_renumbered_without_the_lexer(monkeypatch):
    """Text after a call goes to a block of ours (a new index), so no quiet lane passes it: the
    block lane renumbers it, and text in which no marker can start does not go through the
    (idle) lexer. Only the first delta after the call is read."""
    from anthropic_stream import block_events, stream

    model = "MiniMax-M2"
    after = pieces_of(MESSAGES_PROSE, 7)
    body = stream(model, block_events(0, "text", [*pieces_of(MESSAGES_PROSE, 5), *pieces_of(MINIMAX_CALL, 6), *after]))
    rewriter = MessagesStreamRewriter(messages_context(model))
    prose_after_call, read_after_call = prose_read_after_a_call(rewriter, by_event(body), b'"index":2,"delta":{"type":"text_delta"', b'"type":"tool_use"', monkeypatch)
    assert rewriter.stats.calls == 1 and prose_after_call == len(after)
    # the first, and those where a marker may start (`text_may_start_markup`: `[b` here)
    assert read_after_call == 1 + sum("[" in piece or "<" in piece for piece in after[1:]) == 2


def prose_read_after_a_call(rewriter, events: list[bytes], prose: bytes, call_made: bytes, monkeypatch) -> tuple[int, int]:
    """Each of `events` fed alone: how many outputs after the one holding `call_made` hold
    `prose` (a delta of text), and for how many of those a lexer was fed."""
    from toolshim.lexers import base, engine, think, tokens

    fed: list[str] = []
    for module in (base, engine, think, tokens):
        for cls in vars(module).values():
            if isinstance(cls, type) and "feed" in vars(cls):
                monkeypatch.setattr(cls, "feed", counted(vars(cls)["feed"], fed))
    after_call = False
    prose_count = read = 0
    for event in events:
        fed.clear()
        out = b"".join(rewriter.feed(event))
        if after_call and prose in out:
            prose_count += 1
            read += bool(fed)
        after_call = after_call or call_made in out
    return prose_count, read


def counted(feed, fed: list):
    def counting(self, text):
        fed.append(text)
        return feed(self, text)

    return counting


@pytest.mark.parametrize(("model", "kind", "call", "count"), [("MiniMax-M2", "text", MINIMAX_CALL, 2), ("moonshotai/Kimi-K2.5", "thinking", KIMI_TEXT, 4)])
def test_messages_markup_in_prose_that_went_out_past_the_lexer(model, kind, call, count, monkeypatch):
    """Prose between two calls, the lanes on and off, in every event cut: the second call's
    markup, in text the lane renumbered without the lexer, is read by it."""
    from anthropic_stream import block_events, stream

    pieces = [*pieces_of(MESSAGES_PROSE, 5), *pieces_of(call, 6), *pieces_of(MESSAGES_PROSE, 7), *pieces_of(call, 8), *pieces_of(MESSAGES_PROSE, 9)]
    body = stream(model, block_events(0, kind, pieces))
    reference = check(MESSAGES, messages_context(model), body, event_cuts(body, 5), monkeypatch)
    starts = [json.loads(line[6:]) for line in reference.split(b"\n") if line.startswith(b'data: {"type":"content_block_start"')]
    assert sum(start["content_block"]["type"] == "tool_use" for start in starts) == count  # (KIMI_TEXT holds two)


def test_a_read_of_deltas_of_two_blocks_is_read_when_one_holds_markup(monkeypatch):
    """Two text blocks open at once (upstream interleaves them): block 0 quiet, block 1 inside a
    `<tool_call>`. A read of deltas of both passes unread only if every one is of a quiet block:
    the held call's deltas must reach its lexer (`_nothing_to_read`)."""
    from anthropic_stream import block_events, message_end, message_start, sse

    model = "Qwen/Qwen2.5-72B-Instruct"
    first = block_events(0, "text", pieces_of("Plain words, nothing held, on and on.", 7))
    second = block_events(1, "text", ["Now ", "<tool_call>", *pieces_of('\n{"name": "bash", "arguments": {"command": "ls -la"}}\n', 8), "</tool_call>", " done"])
    starts, deltas = [first[0], second[0]], []
    for a, b in zip(first[1:-1], second[1:-1]):
        deltas += [a, b]
    events = [message_start(model), *starts, *deltas, *first[len(second) - 1 : -1], *second[len(first) - 1 : -1], first[-1], second[-1], *message_end()]
    body = sse(events)
    reference = check(MESSAGES, messages_context(model), body, event_cuts(body, 6), monkeypatch)
    assert b'"type":"tool_use"' in reference and b"<tool_call>" not in reference


def test_a_block_passed_on_by_an_idle_first_stage_is_read_by_the_second_alone(monkeypatch):
    """Qwen3-Coder's `<tool_call><function=…>`: Hermes's lexer, first in the chain, passes the
    block on to the XML lexer and is idle again. The lane feeds the XML lexer alone (text with
    no `<` and no `[` cannot wake the first stage): a value's plain pieces do not go through the
    chain. (The bytes: `test_every_split_through_the_lanes`, "qwen3-coder xml in content".)"""
    from toolshim.lexers.base import ChainLexer

    model = "Qwen/Qwen3-Coder-480B-A35B-Instruct"
    value = "ls -la /usr/lib && echo done; " * 8
    text = f"Here.\n<tool_call>\n<function=bash>\n<parameter=command>\n{value}\n</parameter>\n</function>\n</tool_call>"
    context = RequestContext.from_body(json.dumps({"model": model, "tools": [BASH_CHAT], "stream": True}).encode())
    events = [chat_chunk(model, {"role": "assistant", "content": ""})]
    events += [chat_chunk(model, {"content": piece}) for piece in ["Here.", "\n", "<tool_call>", "\n", "<function=bash>", "\n", "<parameter=command>", "\n"]]
    value_events = [chat_chunk(model, {"content": piece}) for piece in pieces_of(value, 9)]
    events += value_events + [chat_chunk(model, {"content": piece}) for piece in ["\n", "</parameter>", "\n", "</function>", "\n", "</tool_call>"]]
    events += [chat_chunk(model, {}, "stop"), b"data: [DONE]\n\n"]
    fed = {"chains": 0}
    original = ChainLexer.feed

    def counting(self, text):
        fed["chains"] += 1
        return original(self, text)

    monkeypatch.setattr(ChainLexer, "feed", counting)
    reference, _ = rewrite(CHAT, context, [b"".join(events)], False, monkeypatch)
    fed["chains"] = 0
    laned, _ = rewrite(CHAT, context, events, True, monkeypatch)
    assert laned == reference and b'"name":"bash"' in laned and value.strip().encode() in laned.replace(b"\\", b"")
    assert fed["chains"] < len(value_events) / 4, (fed, len(value_events))


def test_a_marker_start_past_an_idle_first_stage_is_read_by_the_chain_in_the_lane(monkeypatch):
    """The same block, a value full of `<` (and a `<tool_call` that never closes): such a piece
    may wake the chain's first stage, so the chain reads it whole, in the lane; the lane goes on
    while the first stage is idle again, and the full path reads no piece of the value."""
    from toolshim.chat import ChatStreamRewriter

    model = "Qwen/Qwen3-Coder-480B-A35B-Instruct"
    value = "if a < b && c <d; then echo '<tool_cal' <x>; fi\n<" * 6
    text_events = ["Here.", "\n", "<tool_call>", "\n", "<function=bash>", "\n", "<parameter=command>", "\n"]
    context = RequestContext.from_body(json.dumps({"model": model, "tools": [BASH_CHAT], "stream": True}).encode())
    events = [chat_chunk(model, {"role": "assistant", "content": ""})] + [chat_chunk(model, {"content": piece}) for piece in text_events]
    value_events = [chat_chunk(model, {"content": piece}) for piece in pieces_of(value, 5)]
    events += value_events + [chat_chunk(model, {"content": piece}) for piece in ["\n", "</parameter>", "\n", "</function>", "\n", "</tool_call>"]]
    events += [chat_chunk(model, {}, "stop"), b"data: [DONE]\n\n"]
    read = {"full": 0}
    original = ChatStreamRewriter._read_block

    def counting(self, *args):
        read["full"] += 1
        return original(self, *args)

    monkeypatch.setattr(ChatStreamRewriter, "_read_block", counting)
    reference, _ = rewrite(CHAT, context, [b"".join(events)], False, monkeypatch)
    read["full"] = 0
    laned, _ = rewrite(CHAT, context, events, True, monkeypatch)
    assert laned == reference and b'"name":"bash"' in laned
    chunks = [json.loads(line[6:]) for line in laned.split(b"\n\n") if line.startswith(b"data: {")]
    arguments = "".join(call["function"].get("arguments", "") for chunk in chunks for call in chunk["choices"][0]["delta"].get("tool_calls", []))
    assert json.loads(arguments)["command"].strip() == value.strip()
    assert sum(piece.count("<") for piece in pieces_of(value, 5)) > 10
    assert read["full"] < 8, read  # the events around the block, not the value's


@pytest.mark.parametrize("tail", [["</think>", "x"], ["</", "think>", "x"], ["<", "<"], ["<", "/think", ">"]])
def test_a_marker_start_read_quietly_while_the_think_lexer_watches(tail, monkeypatch):
    """A Kimi stream (its template may open the think block unasked: the think lexer watches
    for a bare closer, WATCH) whose first `<` armed a lane, then plain prose (the quiet frame),
    then a `<` read by the quiet frame's lexer (`_quiet_markup`): the think lexer still reads it,
    though idle (idle in WATCH passes only text without a `<`). It went to the Kimi lexer past
    it: a bare `</think>` reached the client, and `<`, `<` went out as two chunks, not as one."""
    model = "moonshotai/Kimi-K2.5"
    context = RequestContext.from_body(json.dumps({"model": model, "tools": [BASH_CHAT], "stream": True}).encode())
    pieces = ["<", "l", "a", "t", "l", *tail]
    events = [chat_chunk(model, {"content": piece}) for piece in pieces] + [chat_chunk(model, {}, "stop"), b"data: [DONE]\n\n"]
    markup_read = []
    original = ChatStreamRewriter._quiet_markup

    def counting(self, raw):
        out = original(self, raw)
        markup_read.append(out is not None)
        return out

    monkeypatch.setattr(ChatStreamRewriter, "_quiet_markup", counting)
    reference = check(CHAT, context, b"".join(events), [events], monkeypatch)
    assert any(markup_read)  # the quiet frame's lexer read a `<`: the case is not vacuous
    chunks = [json.loads(line[6:]) for line in reference.split(b"\n\n") if line.startswith(b"data: {")]
    content = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks if chunk["choices"])
    assert content == "".join(pieces).replace("</think>", "")  # the closer dropped, nothing else


def test_an_event_that_only_looks_mirrored_is_read_in_full(monkeypatch):
    """Kimi arguments in mirrored reasoning fields, among them events of the frame's length that
    differ from it after the first string: the second string not the first's, the key between
    them or the chunk's end changed. The lanes take only events the frame holds whole (what a
    lane decodes is the first string): these go the full path's way, byte for byte."""
    model = "moonshotai/Kimi-K2.5"
    keys = ("reasoning", "reasoning_content")
    context = RequestContext.from_body(json.dumps({"model": model, "tools": [BASH_CHAT], "stream": True}).encode())
    arguments = pieces_of(json.dumps({"command": "ls -la and then some more words " * 6}), 4)
    markers = ["<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions.bash:0", "<|tool_call_argument_begin|>"]
    prose = pieces_of("Some words to read before the call, " * 4, 5)
    pieces = [*prose, *markers, *arguments, "<|tool_call_end|>", "<|tool_calls_section_end|>"]
    events = [chat_chunk(model, {"role": "assistant", "content": ""})] + [chat_chunk(model, {key: piece for key in keys}) for piece in pieces]
    for at in range(8, len(prose), 4):  # prose whose second string may begin a marker: the quiet lane's frame
        events[at + 1] = chat_chunk(model, {"reasoning": prose[at], "reasoning_content": "<" + prose[at][1:]})
    odd = 0
    for at in range(len(prose) + len(markers) + 4, len(pieces) - 2, 3):  # (the events between re-arm the lane)
        piece, event = pieces[at], events[at + 1]
        if piece.strip() != piece or len(piece) < 2 or '"' in piece:
            continue  # (a piece the lane sends at once, and no quote to escape)
        kind = odd % 3
        if kind == 0:  # the second string another one of the same length
            events[at + 1] = chat_chunk(model, {"reasoning": piece, "reasoning_content": piece[::-1] if piece[::-1] != piece else "#" * len(piece)})
        elif kind == 1:  # the key between them another one of the same length
            events[at + 1] = event.replace(b'"reasoning_content": ', b'"reasoning_contenu": ')
        else:  # the chunk's end another one of the same length
            events[at + 1] = event.replace(b'"logprobs": null', b'"logprobs": 1234')
        assert len(events[at + 1]) == len(event) and events[at + 1] != event
        odd += 1
    events += [chat_chunk(model, {}, "stop"), b"data: [DONE]\n\n"]
    reference, _ = rewrite(CHAT, context, [b"".join(events)], False, monkeypatch)
    assert odd >= 9 and b'"logprobs":1234' in reference
    for reads in (events, [b"".join(events[at : at + 8]) for at in range(0, len(events), 8)]):
        laned, _ = rewrite(CHAT, context, reads, True, monkeypatch)
        assert laned == reference


# -- runs: a block held whole, its events in a read taken at once ---------------------------------

HERMES_MODEL, CODER_MODEL = "Qwen/Qwen2.5-72B-Instruct", "Qwen/Qwen3-Coder-480B-A35B-Instruct"
HERMES_BLOCK = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la /usr/lib && echo done"}}\n</tool_call>\n'
CODER_BLOCK = "<tool_call>\n<function=bash>\n<parameter=command>\nls -la /usr/lib && echo done\n</parameter>\n</function>\n</tool_call>\n"


def two_blocks(model: str, block: str, second: list[bytes | str] | None = None) -> tuple[RequestContext, list[bytes]]:
    """Prose, a block, prose, a second block (`second`: its pieces, a bytes one an event's data
    as it stands), prose: once the first call is made the echo check has decided, and the lane
    of the second block takes runs (`SseRewriter._lane_runs`)."""
    context = RequestContext.from_body(json.dumps({"model": model, "tools": [BASH_CHAT], "stream": True}).encode())
    pieces = [*pieces_of("Looking first. ", 1), *pieces_of(block, 2), *pieces_of("Then again. ", 3), *(second or pieces_of(block, 4)), *pieces_of("Done.", 5)]
    events = [chat_chunk(model, {"role": "assistant", "content": ""})]
    events += [b"data: " + piece + b"\n\n" if isinstance(piece, bytes) else chat_chunk(model, {"content": piece}) for piece in pieces]
    return context, [*events, chat_chunk(model, {}, "stop"), b"data: [DONE]\n\n"]


@pytest.mark.parametrize(("model", "block", "leaf", "held"), [
    (HERMES_MODEL, HERMES_BLOCK, "JsonCallsLexer", '{"name": "bash", "arguments": {"command": "ls -la /usr/lib && echo done"}}\n'),
    (CODER_MODEL, CODER_BLOCK, "XmlParamsLexer", "ls -la /usr/lib && echo done\n"),
], ids=["hermes", "qwen3-coder xml"])  # fmt: skip
def test_a_held_blocks_events_in_a_read_go_to_the_lexer_at_once(model, block, leaf, held, monkeypatch):
    """In reads of eight, the events of the second block that its lexer holds whole (a JSON
    value, an XML parameter's value) go to it as one text a read (`_args_run`), up to one that
    may begin a tag (a `<`), which it reads alone: wherever the reads' ends fall, that text
    reaches the lexer in a piece for the event that begins it and one a read after that."""
    from toolshim.lexers import engine

    kind = getattr(engine, leaf)
    fed: list[str] = []
    feed = kind.feed
    monkeypatch.setattr(kind, "feed", lambda lexer, text: fed.append(text) or feed(lexer, text))
    context, events = two_blocks(model, block)
    check(CHAT, context, b"".join(events), [events], monkeypatch)
    second_block = pieces_of(block, 4)
    starts = [len("".join(second_block[:n])) for n in range(len(second_block))]
    held_at = block.index(held)
    held_events = sum(1 for start in starts if held_at <= start < held_at + len(held))  # (events that begin in it)
    for shift in range(8):  # (where the reads' ends fall)
        fed.clear()
        reads = [b"".join(events[at : at + 8]) for at in range(shift, len(events), 8)]
        _, rewriter = rewrite(CHAT, context, [b"".join(events[:shift]), *reads] if shift else reads, True, monkeypatch)
        assert rewriter.stats.calls == 2
        second = "".join(fed).rindex(held)  # the second block's held text, where the lexer was fed it
        at = [len("".join(fed[:n])) for n in range(len(fed) + 1)]
        first, last = max(n for n in range(len(fed)) if at[n] <= second), min(n for n in range(len(fed) + 1) if at[n] >= second + len(held))
        # the event it begins in alone, then a piece a read (those it spans)
        assert last - first <= 1 + 1 + -(-held_events // 8) + 1, (shift, held_events, fed[first:last])


@pytest.mark.parametrize(("model", "block"), [(HERMES_MODEL, HERMES_BLOCK), (CODER_MODEL, CODER_BLOCK)], ids=["hermes", "qwen3-coder xml"])
def test_the_quiet_lane_reads_a_markup_event_itself(model, block, monkeypatch):
    """An event of the quiet frame in which a marker may begin (the second block's `<`) is read
    by the quiet lane as the framed path reads it, without the framer's cut (`quiet_lane`'s
    hand-off, `SseRewriter._one_event_framed`): the same bytes as the full path, event by event
    and in reads of eight; in reads of eight the rest of the read goes on to the block's runs."""
    from toolshim import sse

    context, events = two_blocks(model, block)
    check(CHAT, context, b"".join(events), [events], monkeypatch)
    opener = 1 + len(pieces_of("Looking first. ", 1)) + len(pieces_of(block, 2)) + len(pieces_of("Then again. ", 3))
    assert b'"content":"<' in events[opener].replace(b'": "', b'":"')  # (the second block's first event)
    cut: list[bytes] = []
    framer_feed = sse.SseFramer.feed
    monkeypatch.setattr(sse.SseFramer, "feed", lambda framer, data: cut.append(data) or framer_feed(framer, data))
    _, rewriter = rewrite(CHAT, context, events, True, monkeypatch)
    assert rewriter.stats.calls == 2
    assert events[opener] not in cut  # the second block's opener: read by the quiet lane


@pytest.mark.parametrize(("model", "block"), [(HERMES_MODEL, HERMES_BLOCK), (CODER_MODEL, CODER_BLOCK)], ids=["hermes", "qwen3-coder xml"])
def test_a_text_given_back_changed_is_rendered_from_the_frame(model, block, monkeypatch):
    """The whitespace after a block is held and sent with the text after it: that event's text
    goes out in the frame's event rendered once around a text (`Rendered.text`, the first time
    it is wanted), not through the full path's rendering, and the same bytes as the full path's,
    also in reads of eight."""
    context, events = two_blocks(model, block)
    check(CHAT, context, b"".join(events), [events], monkeypatch)
    # The first event after the second block (the first block's renders the frame around a text once).
    after = 1 + len(pieces_of("Looking first. ", 1)) + len(pieces_of(block, 2)) + len(pieces_of("Then again. ", 3)) + len(pieces_of(block, 4))
    assert b'"content":"Do' in events[after].replace(b'": "', b'":"')
    rendered_at: list[int] = []
    render = ChatStreamRewriter._render
    monkeypatch.setattr(ChatStreamRewriter, "_render", lambda self, *args: rendered_at.append(len(sent)) or render(self, *args))
    monkeypatch.setattr(calls, "secrets", CountingSecrets())
    monkeypatch.setattr(calls, "_ID_CHARACTERS", calls.IdCharacters())
    rewriter = ChatStreamRewriter(copy.deepcopy(context))
    sent: list[list[bytes]] = []
    for event in events:
        sent.append(rewriter.feed(event))
    assert rewriter.stats.calls == 2
    text = json.loads(sent[after][0][len(b"data: ") :])["choices"][0]["delta"]["content"]
    assert text.startswith("\nDo")  # (the whitespace held after the block, sent before it)
    assert after not in rendered_at and len(sent[after]) == 1


@pytest.mark.parametrize("model", [HERMES_MODEL, CODER_MODEL])
def test_events_in_a_held_block_that_a_run_must_leave_to_the_lane(model, monkeypatch):
    """In the second block, in reads of eight and in one read: strings that are no JSON string
    alone (a bad escape, a lone surrogate, a quote escaped across two events: the two together
    read as one), a `<` escaped (`\\u003c`, which may begin a tag), text naming the reasoning
    field: the lane reads each of those runs event by event, as the full path does."""
    block = HERMES_BLOCK if model == HERMES_MODEL else CODER_BLOCK
    pieces = pieces_of(block, 4)
    at = next(n for n, piece in enumerate(pieces) if "ls" in piece) + 1

    def data(body: bytes) -> bytes:
        return json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": model,
                           "choices": [{"index": 0, "delta": {"content": "\x00"}, "logprobs": None, "finish_reason": None}]}).encode().replace(b"\\u0000", body)  # fmt: skip

    for odd in ([b"a\\xb"], [b"\\ud83d"], [b"a\\", b'"b'], [b"x \\u003c y"], ["echo \\\"reasoning\\\" "]):
        second = [*pieces[:at], *pieces_of("and more ", 6), *(data(piece) if isinstance(piece, bytes) else piece for piece in odd), *pieces_of("then more", 7), *pieces[at:]]
        context, events = two_blocks(model, block, second)
        check(CHAT, context, b"".join(events), [events], monkeypatch)
        _, each = rewrite(CHAT, context, events, True, monkeypatch)
        for shift in range(8):  # (the state reading each event leaves, in reads of eight)
            _, laned = rewrite(CHAT, context, [b"".join(events[:shift]), *(b"".join(events[at : at + 8]) for at in range(shift, len(events), 8))], True, monkeypatch)
            assert laned._reasoning_field_known is each._reasoning_field_known, (odd, shift)


@pytest.mark.parametrize("model", [HERMES_MODEL, CODER_MODEL])
def test_a_run_before_the_echo_check_has_decided(model, monkeypatch):
    """The first block of a stream, held while the echo check has not decided, its events taken
    in runs: a block that is no call (a tool not declared) goes out as the text it was, and the
    check, which got the run's events, finds that the client assembles what upstream sent."""
    block = (HERMES_BLOCK if model == HERMES_MODEL else CODER_BLOCK).replace("bash", "undeclared_tool")
    context, events = two_blocks(model, block)
    body = b"".join(events)
    check(CHAT, context, body, [events], monkeypatch)
    runs = []
    run = chat_module.ChatStreamRewriter._args_run
    monkeypatch.setattr(chat_module.ChatStreamRewriter._held_read, "run", lambda *args: runs.append(run(*args)) or runs[-1])
    out, rewriter = rewrite(CHAT, context, [b"".join(events[at : at + 8]) for at in range(0, len(events), 8)], True, monkeypatch)
    assert rewriter.stats.calls == 0 and max(runs) > 2
    assert not rewriter.changed
