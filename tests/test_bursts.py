"""A lane's bursts: a read of several events of a call's arguments taken at once (bodies.py's
`plain_bodies`, the Kimi lexer's `steady_bodies`, chat.py's `_args_burst`, messages.py's
`_block_burst`), a read of text a block held whole takes at once (chat.py's `_held_burst`), and a
read of plain text a quiet lane passes at once (`stream.quiet_lane`).

What a burst takes must be exactly what the events one by one would give: `plain_bodies` takes
a read exactly when it is events of the frame whose bodies are plain (checked against orjson's
decoding and encoding of each), `steady_bodies` makes what `steady_piece` makes piece by piece,
and the streams made of such reads give the same bytes with the lanes on and off, the bursts
taken (counted) and remembered from their notes as from the body read again.
"""

from __future__ import annotations

import copy
import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_fuzz import by_event
from test_lanes import BASH_CHAT, REWRITERS, chat_chunk, check, pieces_of, rewrite
from toolshim.apis import CHAT, MESSAGES
from toolshim.bodies import plain_bodies
from toolshim.chat import ChatStreamRewriter
from toolshim.lexers.kimi import KimiLexer
from toolshim.messages import MessagesStreamRewriter
from toolshim.stream import Frame, NotedEvents, string_spans
from toolshim.tools import RequestContext

KIMI = "moonshotai/Kimi-K2.5"
OPEN_CALL = ["<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions.bash:0", "<|tool_call_argument_begin|>", '{"command": "']
CLOSE_CALL = ['"}', "<|tool_call_end|>", "<|tool_calls_section_end|>"]


def frame_of(event: bytes, keys: tuple[str, ...]) -> Frame:
    frame = Frame.around(event, string_spans(event, keys))
    assert frame is not None
    return frame


# The frames a burst meets: a Chat delta in one field, in two mirrored ones, a Messages delta.
FRAMES = {
    "content": frame_of(chat_chunk(KIMI, {"content": "x"}), ("content",)),
    "mirrored": frame_of(chat_chunk(KIMI, {"reasoning": "x", "reasoning_content": "x"}), ("reasoning", "reasoning_content")),
    "messages": frame_of(
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"x"}}\n\n', ("thinking",)
    ),
}
FOREIGN = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}\n\n'

# Pieces of string bodies: plain ones, and everything a plain body must not hold.
UNITS = [
    b"a", b"Z", b" ", b"~", b"/", b"{", b"}", b":", b",", b"'",
    b'\\"', b"\\\\", b"\\b", b"\\f", b"\\n", b"\\r", b"\\t",
    b"\\/", b"\\u0041", b"\\u003c", b"\\u0000", b"<", b'"', b"\\", b"\x00", b"\x01", b"\x1f", b"\x7f", b"\n", b"\r", b"\xc3\xa9", b"\xff",
]  # fmt: skip


def is_plain(body: bytes) -> bool:
    """A plain body, by orjson: one JSON string body by itself, not empty, of printable ASCII and
    the whitespace and backspace that have short escapes, no `<`, and encoded as orjson encodes it."""
    try:
        text = orjson.loads(b'"' + body + b'"')
    except orjson.JSONDecodeError:
        return False
    printable = all(" " <= char <= "~" or char in "\b\f\n\r\t" for char in text)
    return bool(text) and printable and "<" not in text and orjson.dumps(text)[1:-1] == body


def event_of(frame: Frame, body: bytes, second: bytes | None = None) -> bytes:
    if frame.mid is None:
        return frame.head + body + frame.tail
    return frame.head + body + frame.mid + (body if second is None else second) + frame.tail


bodies_strategy = st.lists(st.sampled_from(UNITS), max_size=6).map(b"".join)


@settings(max_examples=1500, deadline=None)
@given(
    st.sampled_from(sorted(FRAMES)),
    st.lists(st.tuples(bodies_strategy, st.one_of(st.none(), bodies_strategy)), min_size=1, max_size=9),
    st.sampled_from(["none", "foreign", "cut", "blank line", "crlf"]),
    st.integers(0, 8),
)
def test_plain_bodies_takes_exactly_reads_of_plain_events(name, events, change, at):
    frame = FRAMES[name]
    reads = [event_of(frame, body, second) for body, second in events]
    mirrored_alike = frame.mid is None or all(second is None or second == body for body, second in events)
    if change == "foreign":
        reads.insert(at % (len(reads) + 1), FOREIGN)
    data = b"".join(reads)
    if change == "cut":
        data = data[:-1 - at]
    elif change == "blank line":
        data += b"\n"
    elif change == "crlf":
        data = data.replace(b"\n", b"\r\n")
    wanted = [body for body, _ in events] if change == "none" and mirrored_alike and all(is_plain(body) for body, _ in events) else None
    assert plain_bodies(data, frame) == wanted


def test_plain_bodies_takes_the_plain_escapes_and_refuses_the_rest():
    """(The property above, by example: each escape orjson writes alike is taken, others not.)"""
    frame = FRAMES["mirrored"]
    taken = [b'say \\"hi\\"', b"a\\\\b", b"x\\n", b"\\t\\r\\f\\b", b" "]
    assert plain_bodies(b"".join(event_of(frame, body) for body in taken), frame) == taken
    for odd in (b"\\/", b"\\u0041", b"a<b", b"\xc3\xa9", b"\\", b"a\\\\\\", b"\x7f"):
        assert plain_bodies(event_of(frame, b"ok") + event_of(frame, odd), frame) is None, odd
    # A body that holds the bytes between the two copies (a bare quote: no plain body) is no two
    # events of plain bodies, though it cuts into four equal pieces.
    assert plain_bodies(event_of(frame, b"ok") + event_of(frame, b"a" + frame.mid + b"a"), frame) is None
    for name, other in FRAMES.items():  # an event of another frame of the same shape: its bytes around the body differ
        assert b'"index"' in other.head, name
        assert plain_bodies(event_of(other, b"ok") + event_of(other, b"ok").replace(b'"index"', b'"indey"'), other) is None, name


def lexer_in_arguments(max_held: int) -> KimiLexer:
    """A Kimi lexer (a Chat rewriter's lane's leaf) inside a call's arguments streamed live."""
    context = RequestContext.from_body(json.dumps({"model": KIMI, "tools": [BASH_CHAT], "stream": True}).encode())
    rewriter = ChatStreamRewriter(context, max_held=max_held)
    for piece in OPEN_CALL:
        rewriter.feed(chat_chunk(KIMI, {"content": piece}))
    leaf = rewriter._args.leaf
    assert type(leaf) is KimiLexer and leaf.steady_piece("x", True) == "x"
    return copy.deepcopy(leaf)


