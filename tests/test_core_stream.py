"""The SSE plumbing every streamed rewrite shares (addon/toolshim/stream.py): what happens to an
event's `id:` and `retry:` lines when the event itself is rewritten or held."""

from __future__ import annotations

import json
import re

from hypothesis import assume, given
from hypothesis import strategies as st

from harness import sse_body
from toolshim.chat import ChatStreamRewriter
from toolshim.sse import SseFramer
from toolshim.stream import SseRewriter
from toolshim.tools import RequestContext

BASH = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}


def rewriter() -> ChatStreamRewriter:
    return ChatStreamRewriter(RequestContext.from_request({"model": "qwen3", "tools": [BASH]}))


def event(content: str, fields: str = "") -> bytes:
    return fields.encode() + sse_body([{"choices": [{"index": 0, "delta": {"content": content}}]}], done=False)


def run(body: list[bytes]) -> bytes:
    shim = rewriter()
    out = [piece for raw in body for piece in shim.feed(raw)]
    return b"".join(out + shim.close())


def ids(body: bytes) -> list[str]:
    return [m.decode() for m in re.findall(rb"(?m)^id: ?([^\r\n]*)$", body)]


def assert_ids_go_forward(sent: list[str], upstream: list[str]) -> None:
    """Ids of held events may be merged into the newest one, but what the client sees only goes
    forward, never twice, and ends on upstream's last."""
    assert set(sent) <= set(upstream)
    positions = [upstream.index(i) for i in sent]
    assert positions == sorted(set(positions)), sent
    assert sent[-1] == upstream[-1]


def test_an_event_passing_as_it_came_keeps_its_fields_in_place():
    body = [event("Hello", "id: 1\nretry: 500\n"), event(" world", "id: 2\n"), b"data: [DONE]\n\n"]
    assert run(body) == b"".join(body)


def test_the_fields_of_held_and_rewritten_events_go_on_the_next_event_sent():
    call = '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
    pieces = ["Let me look. ", call[:5], call[5:30], call[30:], " Done."]
    body = [event(piece, f"id: {n}\n" + ("retry: 3000\n" if n == 2 else "")) for n, piece in enumerate(pieces)]
    out = run([*body, b"id: 5\ndata: [DONE]\n\n"])
    assert_ids_go_forward(ids(out), ["0", "1", "2", "3", "4", "5"])
    assert out.count(b"retry: 3000\n") == 1
    blocks = [block for block in out.split(b"\n\n") if block]
    # the held pieces' ids ride on the call's event: the client's last id after it is upstream's
    call_block = next(block for block in blocks if b'"tool_calls"' in block)
    assert ids(call_block + b"\n")[-1] == "3"
    assert [json.loads(line[6:]) for block in blocks for line in block.split(b"\n") if line.startswith(b"data: {")]


def test_field_lines_look_alike_in_data_are_not_taken():
    body = [event("<tool_call>", "id: 7\n"), b'data: {"choices":[{"index":0,"delta":{"content":"\\nid: 9"}}]}\n\n', b"data: [DONE]\n\n"]
    assert ids(run(body)) == ["7"]


def test_cr_line_ends_and_an_id_without_a_value():
    body = [b"id\rdata: " + event("<tool_call>")[6:-2] + b"\r\r", b"retry: 10\r\n" + event(" plain"), b"data: [DONE]\n\n"]
    out = run(body)
    # carried field lines end in `\n`: one ending in a lone `\r` put before an LF blank line
    # would have made a CRLF of it, and the event would not have ended
    assert out.count(b"id\n") == 1 and out.count(b"retry: 10\n") == 1
    assert len(SseFramer().feed(out)) == 2


def test_an_id_line_ended_by_a_cr_in_an_event_ended_by_lf_is_carried():
    """One `\n` at the end does not make a one-line event: a CR alone ended the `id` line
    before it (found by fuzzing: the last id was lost)."""
    body = [event("<tool_call>", "id: 1\r"), event(" plain"), b"data: [DONE]\n\n"]
    assert ids(run(body)) == ["1"]


