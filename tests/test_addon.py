"""The mitmproxy skin: options, scope, per-flow state, fail-open, kept bodies."""

from __future__ import annotations

import logging

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mitmproxy import exceptions, http
from mitmproxy.flow import Error
from mitmproxy.test import taddons, tflow, tutils

from harness import Mitmdump, read_flows, sse_body
from kimi import SEED_000, kimi_chunks
from toolshim import chat
from toolshim.addon import CHAT_TERMINAL, MESSAGES_TERMINAL, RESPONSES_TERMINAL, StreamRewrite, ToolShim, frame_as_rewritten, header
from toolshim.encoding import incremental_decoder
from wire import check_chat_stream

BODY = sse_body(kimi_chunks("k2", SEED_000))


def chat_flow(path="/v1/chat/completions", host="api.example.com", live=True):
    flow = tflow.tflow(req=tutils.treq(method=b"POST", path=path.encode(), host=host, content=b'{"model": "k2"}'), resp=tutils.tresp(content=None), live=live)
    flow.response.headers["content-type"] = "text/event-stream"
    flow.response.headers["content-length"] = "123"
    return flow


def run_stream(addon, flow, pieces):
    addon.requestheaders(flow)
    addon.request(flow)
    addon.responseheaders(flow)
    out = []
    for piece in [*pieces, b""]:
        result = flow.response.stream(piece)
        assert isinstance(result, list) and b"" not in result
        out += result
    addon.response(flow)
    return b"".join(out)


def test_stream_callable_rewrites_and_fixes_framing_headers():
    addon = ToolShim()
    with taddons.context(addon):
        flow = chat_flow()
        out = run_stream(addon, flow, [BODY[:100], BODY[100:]])
        assert "content-length" not in flow.response.headers
        assert flow.response.headers["transfer-encoding"] == "chunked"
        assert flow.request.headers["accept-encoding"] == "identity"
        assert [c["name"] for c in check_chat_stream(out)["tool_calls"]] == ["bash", "read_file"]
        # kept for mitmweb and -w: what the client got, and what upstream sent
        assert flow.response.raw_content == out
        assert flow.metadata["toolshim"]["upstream"] == BODY
        assert flow.metadata["toolshim"]["calls"] == 2
        assert addon._flows == {}


class Pieces:
    """A rewriter that sends, for each read, the pieces it is given (empty ones among them)."""

    failure = None

    def __init__(self, *reads: list[bytes]) -> None:
        self.reads = list(reads)

    def feed(self, data: bytes) -> list[bytes]:
        return self.reads.pop(0)

    def close(self) -> list[bytes]:
        return []


@pytest.mark.parametrize("last_read", [[b"data: [DONE]\n\n"], [b"data: {}\n\n", b"", b"data: [DONE]\n\n"]])
def test_what_the_client_got_is_handed_on_once_when_the_terminal_event_goes_out(last_read):
    """Remembering must not wait for mitmproxy's end of the stream: the client may send its next
    request first. Empty pieces never go out (HTTP/1.1 would read one as the body's end), and a
    read's pieces go out as one write."""
    handed = []
    stream = StreamRewrite(Pieces([b"data: {}\n\n", b""], last_read), incremental_decoder(""), "u", False, on_terminal=lambda sent, noted: handed.append(b"".join(sent)))
    assert stream(b"read 1") == [b"data: {}\n\n"] and handed == []
    assert stream(b"read 2") == [b"".join(last_read)]
    assert handed == [b"".join([b"data: {}\n\n", *last_read])]
    assert stream(b"") == [] and len(handed) == 1


class Recording(Pieces):
    """`Pieces` that keeps what it was fed."""

    def __init__(self, *reads: list[bytes]) -> None:
        super().__init__(*reads)
        self.fed: list[bytes] = []

    def feed(self, data: bytes) -> list[bytes]:
        self.fed.append(data)
        return super().feed(data)


def test_a_body_sent_as_it_is_takes_no_decoder_call_and_a_compressed_one_is_decoded():
    """Without a content-encoding, a read goes to the rewriter as it came, with no decoder
    called (one call fewer on every read); a gzip body is decoded piece by piece, its end
    flushed, and the upstream copy kept decoded."""
    import gzip

    plain = StreamRewrite(Recording([b"a"], [b"b"]), incremental_decoder(""), "u", True)
    assert plain.decoder is None and plain(b"data: 1") == [b"a"] and plain(b"data: 2") == [b"b"]
    assert plain.rewriter.fed == [b"data: 1", b"data: 2"] and plain.upstream == [b"data: 1", b"data: 2"]
    body = b"data: one\n\ndata: two\n\n"
    packed = gzip.compress(body)
    rewriter = Recording(*([[]] * (len(packed) + 1)))
    squeezed = StreamRewrite(rewriter, incremental_decoder("gzip"), "u", True)
    assert squeezed.decoder is not None
    for at in range(len(packed)):
        squeezed(packed[at : at + 1])
    squeezed(b"")
    assert b"".join(rewriter.fed) == body == b"".join(squeezed.upstream)