def lexer_state(lexer: KimiLexer) -> tuple:
    return ("".join(lexer._ws), lexer._ws_len, lexer._buf, lexer._state, lexer._lead, lexer._args_sent)


LEXERS = {max_held: lexer_in_arguments(max_held) for max_held in (6, 24, 1 << 20)}
taken_by_cap = {max_held: 0 for max_held in LEXERS}


@settings(max_examples=1500, deadline=None)
@given(
    st.sampled_from(sorted(LEXERS)),
    st.text(" \t\n\r\f", max_size=3),
    st.lists(st.text(' \t\n\r\f\bab"\\{}:', min_size=1, max_size=5), min_size=1, max_size=10),
)
def test_steady_bodies_makes_what_steady_piece_makes_piece_by_piece(max_held, held, texts):
    """The held whitespace before the read (`held`) and the pieces' own: the same arguments made
    and the same whitespace held after, or nothing taken (then only for the cap)."""
    base = copy.deepcopy(LEXERS[max_held])
    base._ws, base._ws_len = ([held], len(held)) if held else ([], 0)
    one_by_one, at_once = copy.deepcopy(base), copy.deepcopy(base)
    bodies = [orjson.dumps(text)[1:-1] for text in texts]
    made = at_once.steady_bodies(bodies, True)
    if made is None:
        assert base._ws_len + sum(map(len, bodies)) > max_held  # refused for the cap alone
        assert lexer_state(at_once) == lexer_state(base)
        return
    taken_by_cap[max_held] += 1
    pieces = [one_by_one.steady_piece(text, True) for text in texts]
    assert None not in pieces
    assert made == [orjson.dumps(piece)[1:-1] for piece in pieces if piece]
    assert lexer_state(at_once) == lexer_state(one_by_one)


def test_steady_bodies_was_taken_under_every_cap():
    """(Run after the property above, in the same module: it was not vacuous.)"""
    assert all(taken_by_cap.values()), taken_by_cap


def test_steady_bodies_takes_only_live_arguments():
    lexer = LEXERS[1 << 20]
    assert copy.deepcopy(lexer).steady_bodies([b"ab"], False) is None  # (arguments not live: the lanes' `finished`)
    header = copy.deepcopy(lexer)
    header.feed("<|tool_call_end|>")
    header.feed("<|tool_call_begin|>")
    assert header.steady_bodies([b"ab"], True) is None  # in a call's header: pieces are held, `feed` reads them


# -- streams through the rewriters -----------------------------------------------------------

# Arguments that stream as plain bodies: escapes, whitespace at a piece's end and whitespace
# alone (whole reads of it), the word a Chat stream's reasoning field is told by, and pieces no
# burst takes among them (a `<`, non-ASCII, an escape orjson writes otherwise).
ARGUMENTS = (
    'ls -la /usr/lib && echo \\"done\\" \\\\ tab\\there \\n next  line   and   spaces \\b\\f\\r end; ' * 4
    + " " * 24 + 'say \\"reasoning\\" then ' + "a<b é \\u00e9 / " + "more plain words after them, spaced   out,  " * 3
)


def kimi_stream(api: str, where: str, extra: dict | None = None) -> tuple[RequestContext, bytes]:
    """A Kimi call whose arguments stream in 1-4 character pieces: Chat's in `content` or in
    mirrored reasoning fields (`extra`: more in each chunk, or in each delta under "delta"),
    Messages' in a thinking block."""
    pieces = ["Let me look. ", *OPEN_CALL, *pieces_of(ARGUMENTS, 5), *CLOSE_CALL, " Done."]
    if api == MESSAGES:
        from anthropic_stream import block_events, stream

        context = RequestContext.from_request({"model": KIMI, "tools": [{"name": "bash", "input_schema": BASH_CHAT["function"]["parameters"]}]})
        return context, stream(KIMI, block_events(0, where, pieces))
    context = RequestContext.from_body(json.dumps({"model": KIMI, "tools": [BASH_CHAT], "stream": True}).encode())
    fields = ("content",) if where == "content" else ("reasoning", "reasoning_content")
    extra = dict(extra or {})
    delta_extra = extra.pop("delta", {})
    events = [chat_chunk(KIMI, {"role": "assistant", "content": ""})]
    events += [chat_chunk(KIMI, {**delta_extra, **{key: piece for key in fields}}, **extra) for piece in pieces]
    events += [chat_chunk(KIMI, {}, "tool_calls"), b"data: [DONE]\n\n"]
    return context, b"".join(events)


STREAMS = {
    "chat: content": (CHAT, "content", None),
    "chat: mirrored reasoning": (CHAT, "mirrored", None),
    # (vLLM's usage stats in every chunk: rendered in each event the lane sends.)
    "chat: usage in each chunk": (CHAT, "content", {"usage": None}),
    # (Each piece of arguments goes out after a chunk of the role: the lane sends two events for
    # one, and takes no bursts.)
    "chat: the role in every delta": (CHAT, "content", {"delta": {"role": "assistant"}}),
    "messages: thinking": (MESSAGES, "thinking", None),
}


def burst_of(api: str):
    rewriter_class = MessagesStreamRewriter if api == MESSAGES else ChatStreamRewriter
    return rewriter_class, rewriter_class._block_read if api == MESSAGES else rewriter_class._args_read


def count_bursts(lane, monkeypatch: pytest.MonkeyPatch) -> list:
    """What `lane`'s burst sent for each read it was offered (None: not taken), from now on."""
    burst, taken = lane.burst, []

    def counting(rewriter, data):
        out = burst(rewriter, data)
        taken.append(out)
        return out

    monkeypatch.setattr(lane, "burst", counting)
    return taken


def counting_bursts(api: str, monkeypatch: pytest.MonkeyPatch) -> list:
    """`count_bursts` of the API's argument lane."""
    return count_bursts(burst_of(api)[1], monkeypatch)