def test_argument_pieces_keep_whatever_else_their_choice_and_delta_carry():
    """A delta holding one piece of a call's arguments is packed by a short path (chat.py); a
    choice or delta carrying anything else (vLLM's `stop_reason`, logprobs, a role) takes the
    general one, and nothing of it is lost."""
    from kimi import chunk, kimi_chunks

    from toolshim.chat import ChatStreamRewriter

    pieces = ["<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions.bash:0", "<|tool_call_argument_begin|>",
              '{"comm', 'and":', ' "ls"}', "<|tool_call_end|>", "<|tool_calls_section_end|>"]  # fmt: skip
    chunks = kimi_chunks("kimi-k2", pieces, fields=("content",))  # chunks[5:8] hold the arguments
    chunks[6]["choices"][0]["stop_reason"] = None
    chunks[7]["choices"][0]["logprobs"] = {"content": [{"token": " \"ls\"}", "logprob": -0.1}]}
    chunks[7]["choices"][0]["delta"]["role"] = "assistant"
    shim = ChatStreamRewriter(RequestContext.from_request({"model": "kimi-k2", "tools": [BASH]}))
    out = b"".join(shim.feed(sse_body(chunks)) + shim.close())
    sent = [json.loads(line[6:]) for line in out.split(b"\n\n") if line.startswith(b"data: {")]
    args = [c for c in sent if c["choices"] and "id" not in (c["choices"][0]["delta"].get("tool_calls") or [{"id": 0}])[0]]
    assert [c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for c in args] == ['{"comm', 'and":', ' "ls"}']
    plain, stop_reason, rich = args
    assert plain == {**chunk("kimi-k2", {}), "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"comm'}}]}, "logprobs": None, "finish_reason": None}]}
    assert stop_reason["choices"][0]["stop_reason"] is None
    # the role goes first in a chunk of its own, carrying the logprobs; the arguments follow
    (role,) = [c for c in sent[1:] if c["choices"] and c["choices"][0]["delta"].get("role") == "assistant"]
    assert role["choices"][0]["logprobs"] == chunks[7]["choices"][0]["logprobs"] and sent.index(role) == sent.index(rich) - 1


def with_ids(body: bytes, start: int = 0) -> list[bytes]:
    """Each event of `body` with an `id:` line of its number, first."""
    return [f"id: {n}\n".encode() + block + b"\n\n" for n, block in enumerate(body.split(b"\n\n")[:-1], start)]


def test_responses_events_held_then_sent_as_they_came_keep_their_own_ids_once():
    """A Responses rewriter holds `output_item.added` and `content_part.added` until the item's
    first text is known, then sends their raw bytes: the ids they carry are not sent twice."""
    from responses import responses_events, responses_sse

    from toolshim.responses import ResponsesStreamRewriter

    tools = [{"type": "function", "name": "bash", "parameters": {"type": "object"}}]
    body = with_ids(responses_sse(responses_events("m", ["Hello", " world"], tools=tools)))
    shim = ResponsesStreamRewriter(RequestContext.from_request({"model": "m", "tools": tools}))
    out = b"".join([piece for raw in body for piece in shim.feed(raw)] + shim.close())
    assert out == b"".join(body) and not shim.changed
    # with a call cut out of the text, the ids still come once each, in order
    call = '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
    body = with_ids(responses_sse(responses_events("m", ["Look. ", call[:9], call[9:], " Done."], tools=tools)))
    shim = ResponsesStreamRewriter(RequestContext.from_request({"model": "m", "tools": tools}))
    out = b"".join([piece for raw in body for piece in shim.feed(raw)] + shim.close())
    assert b'"type":"function_call"' in out
    assert_ids_go_forward(ids(out), [str(n) for n in range(len(body))])


def test_an_event_passing_as_it_came_after_a_rewritten_one_ends_with_its_own_id():
    """The fields carried from a held event go on the next event sent, even one passing as it
    came: its own id comes after them, so the client's last id never goes back."""
    empty = b"id: 2\n" + sse_body([{"choices": [{"index": 0, "delta": {}}]}], done=False)  # passes as it came
    body = [event("Let me look ", "id: 0\n"), event("<", "id: 1\n"), empty, event("b> now", "id: 3\n")]
    for reads in (body, body[:2] + [b"".join(body[2:])]):  # one read each, or the rest whole (the fast path)
        out = run([*reads, b"id: 4\ndata: [DONE]\n\n"])
        assert ids(out) == ["0", "1", "2", "3", "4"]
        assert b"Let me look <b> now" == b"".join(
            json.loads(line[6:])["choices"][0]["delta"].get("content", "").encode() for line in out.split(b"\n") if line.startswith(b"data: {")
        )


class HoldsFirst(SseRewriter):
    """Holds the first event not dropped and sends it as it came with the event `release`
    names, dropping that one; an event `rewrite` names is replaced by `data: rewritten`, one
    `drop` names is dropped."""

    def __init__(self, release: bytes, rewrite: bytes = b"-", drop: bytes = b"-") -> None:
        super().__init__()
        self.held: bytes | None = None
        self.release, self.rewrite, self.drop = release, rewrite, drop

    def _on_block(self, raw: bytes) -> list[bytes]:
        if self.drop in raw:
            return []
        if self.held is None:
            self.held = raw
            return []
        if self.rewrite in raw:
            return [b"data: rewritten\n\n"]
        return [self.held] if self.release in raw else [self.held, raw]

    def _may_send_later(self, raw: bytes) -> bool:
        return raw is self.held


def test_fields_newer_than_an_event_sent_last_as_it_came_go_after_its_own():
    """An event held and then sent as it came, last of what an event released: the fields of the
    events read after it go after its own id, inside it."""
    shim = HoldsFirst(release=b"data: b")
    out = shim.feed(b"id: 1\ndata: a\n\n") + shim.feed(b"id: 2\rdata: b\r\r") + shim.close()
    assert out == [b"id: 1\ndata: a\nid: 2\n\n"]  # its line end made `\n`: the blank line stays one


def test_a_held_event_sent_after_newer_fields_went_out_goes_without_its_own():
    """Held, its fields went out on another event with newer ones; sent as it came later, its
    own `id:` would take the client back: it goes without it."""
    shim = HoldsFirst(release=b"-", rewrite=b"data: b")
    out = b"".join(shim.feed(b"id: 1\ndata: a\n\nid: 2\ndata: b\n\nid: 3\ndata: c\n\n") + shim.close())
    assert out == b"id: 2\ndata: rewritten\n\ndata: a\n\nid: 3\ndata: c\n\n"


def test_fields_waiting_before_a_held_event_are_not_merged_into_its_own():
    """Sent as it came, a held event carries its own fields, and its entry is let go: the
    fields of a dropped event before it must not have been merged into that entry."""
    shim = HoldsFirst(release=b"-", drop=b"data: dropped")
    out = b"".join(shim.feed(b"retry: 9\ndata: dropped\n\nid: 2\ndata: held\n\nid: 3\ndata: c\n\n") + shim.close())
    assert out == b"retry: 9\nid: 2\ndata: held\n\nid: 3\ndata: c\n\n"


def test_a_long_hold_keeps_one_entry_of_fields():
    """A block that never closes is held event after event: the fields waiting are merged as
    they come (the last id and retry are all the client keeps), so the state does not grow."""
    shim = rewriter()
    shim.feed(event('<tool_call>{"name": "', "id: 0\n"))  # a name not closed: held
    for n in range(1, 2000):
        assert shim.feed(event("x", f"id: {n}\nretry: {n}\n")) == []
        assert len(shim._waiting) == 1
    out = b"".join(shim.close())
    assert ids(out) == ["1999"] and out.count(b"retry: ") == 1 and b'\\"' + b"x" * 1999 + b'"}' in out


def framed_byte_by_byte(data: bytes) -> list[bytes]:
    """The blocks the framer's scan cuts `data` into (fed a byte at a time: never a whole read)."""
    framer = SseFramer()
    blocks = [block for at in range(len(data)) for block in framer.feed(data[at : at + 1])]
    return blocks + framer.close()


@given(st.text(alphabet="da:ta \n{}\"xé", max_size=30), st.binary(max_size=40))
def test_bytes_held_at_a_read_s_end_are_kept_as_feed_keeps_them(rest_text, more):
    """`SseFramer.hold` (the rest of a read after its last blank line, without a CR) leaves the
    framer as `feed` of the same bytes would: what it holds, where its scan resumes, where its
    line begins; then the next bytes cut alike (a blank line split across the two included)."""
    rest = rest_text.encode().lstrip(b"\n")
    assume(b"\n\n" not in rest)
    held, fed = SseFramer(), SseFramer()
    held.hold(rest)
    assert fed.feed(rest) == []
    assert (bytes(held._buf), held._scan, held._line_start) == (bytes(fed._buf), fed._scan, fed._line_start)
    more = b"\n" + more.replace(b"\r", b"")  # (a line end first: may end a block begun in `rest`)
    assert held.feed(more) + held.close() == fed.feed(more) + fed.close()


def test_a_whole_read_s_unfinished_last_event_is_held_without_the_scan(monkeypatch):
    """A read that passes whole up to its last blank line (`_whole_read`) hands the unfinished
    event after it to the framer's `hold`, not its `feed`; the next read completes it."""
    fed = []
    feed = SseFramer.feed
    monkeypatch.setattr(SseFramer, "feed", lambda framer, data: fed.append(data) or feed(framer, data))
    shim = ChatStreamRewriter(RequestContext())
    events = [event(f"prose {n} ") for n in range(12)]
    body = b"".join(events)
    cut = len(body) - len(events[-1]) // 2
    reads = [body[:cut], body[cut:]]
    out = [piece for read in reads for piece in shim.feed(read)] + shim.close()
    assert b"".join(out) == body and out[0] == body[: len(body) - len(events[-1])]
    assert fed == []


def test_a_read_of_whole_events_is_cut_as_the_scan_cuts_it(monkeypatch):
    """A read of several whole events with LF line ends (in bursts) is cut at its blank lines at
    once, without the framer's scan: the same blocks the scan makes, each its exact bytes. Reads
    the scan must read (an empty block, a CR, an event cut short, a read that begins with a line
    end) give the scan's blocks too, and what an event cut short holds stays for the next read."""
    named = b'event: message\ndata: {"a": 1}\n\n'
    plain = event("x") + event("y") + event("z")
    fields = b"id: 7\nretry: 10\n" + event("w")
    wholes = (plain, named * 3, plain + named + fields, fields + plain)
    others = (plain + b"\n" + named, event("a") + b"\r\n" + plain, b"\n" + plain, plain + named[:9])
    scans = {data: framed_byte_by_byte(data) for data in (*wholes, *others)}
    scanned = []
    scan = SseFramer._cut
    monkeypatch.setattr(SseFramer, "_cut", lambda framer, final: scanned.append(final) or scan(framer, final))
    for whole in wholes:
        assert SseFramer().feed(whole) == scans[whole] and len(scans[whole]) >= 3
    assert not scanned  # (no scan: cut at once)
    for other in others:
        framer = SseFramer()
        assert framer.feed(other) + framer.close() == scans[other]
        assert scanned and scanned[-1] is True  # (scanned, and closed)
    framer = SseFramer()
    assert framer.feed(plain + named[:9]) == scans[plain] and framer.feed(named[9:]) == [named]  # (the rest held, then cut)