CHAT_TEXT = b'data: {"choices":[{"index":0,"delta":{"content":"say data: [DONE] or [DONE]"}}]}\n\n'
RESPONSES_TEXT = (
    b"event: response.output_text.delta\n"
    b'data: {"type":"response.output_text.delta","delta":"response.completed, \\"type\\":\\"response.completed\\""}\n\n'
)
MESSAGES_TEXT = (
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","delta":{"type":"text_delta","text":"message_stop \\"type\\": \\"message_stop\\""}}\n\n'
)


@pytest.mark.parametrize(
    ("terminal", "text", "event"),
    [
        (CHAT_TERMINAL, CHAT_TEXT, b"data: [DONE]\n\n"),
        (CHAT_TERMINAL, CHAT_TEXT.replace(b"\n", b"\r\n"), b"data:[DONE]\r\n\r\n"),
        (RESPONSES_TERMINAL, RESPONSES_TEXT, b'event: response.completed\ndata: {"type": "response.completed", "response": {}}\n\n'),
        (MESSAGES_TERMINAL, MESSAGES_TEXT, b'event: message_stop\ndata: {"type":"message_stop"}\n\n'),
    ],
)
def test_a_text_that_names_the_terminal_event_is_not_the_event(terminal, text, event):
    """Remembering at a `[DONE]` the model wrote would leave out the turn's later calls."""
    handed = []
    stream = StreamRewrite(Pieces([text], [text, text], [event]), incremental_decoder(""), "u", False, on_terminal=lambda sent, noted: handed.append(b"".join(sent)), terminal=terminal)
    assert stream(b"read 1") == [text] and stream(b"read 2") == [text + text]
    assert handed == []
    stream(b"read 3")
    assert handed == [text * 3 + event]


def test_the_terminal_event_is_seen_in_a_stream_s_first_read_and_not_mid_line():
    """A read that starts with `data: [DONE]` is the event only where a line starts: after a
    line end or at the stream's start (after a failure, reads pass as they came, split anywhere)."""
    handed = []
    first = StreamRewrite(Pieces([b"data: [DONE]\n\n"]), incremental_decoder(""), "u", False, on_terminal=lambda sent, noted: handed.append(b"".join(sent)))
    first(b"read 1")
    assert handed == [b"data: [DONE]\n\n"]
    handed.clear()
    mid_line = StreamRewrite(Pieces([b'data: {"x": "'], [b'data: [DONE]"}\n\n']), incremental_decoder(""), "u", False, on_terminal=lambda sent, noted: handed.append(b"".join(sent)))
    mid_line(b"read 1")
    mid_line(b"read 2")
    assert handed == []
    mid_line(b"")
    assert handed == [b'data: {"x": "data: [DONE]"}\n\n']  # the stream's end hands it on


def test_filter_option_narrows_the_scope():
    addon = ToolShim()
    with taddons.context(addon) as tctx:
        tctx.configure(addon, toolshim_filter="~d allowed.example")
        outside = chat_flow(host="other.example")
        addon.requestheaders(outside)
        assert addon._flows == {} and "accept-encoding" not in outside.request.headers
        inside = chat_flow(host="allowed.example")
        assert b"tool_calls" in run_stream(addon, inside, [BODY])


def test_invalid_filter_is_refused():
    addon = ToolShim()
    with taddons.context(addon) as tctx:
        with pytest.raises(exceptions.OptionsError, match="toolshim_filter"):
            tctx.configure(addon, toolshim_filter="~d (")


def test_other_paths_and_methods_are_not_touched():
    addon = ToolShim()
    with taddons.context(addon):
        for flow in (chat_flow(path="/v1/embeddings"), tflow.tflow(resp=True)):
            addon.requestheaders(flow)
            addon.responseheaders(flow)
            assert addon._flows == {} and not callable(flow.response.stream)