@pytest.mark.parametrize("name", sorted(STREAMS))
@pytest.mark.parametrize("max_held", [8, 1 << 20])
def test_a_call_s_arguments_in_bursts_are_the_full_path_s(name, max_held, monkeypatch):
    """Reads of 2 to 9 events, lanes on and off and the full path whole: the same bytes (`check`
    in test_lanes.py). A small cap on held whitespace refuses most bursts (`feed` may release
    it). The bursts are taken (counted), and the call's arguments reach the client whole."""
    api, where, extra = STREAMS[name]
    context, body = kimi_stream(api, where, extra)
    rewriter_class, _ = burst_of(api)
    taken = counting_bursts(api, monkeypatch)
    monkeypatch.setattr(rewriter_class, "__init__", _with_max_held(rewriter_class.__init__, max_held))
    events = by_event(body)
    cuts = [[b"".join(events[at : at + size]) for at in range(0, len(events), size)] for size in range(2, 10)]
    sent = check(api, context, body, cuts, monkeypatch)
    bursts = [out for out in taken if out is not None]
    if "role" in name:
        assert not bursts
    else:
        assert len(bursts) >= (20 if max_held > 8 else 1), (len(bursts), len(taken))
        assert max_held == 8 or [] in bursts  # (a read of whitespace alone: held, nothing sent)
    if api == CHAT:
        arguments = "".join(
            call["function"].get("arguments", "")
            for event in by_event(sent) if event.startswith(b"data: {")
            for choice in orjson.loads(event[6:])["choices"] for call in choice["delta"].get("tool_calls", [])
        )  # fmt: skip
        assert orjson.loads(arguments) == orjson.loads('{"command": "' + ARGUMENTS + '"}')


@pytest.mark.parametrize("size", [2, 3, 4, 8])
def test_a_burst_is_offered_only_reads_of_four_events_or_more(size, monkeypatch):
    """A burst costs a few calls whatever the read holds: reads of two or three events go through
    the lane event by event (`stream.BURST_MIN_EVENTS`, told by the size of a read's first
    event), reads of four or more are offered to the burst. The bytes are the full path's."""
    api, where, extra = STREAMS["chat: content"]
    context, body = kimi_stream(api, where, extra)
    events = by_event(body)
    reads = [b"".join(events[at : at + size]) for at in range(0, len(events), size)]
    check(api, context, body, [reads], monkeypatch)
    taken = counting_bursts(api, monkeypatch)
    out, rewriter = rewrite(api, context, reads, True, monkeypatch)
    assert rewriter.failure is None and b'"tool_calls"' in out
    if size < 4:
        assert taken == []
    else:
        assert len([made for made in taken if made is not None]) >= 10


@pytest.mark.parametrize("name", ["chat: content", "chat: mirrored reasoning", "messages: thinking"])
def test_a_burst_is_offered_by_feed_itself(name, monkeypatch):
    """A read of several events that the lane refuses and that cannot pass whole goes to the
    lane's burst from `feed` itself: a read the burst takes costs no further call (`_feed_read`,
    the gate worked out again); the others go on as before. The bytes are the full path's."""
    from toolshim.stream import SseRewriter

    api, where, extra = STREAMS[name]
    context, body = kimi_stream(api, where, extra)
    events = by_event(body)
    reads = [b"".join(events[at : at + 8]) for at in range(0, len(events), 8)]
    check(api, context, body, [reads], monkeypatch)
    taken, went_on = counting_bursts(api, monkeypatch), []
    feed_read = SseRewriter._feed_read
    monkeypatch.setattr(SseRewriter, "_feed_read", lambda rewriter, data, *rest, **options: went_on.append(data) or feed_read(rewriter, data, *rest, **options))
    out, rewriter = rewrite(api, context, reads, True, monkeypatch)
    assert rewriter.failure is None and (b'"tool_calls"' in out or b'"tool_use"' in out)
    bursts = [made for made in taken if made is not None]
    assert len(bursts) >= 10 and len(went_on) <= len(reads) - len(bursts)


def test_a_messages_read_inside_a_call_is_not_searched_for_markup_first(monkeypatch):
    """A Messages read of a Kimi call's arguments in bursts (no block quiet: the thinking
    block's lexer is read) is told at once that it cannot pass whole: no search for a marker's
    beginning before the lane's burst takes it (`_nothing_to_read`), and the bytes are the
    full path's."""
    from toolshim import messages

    context, body = kimi_stream(MESSAGES, "thinking")
    events = by_event(body)
    reads = [b"".join(events[at : at + 8]) for at in range(0, len(events), 8)]
    check(MESSAGES, context, body, [reads], monkeypatch)
    searched, inside, taken = [], [], counting_bursts(MESSAGES, monkeypatch)
    search, told = messages.markup_may_start, MessagesStreamRewriter._nothing_to_read

    def telling(rewriter, data):  # (the searches each read inside the call cost)
        before = len(searched)
        passes = told(rewriter, data)
        if rewriter._block is not None:
            inside.append(len(searched) - before)
        return passes

    monkeypatch.setattr(messages, "markup_may_start", lambda data: searched.append(data) or search(data))
    monkeypatch.setattr(MessagesStreamRewriter, "_nothing_to_read", telling)
    out, rewriter = rewrite(MESSAGES, context, reads, True, monkeypatch)
    assert rewriter.failure is None and b'"tool_use"' in out
    assert len([made for made in taken if made is not None]) >= 10
    assert len(inside) >= 10 and not any(inside)


def _with_max_held(init, max_held: int):
    def __init__(self, context, **options):
        init(self, context, **{**options, "max_held": max_held})

    return __init__


@pytest.mark.parametrize("name", ["chat: content", "chat: mirrored reasoning", "messages: thinking"])
def test_a_burst_s_events_are_noted_and_remembered_as_read_again(name, monkeypatch):
    """Through the stream callable in reads of eight, remembered at the terminal event: each
    event a burst sent is noted (by identity), and the turn remembered from the notes is the
    turn read again from the whole body."""
    from test_history import remembered_through_the_stream

    api, where, extra = STREAMS[name]
    context, body = kimi_stream(api, where, extra)
    taken = counting_bursts(api, monkeypatch)
    events = by_event(body)
    handed = []
    original = NotedEvents.extend
    monkeypatch.setattr(NotedEvents, "extend", lambda self, events: (handed.append(self), original(self, events))[1])
    fed, read_again, from_notes = remembered_through_the_stream(context, [b"".join(events[at : at + 8]) for at in range(0, len(events), 8)], api)
    assert fed == read_again and fed[0].calls
    sent = [event for out in taken if out for event in out]
    [noted] = {id(notes): notes for notes in handed}.values()
    assert len(sent) >= 20 and all(any(event is note for note in noted) for event in sent)
    assert from_notes >= len(sent)


