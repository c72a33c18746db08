"""The Responses lanes (responses.py: the quiet lane, the held lane) against the full path: the
same bytes with the lanes on and off, at every split, on streams made to test what the lanes
read from an event's bytes alone: the order of `delta` and `sequence_number`, text that is
not plain ASCII (escaped or not), a text kept lazily by the quiet lane and later sent in a
`.done` event of ours (a call cuts its part), numbering upstream breaks, and events the full
path cannot read.
"""

from __future__ import annotations

import json

import pytest

from test_fuzz import by_event
from test_lanes import BASH_CHAT, check, cut_points, pieces_of, prose_read_after_a_call, rewrite
from toolshim import responses, sse
from toolshim.apis import RESPONSES
from toolshim.responses import ResponsesStreamRewriter
from toolshim.tools import RequestContext

MODEL = "Qwen/Qwen2.5-72B-Instruct"
BASH = {"type": "function", "name": "bash", "parameters": BASH_CHAT["function"]["parameters"]}
PROSE = 'Plain prose with "quotes", a [bracket], a back\\slash, a tab\tand a café, 中文 and 😀 emoji; then more words. '
CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>\n'


def context() -> RequestContext:
    return RequestContext.from_body(json.dumps({"model": MODEL, "input": "hi", "tools": [BASH], "stream": True}).encode())