def test_error_frees_the_flow_state_and_keeps_what_was_sent():
    addon = ToolShim()
    with taddons.context(addon):
        flow = chat_flow()
        addon.requestheaders(flow)
        addon.request(flow)
        addon.responseheaders(flow)
        sent = flow.response.stream(BODY[: len(BODY) // 2])
        flow.error = Error("Client disconnected.")
        addon.error(flow)
        assert addon._flows == {}
        assert flow.response.raw_content == b"".join(sent)


def test_an_exception_fails_open_with_one_log_line(monkeypatch, caplog):
    addon = ToolShim()

    def boom(self, chunk):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(chat.ChatStreamRewriter, "_rewrite_chunk", boom)
    with taddons.context(addon), caplog.at_level(logging.WARNING):
        flow = chat_flow()
        out = run_stream(addon, flow, [BODY[:300], BODY[300:700], BODY[700:]])
    assert out == BODY  # nothing lost: the stream passes unchanged from the failure on
    assert len([r for r in caplog.records if "toolshim" in r.getMessage()]) == 1
    assert flow.metadata["toolshim"]["failed"] is True


def test_live_flow_written_with_w_holds_the_repaired_body(upstream, tmp_path):
    upstream.add("k2-saved", chunks=[BODY])
    out_file = tmp_path / "live.flow"
    with Mitmdump(upstream.url, extra_args=["-w", str(out_file)]) as proxy:
        response = httpx.post(f"{proxy.base_url}/chat/completions", json={"model": "k2-saved", "messages": [], "stream": True})
        assert response.status_code == 200
    [flow] = read_flows(out_file)
    assert flow.response.raw_content == response.content
    assert flow.metadata["toolshim"]["upstream"] == BODY
    assert [c["id"] for c in check_chat_stream(flow.response.raw_content)["tool_calls"]] == ["functions.bash:15", "functions.read_file:16"]


STRICT_TOOL = {"type": "function", "function": {"name": "set_temp", "strict": True,
               "parameters": {"type": "object", "properties": {"celsius": {"type": "number"}}, "required": ["celsius"], "additionalProperties": False}}}


def json_flow(path, request: dict, response: dict):
    import json

    flow = tflow.tflow(req=tutils.treq(method=b"POST", path=path.encode(), content=json.dumps(request).encode()),
                       resp=tutils.tresp(content=json.dumps(response).encode()))
    flow.response.headers["content-type"] = "application/json"
    return flow


def test_a_strict_failure_in_a_buffered_body_leaves_it_unchanged_and_is_logged(caplog):
    from harness import chat_completion

    block = '<tool_call>{"name": "set_temp", "arguments": {"celsius": "warm"}}</tool_call>'
    flow = json_flow("/v1/chat/completions", {"model": "m", "messages": [], "tools": [STRICT_TOOL]}, chat_completion("m", content=block))
    before = flow.response.raw_content
    addon = ToolShim()
    with taddons.context(addon), caplog.at_level(logging.INFO):
        addon.requestheaders(flow)
        addon.request(flow)
        addon.responseheaders(flow)
        addon.response(flow)
    assert flow.response.raw_content == before
    assert any("strict_failure: set_temp" in r.getMessage() for r in caplog.records)


def test_responses_paths_are_rewritten_and_required_action_is_an_option():
    from responses import responses_events, responses_sse

    tools = [{"type": "function", "name": "set_temp", "parameters": {"type": "object"}}]
    body = responses_sse(responses_events("m", ['<tool_call>{"name": "set_temp", "arguments": {"celsius": 21}}</tool_call>'], tools=tools))
    for required_action in (False, True):
        addon = ToolShim()
        with taddons.context(addon) as tctx:
            tctx.configure(addon, toolshim_required_action=required_action)
            flow = chat_flow(path="/v1/responses")
            flow.request.content = b'{"model": "m", "input": "hi", "tools": [{"type": "function", "name": "set_temp"}]}'
            out = run_stream(addon, flow, [body[:200], body[200:]])
        assert (b"response.required_action" in out) == required_action
        assert b'"type":"function_call"' in out and b"<tool_call>" not in out
        assert flow.metadata["toolshim"]["names"] == ["set_temp"]


def test_emulation_option_is_validated():
    addon = ToolShim()
    with taddons.context(addon) as tctx:
        with pytest.raises(exceptions.OptionsError):
            tctx.configure(addon, toolshim_emulate="(")


def test_emulated_flow_rewrites_the_request_and_records_telemetry(caplog):
    import json

    from harness import chat_completion

    request = {"model": "textonly-1", "messages": [{"role": "user", "content": "hi"}], "tools": [STRICT_TOOL], "tool_choice": "required"}
    flow = json_flow("/v1/chat/completions", request, chat_completion("textonly-1", content="No tool."))
    addon = ToolShim()
    with taddons.context(addon) as tctx, caplog.at_level(logging.INFO):
        tctx.configure(addon, toolshim_emulate="^textonly-")
        addon.requestheaders(flow)
        addon.request(flow)
        sent = json.loads(flow.request.content)
        assert "tools" not in sent and "tool_choice" not in sent
        assert flow.request.headers["content-length"] == str(len(flow.request.content))
        addon.responseheaders(flow)
        addon.response(flow)
    info = flow.metadata["toolshim"]
    assert info["emulated"]["tools"] == ["set_temp"]
    assert info["required_call_missing"] is True and info["calls"] == 0
    assert any("emulating tools" in r.getMessage() for r in caplog.records)
    assert any("demanded a call" in r.getMessage() for r in caplog.records)


def test_offline_flows_and_other_models_are_not_emulated():
    import json

    from harness import chat_completion

    request = {"model": "other-model", "messages": [], "tools": [STRICT_TOOL]}
    for flow in (
        json_flow("/v1/chat/completions", request, chat_completion("other-model", content="x")),
        json_flow("/v1/chat/completions", {**request, "model": "textonly-2"}, chat_completion("textonly-2", content="x")),
    ):
        original = flow.request.content
        flow.live = json.loads(original)["model"] == "other-model"  # the second one is offline
        addon = ToolShim()
        with taddons.context(addon) as tctx:
            tctx.configure(addon, toolshim_emulate="^textonly-")
            addon.requestheaders(flow)
            addon.request(flow)
        assert flow.request.content == original


def test_dialects_option_forces_the_set_and_refuses_unknown_names():
    addon = ToolShim()
    with taddons.context(addon) as tctx:
        with pytest.raises(exceptions.OptionsError):
            tctx.configure(addon, toolshim_dialects="kimi,klingon")
        tctx.configure(addon, toolshim_dialects="hermes")
        flow = chat_flow()
        out = run_stream(addon, flow, [BODY])
    result = check_chat_stream(out)
    assert result["tool_calls"] == []  # Kimi markup is not read when only hermes runs
    assert "<|tool_call_begin|>" in result["reasoning_content"]


def test_an_answer_another_addon_set_whole_is_rewritten_in_response():
    """Server replay and map_local answer in the `request` hook: nothing streams, so the
    body is rewritten whole, as an offline flow's is."""
    addon = ToolShim()
    with taddons.context(addon):
        flow = chat_flow()
        addon.requestheaders(flow)
        addon.request(flow)
        flow.response.content = BODY  # what server replay does in its `request` hook
        addon.responseheaders(flow)
        assert not flow.response.stream
        addon.response(flow)
        assert [c["name"] for c in check_chat_stream(flow.response.content)["tool_calls"]] == ["bash", "read_file"]
        assert flow.metadata["toolshim"]["upstream"] == BODY


def test_options_set_while_running_reach_the_next_flow_and_refused_ones_do_not():
    """The hooks read the options from a copy taken when they change (`FlowOptions`)."""
    addon = ToolShim()
    with taddons.context(addon) as tctx:
        first = chat_flow()
        run_stream(addon, first, [BODY])
        assert first.metadata["toolshim"]["upstream"] == BODY
        tctx.configure(addon, toolshim_keep_upstream=False, toolshim_max_held=4096)
        second = chat_flow()
        addon.requestheaders(second)
        addon.request(second)
        addon.responseheaders(second)
        assert second.response.stream.rewriter._max_held == 4096
        with pytest.raises(exceptions.OptionsError):
            tctx.configure(addon, toolshim_max_held=10)
        with pytest.raises(exceptions.OptionsError):
            tctx.configure(addon, toolshim_reasoning_field="thoughts")
        third = chat_flow()
        run_stream(addon, third, [BODY])
        assert "upstream" not in third.metadata["toolshim"] and third.metadata["toolshim"]["calls"] == 2
        tctx.configure(addon, toolshim_enabled=False)
        fourth = chat_flow()
        addon.requestheaders(fourth)
        assert fourth.id not in addon._flows


_NAMES = st.sampled_from([b"Content-Type", b"content-encoding", b"Content-Length", b"Transfer-Encoding", b"transfer-encoding", b"X-Other"])
_VALUES = st.sampled_from([b"text/event-stream", b"gzip", b"chunked", b"12", b"", b"\xff\xfe"])


@given(st.lists(st.tuples(_NAMES, _VALUES), max_size=7), st.booleans())
def test_the_header_edits_are_mitmproxys_own(fields, chunked):
    """`header` and `frame_as_rewritten` read and edit the raw fields in one pass: the same
    values and fields as mitmproxy's `headers.get`, `pop` and `headers[name] = value`."""
    theirs, ours = http.Headers(tuple(fields)), http.Headers(tuple(fields))
    for name in (b"content-type", b"content-encoding", b"transfer-encoding"):
        assert header(ours, name) == theirs.get(name.decode(), "")
    theirs.pop("content-encoding", None)
    theirs.pop("content-length", None)
    if chunked:
        theirs["transfer-encoding"] = "chunked"
    frame_as_rewritten(ours, chunked)
    assert ours.fields == theirs.fields