def field_learned_with_lanes_on_and_off(context: RequestContext, reads: list[bytes]) -> tuple[dict, dict]:
    """A Chat stream fed in `reads`, lanes off and on: whether the reasoning field was learned,
    and what went out, by lanes."""
    learned, sent = {}, {}
    for lanes in (False, True):
        rewriter = ChatStreamRewriter(copy.deepcopy(context))
        rewriter.lanes = lanes
        sent[lanes] = b"".join(b"".join(rewriter.feed(read)) for read in reads)
        learned[lanes] = rewriter._reasoning_field_known
    return learned, sent


def test_a_burst_naming_the_reasoning_field_is_read_event_by_event(monkeypatch):
    """Until a Chat stream's reasoning field is known, an event naming it is read for it: a burst
    that holds the name is left to the events one by one, which learn it as the full path does
    (and the bursts before and after it are taken)."""
    context = RequestContext.from_body(json.dumps({"model": KIMI, "tools": [BASH_CHAT], "stream": True}).encode())
    pieces = [*OPEN_CALL, *["ab", "cd "] * 8, "ef", '"reasoning', '": ', "1", *["gh", " ij"] * 8, *CLOSE_CALL]
    events = [chat_chunk(KIMI, {"content": piece}) for piece in pieces]
    reads = [*events[:5], *(b"".join(events[at : at + 8]) for at in range(5, len(events), 8))]
    taken = counting_bursts(CHAT, monkeypatch)
    learned, sent = field_learned_with_lanes_on_and_off(context, reads)
    assert learned == {False: True, True: True} and sent[True] == sent[False]
    assert [out is not None for out in taken][:4] == [True, True, False, True]


def test_a_burst_that_raises_fails_open(monkeypatch):
    """A burst that raises (a bug of ours): the read goes as it came, the failure is kept, and the
    rest of the stream passes unchanged (as a lane that raises on one event)."""
    context, body = kimi_stream(CHAT, "content")
    events = by_event(body)
    start = len(OPEN_CALL) + 8  # (in the call's arguments, its events in a lane)
    rewriter = ChatStreamRewriter(copy.deepcopy(context))
    for event in events[:start]:
        rewriter.feed(event)
    assert getattr(rewriter._gate, "burst", None) is not None, "the arguments' lane takes bursts"

    def raising(_rewriter, data):
        raise RuntimeError("burst bug")

    monkeypatch.setattr(ChatStreamRewriter._args_read, "burst", raising)
    rest = events[start:]
    sent = [piece for at in range(0, len(rest), 8) for piece in rewriter.feed(b"".join(rest[at : at + 8]))]
    sent += rewriter.close()
    assert isinstance(rewriter.failure, RuntimeError)
    assert b"".join(sent) == b"".join(rest)


# -- a stream's first read of several events: the text after its start passes as one -------------

PLAIN_MODEL = "some-model"
PROSE = "Plain words, a tab\tand a quote \" but no markup at all, " * 3


def plain_chat(model: str, text: str, seed: int) -> list[bytes]:
    return [chat_chunk(model, {"role": "assistant", "content": ""}), *(chat_chunk(model, {"content": p}) for p in pieces_of(text, seed)),
            chat_chunk(model, {}, "stop"), b"data: [DONE]\n\n"]  # fmt: skip


def counting_reads(cls, monkeypatch: pytest.MonkeyPatch) -> dict:
    """How many events the rewriter read one by one (`_on_block`), how often a framed read of
    several tried its rest whole."""
    counts = {"events": 0, "rest": 0}
    on_block, rest_whole = cls._on_block, cls._framed_rest_whole

    def counted_block(self, raw):
        counts["events"] += 1
        return on_block(self, raw)

    def counted_rest(self, events):
        counts["rest"] += 1
        return rest_whole(self, events)

    monkeypatch.setattr(cls, "_on_block", counted_block)
    monkeypatch.setattr(cls, "_framed_rest_whole", counted_rest)
    return counts


@pytest.mark.parametrize("lanes", [True, False])
def test_a_chat_stream_s_first_read_passes_whole_with_its_start(lanes, monkeypatch):
    """In reads of eight, a model whose start needs no reading (no reasoning pre-opened): the
    first read, the role, the answer's first text and six more texts, goes out as one piece,
    unread, and the answer counts as begun: a `<think>` after it is text, as the full path has
    it. With the lanes on, a quiet lane is learned (from the events around the `<`)."""
    events = plain_chat(PLAIN_MODEL, PROSE, 1)
    events.insert(12, chat_chunk(PLAIN_MODEL, {"content": " <think>no block</think> if x < y"}))
    context = RequestContext.from_body(json.dumps({"model": PLAIN_MODEL, "tools": [BASH_CHAT], "stream": True}).encode())
    counts = counting_reads(ChatStreamRewriter, monkeypatch)
    rewriter = ChatStreamRewriter(copy.deepcopy(context))
    rewriter.lanes = lanes
    first = rewriter.feed(b"".join(events[:8]))
    assert first == [b"".join(events[:8])] and counts == {"events": 0, "rest": 0}
    assert rewriter._content_started
    out = first + [piece for at in range(8, len(events), 8) for piece in rewriter.feed(b"".join(events[at : at + 8]))] + rewriter.close()
    assert b"".join(out) == b"".join(events) and not rewriter.changed and rewriter.failure is None
    assert counts["events"] == 8  # the read with the `<`, and no other
    assert (rewriter._quiet_kept is not None) is lanes
    body = b"".join(events)
    check(CHAT, context, body, [events, [body[:1000], body[1000:3000], body[3000:]]], monkeypatch)