def stream(pieces: list[str], *, number_last: bool = False, ascii_only: bool = False, numbers: list[int] | None = None, item_id: str = "msg_1") -> bytes:
    """A message streamed one delta a piece; `number_last`: `sequence_number` after `delta` (as
    orjson writes a dict built in that order), else first; `ascii_only`: non-ASCII escaped;
    `numbers`: the sequence numbers (else 0, 1, 2, …); `item_id`, the message's. A piece that
    is bytes is sent as the event's data line itself (an event the full path cannot read)."""
    ref = {"item_id": item_id, "output_index": 0, "content_index": 0}
    response = {"id": "resp_1", "object": "response", "created_at": 1, "model": MODEL, "status": "in_progress", "output": []}
    item = {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    events: list[dict | bytes] = [
        {"type": "response.created", "response": response},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.content_part.added", **ref, "part": {"type": "output_text", "text": "", "annotations": []}},
    ]
    events += [piece if isinstance(piece, bytes) else {"type": "response.output_text.delta", **ref, "delta": piece, "logprobs": []} for piece in pieces]
    text = "".join(piece for piece in pieces if isinstance(piece, str))
    part = {"type": "output_text", "text": text, "annotations": []}
    done_item = {**item, "status": "completed", "content": [part]}
    events += [
        {"type": "response.output_text.done", **ref, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **ref, "part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": done_item},
        {"type": "response.completed", "response": {**response, "status": "completed", "output": [done_item]}},
    ]
    out = []
    for n, event in enumerate(events):
        number = numbers[n] if numbers is not None else n
        if isinstance(event, bytes):
            out.append(b"event: response.output_text.delta\ndata: " + event + b"\n\n")
            continue
        event = {**event, "sequence_number": number} if number_last else {"type": event["type"], "sequence_number": number, **event}
        data = json.dumps(event, ensure_ascii=ascii_only, separators=(",", ":"))
        out.append(f"event: {event['type']}\ndata: {data}\n\n".encode())
    return b"".join(out)


PROSE_PIECES = pieces_of(PROSE, 5)
CUT_BY_A_CALL = PROSE_PIECES + pieces_of(CALL, 6) + pieces_of(PROSE, 7)
STREAMS = {
    "plain, number first": stream(PROSE_PIECES),
    "plain, number last": stream(PROSE_PIECES, number_last=True),
    "plain, escaped": stream(PROSE_PIECES, ascii_only=True),
    # (the frame's bytes are a format for the number: their own `%` signs stay as they are)
    "plain, per cent signs in the frame, number first": stream(PROSE_PIECES, item_id="msg_%d%s%"),
    "plain, per cent signs in the frame, number last": stream(PROSE_PIECES, number_last=True, item_id="msg_%d%s%"),
    "cut by a call, number first": stream(CUT_BY_A_CALL),
    "cut by a call, number last": stream(CUT_BY_A_CALL, number_last=True),
    "cut by a call, escaped": stream(CUT_BY_A_CALL, number_last=True, ascii_only=True),
}


@pytest.mark.parametrize("name", list(STREAMS))
def test_every_split_is_the_same_through_the_lanes(name, monkeypatch):
    """One event a read, one event cut in two at each byte around its text (and every 17th byte
    of every fourth event): the lanes on give what the full path gives whole, and fail where it
    fails (nowhere: a lane's failure passes a plain stream's bytes as they came)."""
    body = STREAMS[name]
    reference, full = rewrite(RESPONSES, context(), [body], False, monkeypatch)
    assert full.failure is None
    events = by_event(body)
    for i, event in enumerate(events):
        for at in cut_points(event, i % 4 == 0):
            pieces = [*events[:i], event[:at], event[at:], *events[i + 1 :]]
            on, laned = rewrite(RESPONSES, context(), pieces, True, monkeypatch)
            assert on == reference and laned.failure is None, (name, i, at, laned.failure)


def test_a_part_cut_by_a_call_keeps_its_text():
    """The text the quiet lane let pass goes, decoded, into our `.done` events for the part a
    call cut: the prose before the call, whole, and after it."""
    body = STREAMS["cut by a call, number last"]
    out, rewriter = rewrite_plain(body)
    assert rewriter.stats.calls == 1
    done = [json.loads(line[6:]) for line in out.split(b"\n") if line.startswith(b"data: ") and b'"response.output_text.done"' in line]
    assert len(done) == 2 and done[0]["text"] == PROSE and done[1]["text"].strip() == PROSE.strip()


def rewrite_plain(body: bytes):
    rewriter = ResponsesStreamRewriter(context())
    out = b"".join(piece for event in by_event(body) for piece in rewriter.feed(event)) + b"".join(rewriter.close())
    return out, rewriter


@pytest.mark.parametrize("name", list(STREAMS))
def test_the_lanes_are_taken(name, monkeypatch):
    """Most events of these streams are never parsed (equal bytes alone would not tell that the
    lanes fired)."""
    parsed = []
    original = sse.parse_block
    monkeypatch.setattr(sse, "parse_block", lambda raw: parsed.append(raw) or original(raw))
    monkeypatch.setattr(responses, "parse_block", sse.parse_block)
    rewrite_plain(STREAMS[name])
    assert len(parsed) < len(by_event(STREAMS[name])) / 3, (name, len(parsed))


def test_prose_after_a_call_goes_out_renumbered_without_the_lexer(monkeypatch):
    """Text after a call goes to an item of ours (new ids, new numbers), so `passes_plain_delta`
    cannot pass it: the held lane renumbers it, and text in which no marker can start does not
    go through the (idle) lexer. Only the first delta after the call is read."""
    rewriter = ResponsesStreamRewriter(context())
    events = by_event(STREAMS["cut by a call, number last"])
    prose_after_call, read_after_call = prose_read_after_a_call(rewriter, events, b'"response.output_text.delta"', b"response.function_call_arguments.done", monkeypatch)
    assert rewriter.stats.calls == 1 and prose_after_call == len(pieces_of(PROSE, 7))
    assert read_after_call == 1, read_after_call


@pytest.mark.parametrize("number_last", [False, True])
def test_markup_in_prose_that_went_out_past_the_lexer(number_last, monkeypatch):
    """Prose between two calls, the lanes on and off: the second call's markup, in text the lane
    renumbered without the lexer, is read by it (and text inside the call no longer passes)."""
    pieces = CUT_BY_A_CALL + pieces_of(CALL, 8) + pieces_of(PROSE, 9)
    body = stream(pieces, number_last=number_last)
    events = by_event(body)
    out = check(RESPONSES, context(), body, [events, [b"".join(events[i : i + 3]) for i in range(0, len(events), 3)]], monkeypatch)
    done = [json.loads(line[6:]) for line in out.split(b"\n") if line.startswith(b'data: {"type":"response.output_item.done"')]
    assert [(event["output_index"], event["item"]["type"]) for event in done] == [
        (0, "message"), (1, "function_call"), (2, "message"), (3, "function_call"), (4, "message"),
    ]  # fmt: skip


def test_a_bracket_marker_begun_at_the_end_of_prose_after_a_call(monkeypatch):
    """Mistral's `[TOOL_CALLS]`, its start at the end of a delta (`… [TOO`) in prose after a
    call: a marker may begin there (the string's closing quote tells), so the lexer reads it."""
    model = "mistralai/Devstral-Small-2507"
    call = '[TOOL_CALLS]bash[ARGS]{"command": "ls -la"}'
    body = stream([*pieces_of("Let me look.", 3), call, *pieces_of(" Then some prose, and", 4), " again [TOO", "L_CALLS]bash", '[ARGS]{"command": "pwd"}', " done."])
    context = RequestContext.from_body(json.dumps({"model": model, "input": "hi", "tools": [BASH], "stream": True}).encode())
    events = by_event(body)
    out = check(RESPONSES, context, body, [events, [b"".join(events[i : i + 3]) for i in range(0, len(events), 3)]], monkeypatch)
    done = [json.loads(line[6:]) for line in out.split(b"\n") if line.startswith(b'data: {"type":"response.output_item.done"')]
    assert [event["item"]["type"] for event in done] == ["message", "function_call", "message", "function_call", "message"]


def odd_delta(body: bytes, digits: bytes, number_last: bool) -> bytes:
    """A text delta's data as `stream` writes it, but for its string body and number."""
    ref = b'"item_id":"msg_1","output_index":0,"content_index":0,"delta":"' + body + b'","logprobs":[]'
    if number_last:
        return b'{"type":"response.output_text.delta",' + ref + b',"sequence_number":' + digits + b"}"
    return b'{"type":"response.output_text.delta","sequence_number":' + digits + b"," + ref + b"}"


@pytest.mark.parametrize("number_last", [False, True])
@pytest.mark.parametrize(
    ("body", "digits"),
    [
        (b"a\tb", b"33"),
        (b"a\\xb", b"33"),
        (b"\\ud83d", b"33"),
        (b'a","delta":"b', b"33"),
        (b"\xff\xfe", b"33"),
        (b"a", b"033"),
        (b"a", b"33.0"),
        (b"a", b"34"),
    ],
    ids=["raw tab", "bad escape", "lone surrogate", "two deltas", "invalid UTF-8", "leading zero", "a float", "a number ahead"],
)
def test_events_the_full_path_reads_otherwise(body, digits, number_last, monkeypatch):
    """An event in the middle of plain text (or held markup) that the full path cannot read, or
    reads otherwise than its bytes suggest, whatever the lanes learned before it. (In the second
    call's block the echo check has decided: the held lane takes runs of events in a read.)"""
    prose, call = PROSE_PIECES[:60], pieces_of(CALL, 6)
    in_block = call.index("ar")  # (in its JSON, after `"name": "bash", "`)
    second = len(prose) + len(call) + 10
    for at in (30, len(prose) + in_block, second + in_block):  # in plain text; inside the first call's block, the second's
        pieces = [*prose, *call, *PROSE_PIECES[:10], *call, "after"]
        pieces.insert(at, odd_delta(body, digits, number_last))
        stream_body = stream(pieces, number_last=number_last)
        events = by_event(stream_body)
        check(RESPONSES, context(), stream_body, [events, [b"".join(events[i : i + 3]) for i in range(0, len(events), 3)]], monkeypatch)


@pytest.mark.parametrize("number_last", [False, True])
def test_an_event_that_ends_otherwise(number_last, monkeypatch):
    """Bytes that begin as the frame's event does and hold its text, `mid` and a number, but
    end in another byte (no JSON object): no event of the frame, in plain text nor among the
    events of a held block that a run takes (the second call's, in reads of eight)."""
    data = odd_delta(b"a", b"33", number_last)[:-1] + b"]"
    prose, call = PROSE_PIECES[:60], pieces_of(CALL, 6)
    in_block = call.index("ar")
    second = len(prose) + len(call) + 10
    for at in (30, second + in_block):
        pieces = [*prose, *call, *PROSE_PIECES[:10], *call, "after"]
        pieces.insert(at, data)
        body = stream(pieces, number_last=number_last)
        check(RESPONSES, context(), body, [by_event(body)], monkeypatch)


@pytest.mark.parametrize("number_last", [False, True])
def test_an_event_shorter_than_its_frame(number_last, monkeypatch):
    """Bytes that begin as the frame's event does and end as it does, the quote between text
    and frame shared (`"delta":","logprobs"…`: no JSON): no event of the frame, whatever its
    number."""
    data = odd_delta(b"", b"33", number_last).replace(b'"delta":"","logprobs"', b'"delta":","logprobs"')
    pieces: list = [*PROSE_PIECES[:60]]
    pieces.insert(30, data)
    body = stream(pieces, number_last=number_last)
    check(RESPONSES, context(), body, [by_event(body)], monkeypatch)


@pytest.mark.parametrize("number_last", [False, True])
def test_a_delta_of_another_item_framed_alike(number_last, monkeypatch):
    """A text delta of an item never announced, its bytes as long as the frame's and ending as
    they do: not the part's text (a call later cuts the part, and our `.done` events give the
    text the part was given)."""
    pieces: list = [*CUT_BY_A_CALL]
    pieces.insert(20, odd_delta(b"elsewhere", b"23", number_last).replace(b'"item_id":"msg_1"', b'"item_id":"msg_2"'))
    body = stream(pieces, number_last=number_last)
    check(RESPONSES, context(), body, [by_event(body)], monkeypatch)


@pytest.mark.parametrize("number_last", [False, True])
def test_numbering_that_upstream_breaks(number_last, monkeypatch):
    """A number skipped, one repeated, in the middle of plain text and of a call: the events
    after are renumbered by the full path, and the lanes must give the same."""
    pieces = PROSE_PIECES[:40] + pieces_of(CALL, 6) + PROSE_PIECES[:20]
    numbers = list(range(len(pieces) + 7))
    numbers[20:] = [n + 5 for n in numbers[20:]]  # a gap in the plain text
    numbers[50:] = [n - 1 for n in numbers[50:]]  # a repeat inside the call
    body = stream(pieces, number_last=number_last, numbers=numbers)
    events = by_event(body)
    check(RESPONSES, context(), body, [events], monkeypatch)


def test_a_held_blocks_events_in_a_read_go_to_the_lexer_at_once(monkeypatch):
    """In reads of eight, once the echo check has decided (the second call), the events of a
    block the lexer holds whole go to it as one text a read (`held_reader`'s run), up to one that
    may begin a tag (a `<`), which it reads alone: the second block's JSON reaches the lexer in a
    piece for the event that opens it and one a read after that."""
    from toolshim.lexers import engine

    fed: list[str] = []
    feed = engine.JsonCallsLexer.feed
    monkeypatch.setattr(engine.JsonCallsLexer, "feed", lambda lexer, text: fed.append(text) or feed(lexer, text))
    call = pieces_of(CALL, 6)
    body = stream([*PROSE_PIECES[:20], *call, *PROSE_PIECES[:10], *call, "after"])
    events = by_event(body)
    check(RESPONSES, context(), body, [events], monkeypatch)
    events_in_json = call.index("<", 1) - call.index(">\n") - 1
    for shift in range(8):  # (where the reads' ends fall)
        fed.clear()
        reads = [b"".join(events[at : at + 8]) for at in range(shift, len(events), 8)]
        _, rewriter = rewrite(RESPONSES, context(), [b"".join(events[:shift]), *reads] if shift else reads, True, monkeypatch)
        assert rewriter.stats.calls == 2
        opened = len(fed) - fed[::-1].index(">\n")  # the second block's opening tag ends there
        json_pieces = fed[opened : fed.index("<", opened)]
        assert "".join(json_pieces) == '{"name": "bash", "arguments": {"command": "ls -la"}}\n'
        # the opening event alone (the lexer holds no value yet), then a piece a read
        assert len(json_pieces) <= 2 + -(-events_in_json // 8), (shift, json_pieces)


def test_a_run_refused_is_not_looked_for_again_in_the_same_events(monkeypatch):
    """A `<` escaped in a held block's JSON (`\\u003c`, which the lexer must read, not a run):
    the run that holds it is refused as a whole, its events are read one by one, and no run is
    looked for again among them (each event of a read is looked at by one run at most, however
    long the read)."""
    looked_at: list[int] = []
    each_string = responses.each_string
    monkeypatch.setattr(responses, "each_string", lambda bodies: looked_at.append(len(bodies)) or each_string(bodies))
    call = pieces_of(CALL, 6)
    at = call.index('"ls ')
    escaped = [*call[:at], *pieces_of('"ls ', 1), odd_delta(b"\\u003c", b"1", False), *pieces_of("-la, then a long tail of arguments" * 3, 1), *call[at + 1 :]]
    body = stream([*PROSE_PIECES[:20], *call, *PROSE_PIECES[:10], *escaped, "after"])
    events = by_event(body)
    check(RESPONSES, context(), body, [events], monkeypatch)
    looked_at.clear()
    start = max(n for n, event in enumerate(events) if b'"delta":">\\n"' in event) + 2  # in the second block's JSON
    _, rewriter = rewrite(RESPONSES, context(), [*events[:start], b"".join(events[start:])], True, monkeypatch)  # (the rest one read)
    assert rewriter.stats.calls == 2
    assert 0 < sum(looked_at) <= len(events) - start, looked_at