def test_a_reasoning_stream_s_reads_pass_whole_once_the_answer_began(monkeypatch):
    """Reasoning in its own field before the answer: its reads are read event by event (the quiet
    lane serves the reads around a call's markup better, `_settle`); the answer's reads after it
    pass whole."""
    reasoning = [chat_chunk(PLAIN_MODEL, {"reasoning_content": p}) for p in pieces_of(PROSE, 2)]
    answer = [chat_chunk(PLAIN_MODEL, {"content": p}) for p in pieces_of(PROSE, 3)]
    events = [chat_chunk(PLAIN_MODEL, {"role": "assistant", "content": ""}), *reasoning, *answer, chat_chunk(PLAIN_MODEL, {}, "stop"), b"data: [DONE]\n\n"]
    context = RequestContext.from_body(json.dumps({"model": PLAIN_MODEL, "tools": [BASH_CHAT], "stream": True}).encode())
    counts = counting_reads(ChatStreamRewriter, monkeypatch)
    rewriter = ChatStreamRewriter(copy.deepcopy(context))
    rewriter.lanes = False
    reads = [b"".join(events[at : at + 8]) for at in range(0, len(events), 8)]
    out = [piece for read in reads for piece in rewriter.feed(read)] + rewriter.close()
    assert b"".join(out) == b"".join(events) and not rewriter.changed
    last_reasoning = len(reasoning)  # (its index in `events`)
    read_one_by_one = 8 * (last_reasoning // 8 + 1)
    assert read_one_by_one <= counts["events"] < read_one_by_one + 8 < len(events) - 8
    check(CHAT, context, b"".join(events), [events], monkeypatch)


def counting_quiet_bursts(monkeypatch: pytest.MonkeyPatch) -> list:
    """What each quiet lane's burst was offered and sent (None: not taken), from now on: (the
    read, what went out)."""
    from toolshim import chat, stream

    offered = []

    def counted_lane(*args, **kwargs):
        lane = stream.quiet_lane(*args, **kwargs)
        burst, read_bodies = lane.burst, lane.read_bodies

        def counting(rewriter, data):  # (the burst of a lane that notes nothing)
            out = burst(rewriter, data)
            offered.append((data, out))
            return out

        def counting_bodies(data):  # (what a noting lane's burst reads: `noting_lane`)
            bodies = read_bodies(data)
            offered.append((data, None if bodies is None else [data]))
            return bodies

        lane.burst, lane.read_bodies = counting, counting_bodies
        return lane

    monkeypatch.setattr(chat, "quiet_lane", counted_lane)
    return offered


def reasoning_then_call(fields: tuple[str, ...], reasoning: str) -> tuple[RequestContext, list[bytes]]:
    """A Kimi turn: reasoning in its own field(s) before the answer, then a call in it."""
    context = RequestContext.from_body(json.dumps({"model": KIMI, "tools": [BASH_CHAT], "stream": True}).encode())
    pieces = [*pieces_of(reasoning, 6), *OPEN_CALL, *pieces_of('ls -la /tmp"}', 7), *CLOSE_CALL[1:]]
    events = [chat_chunk(KIMI, {"role": "assistant", "content": ""}), *(chat_chunk(KIMI, dict.fromkeys(fields, p)) for p in pieces)]
    return context, [*events, chat_chunk(KIMI, {}, "tool_calls"), b"data: [DONE]\n\n"]


REASONING = "I should list the files first, then look at each: a tab\there, a quote \" and more words. " * 6


@pytest.mark.parametrize("fields", [("reasoning_content",), ("reasoning", "reasoning_content")])
def test_reasoning_before_the_answer_in_bursts_passes_by_the_quiet_lane_s_burst(fields, monkeypatch):
    """Reasoning in its own field before the answer, in reads of 2 to 9 events: a read of plain
    reasoning events of the quiet frame goes out as it came, at once (the lane's burst), and the
    bytes are the full path's, lanes on and off; a `[` in a read (a marker may begin) sends that
    read through the lane event by event."""
    text = REASONING + " a [bracket] here. " + REASONING
    context, events = reasoning_then_call(fields, text)
    offered = counting_quiet_bursts(monkeypatch)
    body = b"".join(events)
    check(CHAT, context, body, [[b"".join(events[at : at + size]) for at in range(0, len(events), size)] for size in range(2, 10)], monkeypatch)
    del offered[:]
    reads = [b"".join(events[at : at + 8]) for at in range(0, len(events), 8)]
    out, rewriter = rewrite(CHAT, context, reads, True, monkeypatch)
    assert rewriter.failure is None and b'"tool_calls"' in out
    taken = [data for data, sent in offered if sent is not None]
    assert len(taken) >= 10 and all(sent == [data] for data, sent in offered if sent is not None)
    def bracketed(data: bytes) -> bool:
        return any("[" in "".join(delta.values()) for delta in (orjson.loads(event[6:])["choices"][0]["delta"] for event in by_event(data)))

    assert any(bracketed(data) for data, sent in offered if sent is None)  # (the bracket's read, refused)
    assert not any(bracketed(data) for data in taken)
    assert not rewriter._content_started  # (the reasoning came before any answer: no whole reads)


@pytest.mark.parametrize("fields", [("reasoning_content",), ("reasoning", "reasoning_content")])
@pytest.mark.parametrize("first", [5, 6, 9, 12, 20])
def test_the_rest_of_a_stream_s_first_read_goes_by_the_quiet_lane_s_burst(fields, first, monkeypatch):
    """A stream's first read of several events, reasoning before the answer (where whole reads
    do not pass): its first events are read one by one and teach the quiet lane, the rest of the
    read (four events or more) goes out through the lane's burst at once, as it came; the same
    bytes as the full path's, lanes on and off, and the later reads as before."""
    context, events = reasoning_then_call(fields, REASONING)
    reads = [b"".join(events[:first]), *(b"".join(events[at : at + 8]) for at in range(first, len(events), 8))]
    check(CHAT, context, b"".join(events), [reads], monkeypatch)
    offered = counting_quiet_bursts(monkeypatch)
    out, rewriter = rewrite(CHAT, context, reads, True, monkeypatch)
    assert rewriter.failure is None and b'"tool_calls"' in out
    # (the role's event and the first reasoning events read in full, the lane learned from them)
    taken = [data for data, sent in offered if sent is not None]
    rests = [at for at in range(1, 5) if taken[:1] == [b"".join(events[at:first])]]
    assert bool(rests) is (first >= 8) and all(first - at >= 4 for at in rests), [data.count(b"\n\n") for data in taken[:2]]
    assert all(data.count(b"\n\n") == 8 for data in taken[len(rests) :])  # (then whole reads, as before)
    # A rest the burst refuses (a `[`: a marker may begin) goes event by event, offered once.
    bracketed = [*events[:first], chat_chunk(KIMI, dict.fromkeys(fields, " [x] ")), *events[first:]]
    reads = [b"".join(bracketed[: first + 1]), *(b"".join(bracketed[at : at + 8]) for at in range(first + 1, len(bracketed), 8))]
    check(CHAT, context, b"".join(bracketed), [reads], monkeypatch)
    del offered[:]
    rewriter = REWRITERS[CHAT](copy.deepcopy(context))
    rewriter.feed(reads[0])
    assert len(offered) == (first >= 7) and not any(sent for _, sent in offered)
    # Without a call the client gets what upstream sent: the echo check took the rest as it gave it.
    plain = [*events[: 1 + len(pieces_of(REASONING, 6))], *(chat_chunk(KIMI, {"content": p}) for p in pieces_of("The answer is plain.", 4))]
    plain += [chat_chunk(KIMI, {}, "stop"), b"data: [DONE]\n\n"]
    assert b"<|" not in b"".join(plain)
    reads = [b"".join(plain[:first]), *(b"".join(plain[at : at + 8]) for at in range(first, len(plain), 8))]
    out, rewriter = rewrite(CHAT, context, reads, True, monkeypatch)
    assert out == b"".join(plain) and not rewriter.changed


@pytest.mark.parametrize("fields", [("reasoning_content",), ("reasoning", "reasoning_content")])
def test_a_quiet_burst_s_events_are_noted_and_remembered_as_read_again(fields, monkeypatch):
    """Through the stream callable in reads of eight, remembered at the terminal event: each
    read a quiet lane's burst passed is noted as one piece with its events' bodies, and the turn
    remembered from the notes is the turn read again."""
    from test_history import remembered_through_the_stream

    context, events = reasoning_then_call(fields, REASONING * 2)
    offered = counting_quiet_bursts(monkeypatch)
    fed, read_again, from_notes = remembered_through_the_stream(context, [b"".join(events[at : at + 8]) for at in range(0, len(events), 8)], CHAT)
    assert fed == read_again and fed[0].calls and fed[0].reasoning
    taken = [data for data, sent in offered if sent is not None]
    # (the first: the rest of the stream's first read, after the events that taught the lane)
    assert len(taken) >= 10 and all(data.count(b"\n\n") == 8 for data in taken[1:]) and 4 <= taken[0].count(b"\n\n") < 8
    assert from_notes >= sum(data.count(b"\n\n") for data in taken)  # (each read noted as one piece, with its events' bodies)


def test_a_quiet_burst_naming_the_reasoning_field_is_read_event_by_event(monkeypatch):
    """Until a Chat stream's reasoning field is known, a read whose text names it (`"reasoning`)
    is no quiet burst: its events go one by one and learn the field, as the full path does."""
    context = RequestContext.from_body(json.dumps({"model": KIMI, "tools": [BASH_CHAT], "stream": True}).encode())
    pieces = [*pieces_of("Plain words come first here. " * 4, 5), "then ", '"reasoning', '" is', " named. ", *pieces_of("More plain words follow. " * 8, 6)]
    events = [chat_chunk(KIMI, {"role": "assistant", "content": ""}), *(chat_chunk(KIMI, {"content": p}) for p in pieces)]
    events += [chat_chunk(KIMI, {}, "stop"), b"data: [DONE]\n\n"]
    reads = [*events[:12], *(b"".join(events[at : at + 8]) for at in range(12, len(events), 8))]  # (a quiet lane learned first)
    offered = counting_quiet_bursts(monkeypatch)
    learned, sent = field_learned_with_lanes_on_and_off(context, reads)
    assert learned == {False: True, True: True} and sent[True] == sent[False] == b"".join(events)
    assert any(out is None and b'\\"reasoning' in data for data, out in offered)


def test_the_kept_quiet_lane_is_taken_up_after_a_block(monkeypatch):
    """A Hermes stream's prose read one event a read teaches the quiet lane; the block (a call)
    is read in full, which drops the lane; after it the prose passes by the lane kept, taken up
    again without learning it anew. Its first read, of eight events, passed whole: no lane is
    learned from a read of several (in bursts a one-event lane would only refuse each read)."""
    model = "Qwen/Qwen2.5-72B-Instruct"
    block = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    prose = ["Let", " me", " look", " at", " it", " first", ".", " Then", " a", " few", " more", " words", "."]
    pieces = [*prose, block, *pieces_of(" Then more words follow here.", 3)]
    events = [chat_chunk(model, {"role": "assistant", "content": ""}), *(chat_chunk(model, {"content": p}) for p in pieces),
              chat_chunk(model, {}, "stop"), b"data: [DONE]\n\n"]  # fmt: skip
    context = RequestContext.from_body(json.dumps({"model": model, "tools": [BASH_CHAT], "stream": True}).encode())
    rewriter = ChatStreamRewriter(copy.deepcopy(context))
    out = rewriter.feed(b"".join(events[:8]))
    assert out == [b"".join(events[:8])] and rewriter._quiet_kept is None and rewriter._direct_lane is None
    for event in events[8:14]:
        out += rewriter.feed(event)
    kept = rewriter._quiet_kept
    assert kept is not None and rewriter._direct_lane is kept[1]
    rest = events[14:]
    assert rest[0] == chat_chunk(model, {"content": block})
    out += rewriter.feed(rest[0])
    assert rewriter._direct_lane is not kept[1] and b'"name":"bash"' in b"".join(out)
    out += rewriter.feed(rest[1])  # (the event after the block: the rewriter idle again)
    assert rewriter._quiet_kept is kept and rewriter._direct_lane is kept[1]
    check(CHAT, context, b"".join(events), [[b"".join(events[:8]), *events[8:]]], monkeypatch)


@pytest.mark.parametrize("markup", ["<think>", "[TOOL_CALLS]", "\\u003ctool_call>"])
def test_a_first_read_whose_rest_may_hold_markup_is_read_event_by_event(markup, monkeypatch):
    """The rest holds what may begin a marker: each event is read, as before; the bytes are the
    full path's, lanes on and off, whole and in reads of eight."""
    events = plain_chat(PLAIN_MODEL, "Some words", 4)
    events.insert(5, chat_chunk(PLAIN_MODEL, {"content": json.loads(f'"{markup}"')}))
    counts = counting_reads(ChatStreamRewriter, monkeypatch)
    context = RequestContext.from_body(json.dumps({"model": PLAIN_MODEL, "tools": [BASH_CHAT], "stream": True}).encode())
    rewriter = ChatStreamRewriter(copy.deepcopy(context))
    rewriter.feed(b"".join(events[:8]))
    assert counts == {"events": 8, "rest": 1}
    body = b"".join(events)
    check(CHAT, context, body, [events], monkeypatch)
    # The rest is looked at once, however long the read: 400 events, the markup last.
    long = plain_chat(PLAIN_MODEL, "word " * 400, 4)
    long.insert(-2, chat_chunk(PLAIN_MODEL, {"content": json.loads(f'"{markup}"')}))
    looked = []
    nothing_to_read = ChatStreamRewriter._nothing_to_read
    monkeypatch.setattr(ChatStreamRewriter, "_nothing_to_read", lambda self, raw: looked.append(raw.count(b"\n\n")) or nothing_to_read(self, raw))
    ChatStreamRewriter(copy.deepcopy(context)).feed(b"".join(long))
    assert len(long) > 400 and sum(looked) < 3 * len(long), (len(looked), sum(looked))


def test_a_messages_stream_s_first_read_passes_its_deltas_as_one(monkeypatch):
    """Messages: the message's start, the block's start and its first delta are read, the other
    deltas of the read go out as one piece."""
    from anthropic_stream import block_events, stream

    body = stream(PLAIN_MODEL, block_events(0, "text", pieces_of(PROSE, 5)), ping=False)
    events = by_event(body)
    context = RequestContext.from_request({"model": PLAIN_MODEL, "tools": [{"name": "bash", "input_schema": BASH_CHAT["function"]["parameters"]}]})
    counts = counting_reads(MessagesStreamRewriter, monkeypatch)
    rewriter = MessagesStreamRewriter(copy.deepcopy(context))
    first = rewriter.feed(b"".join(events[:8]))
    assert first == [*events[:3], b"".join(events[3:8])] and counts == {"events": 3, "rest": 1}
    out = first + [piece for at in range(8, len(events), 8) for piece in rewriter.feed(b"".join(events[at : at + 8]))] + rewriter.close()
    assert b"".join(out) == body and not rewriter.changed
    check(MESSAGES, context, body, [events], monkeypatch)


def test_a_messages_stream_in_bursts_passes_its_reads_by_the_frame(monkeypatch):
    """Messages in reads of eight: once a read of several quiet deltas passed whole, the frame of
    its last delta is learned (no lane: it would refuse every read of several), and the next
    reads of plain deltas pass by it (`plain_bodies`), the pattern that matches each delta over
    again not run. A read with a `[` or with a body that is not plain (a letter that is not
    ASCII) is looked at by the pattern still, and passes as it came."""
    import toolshim.messages as messages_module
    from anthropic_stream import block_events, stream

    pieces = pieces_of(PROSE * 6, 6)
    pieces[60], pieces[100] = " [a list]", " caf\u00e9"
    body = stream(PLAIN_MODEL, block_events(0, "text", pieces), ping=False)
    events = by_event(body)
    context = RequestContext.from_request({"model": PLAIN_MODEL, "tools": [{"name": "bash", "input_schema": BASH_CHAT["function"]["parameters"]}]})
    read_at = [0]
    by_pattern = []
    quiet_deltas_of = messages_module._quiet_deltas_of
    monkeypatch.setattr(messages_module, "_quiet_deltas_of", lambda index, kind: by_pattern.append(read_at[0]) or quiet_deltas_of(index, kind))
    reads = [b"".join(events[at : at + 8]) for at in range(0, len(events), 8)]
    for lanes in (True, False):
        by_pattern.clear()
        rewriter = MessagesStreamRewriter(copy.deepcopy(context))
        rewriter.lanes = lanes
        out = []
        for read_at[0], read in enumerate(reads):
            out += rewriter.feed(read)
        out += rewriter.close()
        assert b"".join(out) == body and not rewriter.changed
        # The first read (its rest, after the starts read one by one) and the second, before a
        # frame is known; the reads of the `[` (event 62) and of the `é` (event 102); the last,
        # which ends the message. With the lanes off (no frame is learned), every read.
        expected = {0, 1, 62 // 8, 102 // 8, len(reads) - 1} if lanes else set(range(len(reads)))
        assert len(reads) > 30 and set(by_pattern) == expected, (sorted(set(by_pattern)), len(reads))
    check(MESSAGES, context, body, [events], monkeypatch)


def test_a_frame_learned_in_bursts_gets_its_lane_when_events_come_one_a_read(monkeypatch):
    """Bursts, then one event a read (a model that slows down): the frame learned from a read of
    several has no lane; the first delta read alone passes by the frame and takes up its lane,
    which takes the deltas after it straight from `feed`: none is read one by one."""
    from anthropic_stream import block_events, stream

    body = stream(PLAIN_MODEL, block_events(0, "text", pieces_of(PROSE * 2, 8)), ping=False)
    events = by_event(body)
    context = RequestContext.from_request({"model": PLAIN_MODEL, "tools": [{"name": "bash", "input_schema": BASH_CHAT["function"]["parameters"]}]})
    counts = counting_reads(MessagesStreamRewriter, monkeypatch)
    rewriter = MessagesStreamRewriter(copy.deepcopy(context))
    out = [piece for at in range(0, 32, 8) for piece in rewriter.feed(b"".join(events[at : at + 8]))]
    assert rewriter._quiet_frame is not None and rewriter._direct_lane is None
    read_alone = counts["events"]
    out += [piece for event in events[32:-4] for piece in rewriter.feed(event)]
    assert rewriter._direct_lane is not None and counts["events"] == read_alone
    out += [piece for event in events[-4:] for piece in rewriter.feed(event)] + rewriter.close()
    assert b"".join(out) == body and not rewriter.changed
    check(MESSAGES, context, body, [[b"".join(events[:32]), *events[32:]]], monkeypatch)


def test_a_first_read_passes_its_rest_whole_only_once_no_fields_wait(monkeypatch):
    """Each event with an `id:` line; a bare `</think>` (Kimi's template may open the block
    unasked) goes out as nothing, its id waiting for the next event sent. Had the rest of the read
    passed whole then, its events' own ids would go out before the waiting one: the client's last
    event id would go backwards. The rest passes once nothing waits (`_whole_reads_pass`)."""
    events = [chat_chunk(KIMI, {"role": "assistant", "content": ""}), chat_chunk(KIMI, {"content": "Hi"}), chat_chunk(KIMI, {"content": "</think>"}),
              *(chat_chunk(KIMI, {"content": p}) for p in pieces_of(PROSE, 7)), chat_chunk(KIMI, {}, "stop"), b"data: [DONE]\n\n"]  # fmt: skip
    events = [b"id: %d\n" % n + event for n, event in enumerate(events)]
    context = RequestContext.from_body(json.dumps({"model": KIMI, "tools": [BASH_CHAT], "stream": True}).encode())
    body = check(CHAT, context, b"".join(events), [events, [b"".join(events[:8]), *events[8:]]], monkeypatch)
    ids = [int(line[4:]) for line in body.split(b"\n") if line.startswith(b"id: ")]
    assert ids == sorted(ids) and ids[-1] == len(events) - 1 and b"</think>" not in body


# -- a block held whole ---------------------------------------------------------------------------

HERMES, CODER = "Qwen/Qwen2.5-72B-Instruct", "Qwen/Qwen3-Coder-480B-A35B-Instruct"
# Long values of plain bodies (escapes among them), and pieces no burst takes: a `<` escaped,
# non-ASCII, a `<` raw (which a run ends at too).
HELD_VALUE = 'ls -la /usr/lib && echo \\"done\\" \\\\ tab\\there \\n next  ' * 6 + "a \\u003c b é c<d " + "more plain words, spaced   out,  " * 4
HELD_COMMAND = json.loads(f'"{HELD_VALUE}"')  # (the value as text: XML carries it raw)
HELD_STREAMS = {
    "hermes": (HERMES, '{"name": "bash", "arguments": {"command": "%s"}}' % HELD_VALUE),
    "qwen3-coder xml": (CODER, "<function=bash>\n<parameter=command>\n%s\n</parameter>\n</function>" % HELD_COMMAND),
}


def held_stream(name: str) -> tuple[RequestContext, bytes]:
    """Two blocks of one long call each, between prose, in 1-4 character pieces, tags too."""
    model, inner = HELD_STREAMS[name]
    block = "<tool_call>\n" + inner + "\n</tool_call>"
    text = f"Let me look.\n{block}\nAnd again.\n{block}\nDone."
    context = RequestContext.from_body(json.dumps({"model": model, "tools": [BASH_CHAT], "stream": True}).encode())
    events = [chat_chunk(model, {"role": "assistant", "content": ""})]
    events += [chat_chunk(model, {"content": piece}) for piece in pieces_of(text, 7)]
    events += [chat_chunk(model, {}, "stop"), b"data: [DONE]\n\n"]
    return context, b"".join(events)


@pytest.mark.parametrize("name", sorted(HELD_STREAMS))
def test_a_block_held_whole_in_bursts_is_the_full_path_s(name, monkeypatch):
    """A block the lexer holds until it closes (`<tool_call>` JSON, Qwen3-Coder's XML), in reads
    of 2 to 9 events, lanes on and off and the full path whole: the same bytes (`check`). Its
    reads are taken at once (`ChatStreamRewriter._held_burst`, counted), sending nothing: in the
    first block, while the echo check has not decided (each read given to it, `checked_burst`),
    and in the second, once it has (the call made). Both calls reach the client whole."""
    context, body = held_stream(name)
    burst, taken = ChatStreamRewriter._held_read.burst, []

    def counting(rewriter, data):
        decided = rewriter._echo.changed
        out = burst(rewriter, data)
        taken.append((decided, out))
        return out

    monkeypatch.setattr(ChatStreamRewriter._held_read, "burst", counting)
    events = by_event(body)
    sent = check(CHAT, context, body, [[b"".join(events[at : at + size]) for at in range(0, len(events), size)] for size in (2, 5, 9)], monkeypatch)
    made = [out for _, out in taken if out is not None]
    assert made and all(out == [] for out in made)
    # (Qwen3-Coder's first block here meets its lane while the `<think>` lexer still watches for
    # a bare closer: the lane's leaf is the whole channel, which takes no runs nor bursts.)
    expected_states = {False, True} if name == "hermes" else {True}
    assert {decided for decided, out in taken if out is not None} == expected_states, "the blocks' bursts, by the echo check's state"
    assert len(made) >= 20 and len(made) < len(taken), (len(made), len(taken))  # (some refused: the escape, é)
    calls = [
        call for event in by_event(sent) if event.startswith(b"data: {")
        for choice in orjson.loads(event[6:])["choices"] for call in choice["delta"].get("tool_calls", [])
    ]  # fmt: skip
    arguments = [orjson.loads(call["function"]["arguments"]) for call in calls]
    assert [args["command"].strip() for args in arguments] == [HELD_COMMAND.strip()] * 2


MINIMAX = "MiniMaxAI/MiniMax-M2"
MESSAGES_HELD = {
    "hermes in text": (HERMES, "<tool_call>\n" + HELD_STREAMS["hermes"][1] + "\n</tool_call>"),
    "minimax in text": (MINIMAX, '<minimax:tool_call>\n<invoke name="bash">\n<parameter name="command">%s</parameter>\n</invoke>\n</minimax:tool_call>' % HELD_COMMAND),
}


@pytest.mark.parametrize("name", sorted(MESSAGES_HELD))
def test_a_messages_block_held_whole_in_bursts_is_the_full_path_s(name, monkeypatch):
    """The same on the Messages API (`MessagesStreamRewriter._block_burst`): two blocks held whole
    in a text block, in reads of 2 to 9 events, the same bytes lanes on and off and through the
    full path whole; reads of the second block (the echo check decided) taken at once, sending
    nothing; both calls' input exact."""
    from anthropic_stream import block_events, stream

    model, block = MESSAGES_HELD[name]
    text = f"Let me look.\n{block}\nAnd again.\n{block}\nDone."
    context = RequestContext.from_request({"model": model, "tools": [{"name": "bash", "input_schema": BASH_CHAT["function"]["parameters"]}]})
    body = stream(model, block_events(0, "text", pieces_of(text, 9)))
    taken = count_bursts(MessagesStreamRewriter._block_read, monkeypatch)
    events = by_event(body)
    sent = check(MESSAGES, context, body, [[b"".join(events[at : at + size]) for at in range(0, len(events), size)] for size in (2, 5, 9)], monkeypatch)
    made = [out for out in taken if out is not None]
    assert len(made) >= 10 and all(out == [] for out in made), (len(made), len(taken))
    inputs: dict[int, str] = {}
    for event in by_event(sent):
        data = orjson.loads(event.split(b"data: ", 1)[1])
        if data["type"] == "content_block_start" and data["content_block"]["type"] == "tool_use":
            inputs[data["index"]] = ""
        elif data["type"] == "content_block_delta" and data["delta"]["type"] == "input_json_delta":
            inputs[data["index"]] += data["delta"]["partial_json"]
    assert [orjson.loads(value)["command"].strip() for value in inputs.values()] == [HELD_COMMAND.strip()] * 2
