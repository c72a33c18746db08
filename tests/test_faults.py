"""The design's invariants under faults, bad input and load, through a real mitmdump.

Each case runs a scripted upstream through mitmdump with the addon and asserts what the client
receives: every character of non-markup text and every complete call reaches it, malformed
pieces pass through unchanged, and no exception reaches mitmproxy (its log has no addon error
lines); where it matters, that the flow's state was freed and memory stayed bounded. Raw HTTP
clients read what arrives byte for byte; the OpenAI SDK shows a real client copes.

Covered elsewhere, so not repeated here: chunked / content-length / read-until-close framings
and gzip despite `identity` (`test_e2e_chat.py::test_framings_and_compression_give_the_same_result`),
error answers (`test_error_responses_pass_byte_for_byte`; here once more, compressed and in
pieces), every byte boundary and every byte its own read (`test_every_byte_*`).

The file runs its own mitmdump (`shim`): its log must hold only these cases, it loads
`flow_probe.py` (which logs how many flows toolshim still keeps state for), it keeps
mitmproxy's CA in a temporary confdir for the HTTP/2 client to trust, and it sets
`toolshim_max_held` to its floor, 1024 characters.
"""

from __future__ import annotations

import gzip
import json
import re
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import brotli
import httpx
import openai
import pytest
import zstandard
from openai.lib.streaming.chat import ChatCompletionStreamState

from harness import Mitmdump, ScriptedUpstream, chat_chunk, split_bytes, sse_body
from kimi import ARG_BEGIN, CALL_BEGIN, CALL_END, SECTION_BEGIN, SECTION_END, SEED_000, USAGE, kimi_chunks
from responses import responses_events, responses_sse
from wire import check_chat_stream, check_responses_stream

PROBE = Path(__file__).with_name("flow_probe.py")
MAX_HELD = 1024

MESSAGES = [{"role": "user", "content": "What is in /usr/include/asm?"}]
STRING = {"type": "string"}
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": STRING}}}},
    {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"path": STRING}}}},
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": STRING}}}},
]
RESPONSES_TOOLS = [{"type": "function", **tool["function"]} for tool in CHAT_TOOLS]
SEED_CALLS = [
    ("functions.bash:15", "bash", '{"command":  "ls -la /usr/include | grep asm"}'),
    ("functions.read_file:16", "read_file", '{"path": "/usr/include/asm/unistd.h"}'),
]


def hermes(city: str) -> str:
    return f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>'


# -- the proxy and its log ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def confdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mitmproxy's configuration directory: it writes its CA there at startup."""
    return tmp_path_factory.mktemp("mitmproxy-confdir")


@pytest.fixture(scope="module")
def shim(upstream: ScriptedUpstream, confdir: Path) -> Iterator[Mitmdump]:
    args = ["-s", str(PROBE), "--set", f"confdir={confdir}", "--set", f"toolshim_max_held={MAX_HELD}"]
    with Mitmdump(upstream.url, extra_args=args) as proc:
        yield proc


class ProxyLog:
    """mitmdump's log from the start of one case."""

    ADDON_ERRORS = re.compile(r"Traceback|mitmproxy has crashed|Addon error|Error in script")
    FAIL_OPEN = re.compile(r"toolshim: rewriting .* failed")

    def __init__(self, proxy: Mitmdump) -> None:
        self.proxy = proxy
        self.start = len(proxy.log_lines())

    def lines(self) -> list[str]:
        return self.proxy.log_lines()[self.start :]

    def wait_for(self, text: str, count: int = 1, timeout: float = 10.0) -> list[str]:
        """The lines holding `text`, once there are `count` (mitmdump's output reaches us from a
        reader thread: a line the proxy wrote before answering may arrive after the answer)."""
        deadline = time.monotonic() + timeout
        while True:
            found = [line for line in self.lines() if text in line]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.02)

    def probes(self, model: str, count: int = 1, timeout: float = 10.0) -> list[tuple[str, int]]:
        """Wait for `count` flows of `model` to be done; (hook, flows toolshim still holds) each."""
        pattern = re.compile(rf"flow-probe: (\w+) {re.escape(model)} open=(\d+)$")
        deadline = time.monotonic() + timeout
        while True:
            found = [(m[1], int(m[2])) for line in self.lines() if (m := pattern.search(line))]
            if len(found) >= count or time.monotonic() > deadline:
                assert len(found) >= count, f"{len(found)} of {count} flows of {model} done:\n" + "\n".join(self.lines())
                return found
            time.sleep(0.02)

    def assert_no_addon_errors(self, fail_open: int = 0) -> None:
        """No exception reached mitmproxy; exactly `fail_open` flows failed open (each logs one
        warning, with its traceback)."""
        lines = self.lines()
        assert len([line for line in lines if self.FAIL_OPEN.search(line)]) == fail_open, "\n".join(lines)
        errors = [line for line in lines if self.ADDON_ERRORS.search(line)]
        if fail_open:
            errors = [line for line in errors if "Traceback" not in line]
        assert not errors, "\n".join(lines)


@pytest.fixture
def log(shim: Mitmdump) -> ProxyLog:
    return ProxyLog(shim)


# -- clients --------------------------------------------------------------------------------------


def chat_request(model: str) -> dict:
    return {"model": model, "messages": MESSAGES, "stream": True, "tools": CHAT_TOOLS}


def responses_request(model: str) -> dict:
    return {"model": model, "input": "Weather?", "stream": True, "tools": RESPONSES_TOOLS}


def post(proxy: Mitmdump, model: str, api: str = "chat/completions") -> httpx.Response:
    body = responses_request(model) if api == "responses" else chat_request(model)
    response = httpx.post(f"{proxy.base_url}/{api}", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response


def read_until_cut(proxy: Mitmdump, model: str) -> tuple[bytes, Exception | None]:
    """The body bytes that arrived, and the error that ended the body, if one did."""
    pieces: list[bytes] = []
    with httpx.stream("POST", f"{proxy.base_url}/chat/completions", json=chat_request(model), timeout=30) as response:
        try:
            for piece in response.iter_bytes():
                pieces.append(piece)
        except httpx.HTTPError as exc:
            return b"".join(pieces), exc
    return b"".join(pieces), None


def sdk_result(proxy: Mitmdump, model: str):
    """What openai-python builds from the stream: (message, finish_reason)."""
    with openai.OpenAI(base_url=proxy.base_url, api_key="sk-test", max_retries=0, timeout=30) as client:
        state = ChatCompletionStreamState()
        for chunk in client.chat.completions.create(model=model, messages=MESSAGES, tools=CHAT_TOOLS, stream=True):
            state.handle_chunk(chunk)
        choice = state.get_final_completion().choices[0]
    return choice.message, choice.finish_reason


def calls_of(result: dict) -> list[tuple[str, str, str]]:
    return [(c["id"], c["name"], c["arguments"]) for c in result["tool_calls"]]


def sdk_calls(message) -> list[tuple[str, str, str]]:
    return [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []]


def events(body: bytes) -> list[bytes]:
    """An SSE body (LF line ends) cut into its events, for one upstream write each."""
    return [block + b"\n\n" for block in body.split(b"\n\n") if block]


def sse_blocks(body: bytes) -> list[bytes]:
    return re.findall(rb".*?(?:\r\n\r\n|\n\n|\r\r)", body, re.S)


def response_deltas(body: bytes) -> tuple[str, list[dict]]:
    """A Responses stream without its terminal event: (text of the output_text deltas, the
    function_call items done)."""
    text, calls = "", []
    for block in sse_blocks(body):
        data = "\n".join(line[5:].strip() for line in block.decode().splitlines() if line.startswith("data:"))
        event = json.loads(data)
        if event["type"] == "response.output_text.delta":
            text += event["delta"]
        elif event["type"] == "response.output_item.done" and event["item"]["type"] == "function_call":
            calls.append(event["item"])
    return text, calls


# -- the upstream fails mid-stream ----------------------------------------------------------------


def test_upstream_closing_mid_event_passes_the_cut_event_on_as_it_came(upstream, shim, log, unique_model):
    body = sse_body(kimi_chunks(unique_model, SEED_000), done=False)
    cut = len(body) - 40  # inside the last event, the usage chunk
    tail = body[body.rindex(b"\n\n", 0, cut) + 2 : cut]
    upstream.add(unique_model, chunks=split_bytes(body[:cut], range(0, cut, 200)), framing="close", delay=0.001)

    received = post(shim, unique_model).content
    assert received.endswith(b"\n\n" + tail)  # the unterminated event, byte for byte, last
    result = check_chat_stream(received[: -len(tail)])
    assert calls_of(result) == SEED_CALLS and result["finish_reason"] == "tool_calls"
    assert result["reasoning_content"] == "I will list the headers."
    # openai-python drops the unterminated event, as the SSE spec says, and has both calls
    message, finish = sdk_result(shim, unique_model)
    assert sdk_calls(message) == SEED_CALLS and finish == "tool_calls"

    assert log.probes(unique_model, 2) == [("response", 0), ("response", 0)]
    log.assert_no_addon_errors()


def test_upstream_dying_inside_a_chunk_leaves_the_client_every_event_before_it(upstream, shim, log, unique_model):
    chunks = kimi_chunks(unique_model, SEED_000)
    second_call = SEED_000.index(" functions.read_file:16")
    before = sse_body(chunks[: 1 + second_call], done=False)  # the role chunk, then up to the second header
    after = sse_body(chunks[1 + second_call :])
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    # a whole chunk, then one announcing 500 bytes of which 60 arrive: the connection dies
    wire = [head, b"%x\r\n%s\r\n" % (len(before), before), b"1f4\r\n" + after[:60]]
    upstream.add(unique_model, chunks=wire, raw=True, delay=0.05)

    received, error = read_until_cut(shim, unique_model)
    assert isinstance(error, httpx.RemoteProtocolError)  # the client learns the body is incomplete
    result = check_chat_stream(received)
    assert result["reasoning_content"] == "I will list the headers."
    assert calls_of(result)[0] == SEED_CALLS[0]  # the complete call, whole
    assert log.probes(unique_model) == [("error", 0)]  # the flow's state is freed
    log.assert_no_addon_errors()


def test_upstream_closing_mid_call_keeps_the_call_begun_and_its_arguments(upstream, shim, log, unique_model):
    pieces = ["Let me look.", " " + SECTION_BEGIN, CALL_BEGIN, "functions.bash:0", ARG_BEGIN, '{"command": ', '"ls -la']
    chunks = kimi_chunks(unique_model, pieces, fields=("content",), usage=None)[:-1]  # no finish_reason, no [DONE]
    upstream.add(unique_model, chunks=events(sse_body(chunks, done=False)), framing="close", delay=0.005)

    result = check_chat_stream(post(shim, unique_model).content)
    assert result["content"] == "Let me look."
    # the call was streamed live: its start and every argument byte upstream sent are there
    assert calls_of(result) == [("functions.bash:0", "bash", '{"command": "ls -la')]
    assert result["finish_reason"] is None and not result["done"]  # and nothing was invented
    assert log.probes(unique_model) == [("response", 0)]
    log.assert_no_addon_errors()


def test_upstream_closing_inside_a_held_block_releases_it_as_text(upstream, shim, log, unique_model):
    """Responses API: a `<tool_call>` block is held until it closes; cut, it is text again."""
    cut_block = '<tool_call>{"name": "get_weather", "arg'
    stream = responses_events(unique_model, ["Hi. ", hermes("Paris"), " and ", cut_block[:15], cut_block[15:]], tools=RESPONSES_TOOLS)
    ends = ("response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed")
    upstream.add(unique_model, chunks=events(responses_sse(e for e in stream if e["type"] not in ends)), framing="close", delay=0.005)

    text, calls = response_deltas(post(shim, unique_model, "responses").content)
    assert text == "Hi.  and " + cut_block
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert log.probes(unique_model) == [("response", 0)]
    log.assert_no_addon_errors()


def test_upstream_closing_mid_utf8_sequence(upstream, shim, log, unique_model):
    """Reads are cut inside every multi-byte character, and the body ends inside one: each
    character arrives whole, and the cut bytes of the last event arrive as they were."""
    pieces = ["Größe ", "日本語の", "テキスト ", "🙂🙃 ", hermes("Zürich"), " ünïcödé"]
    chunks = kimi_chunks(unique_model, pieces, fields=("content",), usage=None)[:-1]  # no finish_reason
    last = sse_body([chat_chunk(unique_model, content="and 🙃 more")], done=False)
    tail = last[: last.index("🙃".encode()) + 2]  # half an emoji: the stream dies there
    body = sse_body(chunks, done=False) + tail
    text = body.decode("utf-8", errors="ignore")
    cuts = [len(text[:i].encode()) + 1 for i, char in enumerate(text) if len(char.encode()) > 1]
    upstream.add(unique_model, chunks=split_bytes(body, cuts), framing="close", delay=0.001)

    received = post(shim, unique_model).content
    assert received.endswith(tail) and tail.endswith(b"\xf0\x9f")
    result = check_chat_stream(received[: -len(tail)])
    assert result["content"] == "Größe 日本語のテキスト 🙂🙃  ünïcödé"
    assert [(c["name"], json.loads(c["arguments"])) for c in result["tool_calls"]] == [("get_weather", {"city": "Zürich"})]
    log.assert_no_addon_errors()


# -- the client goes away -------------------------------------------------------------------------


def test_client_disconnecting_mid_stream_frees_the_flow_state_quietly(upstream, shim, log, unique_model):
    chunks = kimi_chunks(unique_model, SEED_000)
    upstream.add(unique_model, chunks=[sse_body([c], done=False) for c in chunks], delay=0.05)  # ~1.3 s of stream
    request = json.dumps(chat_request(unique_model)).encode()
    with socket.create_connection(("127.0.0.1", shim.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(request), request)
        )
        received = b""
        while b'"tool_calls"' not in received:  # the first call has begun: the rewriter is mid-call
            data = sock.recv(65536)
            assert data, received
            received += data
    # the client is gone while upstream still sends
    assert log.probes(unique_model) == [("error", 0)]
    time.sleep(0.3)  # upstream's next writes find the connection closed
    lines = log.lines()
    own = [line for line in lines if "toolshim" in line and "flow-probe" not in line]
    assert len(own) <= 1, "\n".join(lines)  # at most one line about it, no error spam
    assert not [line for line in lines if re.search(r"(?i)error|warn|exception", line) and "flow-probe" not in line]
    log.assert_no_addon_errors()


# -- encodings and transports ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "encoding, compress",
    [("br", brotli.compress), ("zstd", lambda b: zstandard.ZstdCompressor().compress(b)), ("deflate", zlib.compress)],
    ids=["br", "zstd", "deflate"],
)
def test_compressed_answers_despite_identity_are_decoded_in_flight(upstream, shim, log, unique_model, encoding, compress):
    body = compress(sse_body(kimi_chunks(unique_model, SEED_000)))
    upstream.add(unique_model, headers={"content-type": "text/event-stream", "content-encoding": encoding},
                 chunks=split_bytes(body, range(0, len(body), 50)), delay=0.001)
    response = post(shim, unique_model)
    assert "content-encoding" not in response.headers  # the client gets what it is told it gets
    result = check_chat_stream(response.content)
    assert calls_of(result) == SEED_CALLS and result["usage"] == USAGE and result["done"]
    assert upstream.requests_for(unique_model)[-1].headers["accept-encoding"] == "identity"
    log.assert_no_addon_errors()


def test_an_encoding_that_cannot_be_decoded_passes_through_unchanged(upstream, shim, log, unique_model):
    body = b"\x00\x01 an opaque coding " + sse_body(kimi_chunks(unique_model, SEED_000))
    upstream.add(unique_model, headers={"content-type": "text/event-stream", "content-encoding": "x-opaque"}, chunks=[body])
    response = post(shim, unique_model)
    assert response.headers["content-encoding"] == "x-opaque" and response.content == body
    assert log.probes(unique_model) == [("response", 0)]  # the flow is over: its lines are all in
    assert len([line for line in log.lines() if "x-opaque-encoded" in line]) == 1
    log.assert_no_addon_errors()


def test_a_body_that_is_not_the_gzip_it_claims_fails_open(upstream, shim, log, unique_model):
    body = b"\x1f\x8b but no gzip follows " + sse_body(kimi_chunks(unique_model, SEED_000))
    upstream.add(unique_model, headers={"content-type": "text/event-stream", "content-encoding": "gzip"},
                 chunks=split_bytes(body, range(0, len(body), 300)), delay=0.001)
    assert post(shim, unique_model).content == body  # every byte, as it came
    assert log.probes(unique_model) == [("response", 0)]
    log.assert_no_addon_errors(fail_open=1)  # one warning for the flow, and mitmproxy unharmed


class H2FirstContext(ssl.SSLContext):
    """httpcore offers ALPN `http/1.1` before `h2`, and mitmproxy honours the client's order;
    curl and browsers list `h2` first, as this context does."""

    def set_alpn_protocols(self, protocols):
        super().set_alpn_protocols(sorted(protocols, key=lambda p: p != "h2"))


def test_http2_client_over_tls_gets_the_repaired_stream(upstream, shim, confdir, log, unique_model):
    # content-length upstream: a length left on an HTTP/2 answer whose body changed is a
    # PROTOCOL_ERROR for the client
    upstream.add(unique_model, chunks=[sse_body(kimi_chunks(unique_model, SEED_000))], framing="content-length")
    context = H2FirstContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(confdir / "mitmproxy-ca-cert.pem")  # its certificates name 127.0.0.1
    with httpx.Client(http2=True, verify=context, timeout=30) as http:
        url = f"https://127.0.0.1:{shim.port}/v1"
        response = http.post(f"{url}/chat/completions", json=chat_request(unique_model))
        assert response.http_version == "HTTP/2" and response.status_code == 200
        assert "content-length" not in response.headers and "transfer-encoding" not in response.headers
        result = check_chat_stream(response.content)
        assert calls_of(result) == SEED_CALLS and result["usage"] == USAGE
        with openai.OpenAI(base_url=url, api_key="sk-test", max_retries=0, http_client=http) as client:
            state = ChatCompletionStreamState()
            for chunk in client.chat.completions.create(model=unique_model, messages=MESSAGES, tools=CHAT_TOOLS, stream=True):
                state.handle_chunk(chunk)
            choice = state.get_final_completion().choices[0]
    assert sdk_calls(choice.message) == SEED_CALLS and choice.finish_reason == "tool_calls"
    assert log.probes(unique_model, 2) == [("response", 0), ("response", 0)]
    log.assert_no_addon_errors()


def h2_request(conn, sock: ssl.SSLSocket, stream_id: int, model: str) -> None:
    body = json.dumps(chat_request(model)).encode()
    conn.send_headers(stream_id, [(":method", "POST"), (":path", "/v1/chat/completions"), (":scheme", "https"),
                                  (":authority", "127.0.0.1"), ("content-type", "application/json"),
                                  ("content-length", str(len(body)))])  # fmt: skip
    conn.send_data(stream_id, body, end_stream=True)
    sock.sendall(conn.data_to_send())


def h2_read(conn, sock: ssl.SSLSocket, until) -> dict[int, bytes]:
    """Read frames (acknowledging data) until `until(bodies, ended)` holds."""
    import h2.events

    bodies: dict[int, bytes] = {}
    ended: set[int] = set()
    while not until(bodies, ended):
        data = sock.recv(65536)
        assert data, bodies
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.DataReceived):
                bodies[event.stream_id] = bodies.get(event.stream_id, b"") + event.data
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                ended.add(event.stream_id)
        sock.sendall(conn.data_to_send())
    return bodies


def test_http2_stream_reset_mid_stream_frees_its_state_and_spares_the_connection(upstream, shim, confdir, log, unique_model):
    """An HTTP/2 client cancels one stream (RST_STREAM) mid-call and goes on using the
    connection: the cancelled flow's state is freed, the next stream is repaired whole."""
    import h2.config
    import h2.connection

    first, second = f"{unique_model}-reset", f"{unique_model}-after"
    chunks = kimi_chunks(first, SEED_000)
    # empty pieces inside the first call's arguments: ~10 s of stream left when the name is out,
    # so the reset lands mid-stream on the slowest machine
    blank = {**chunks[10], "choices": [{**chunks[10]["choices"][0], "delta": {"reasoning": "", "reasoning_content": ""}}]}
    chunks[11:11] = [blank] * 200
    upstream.add(first, chunks=[sse_body([c], done=False) for c in chunks], delay=0.05)
    upstream.add(second, chunks=[sse_body(kimi_chunks(second, SEED_000))])
    context = H2FirstContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(confdir / "mitmproxy-ca-cert.pem")
    context.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", shim.port), timeout=10) as raw, context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        assert sock.selected_alpn_protocol() == "h2"
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        h2_request(conn, sock, 1, first)
        h2_read(conn, sock, lambda bodies, ended: b'"tool_calls"' in bodies.get(1, b""))  # mid-call
        conn.reset_stream(1)
        sock.sendall(conn.data_to_send())
        assert log.probes(first) == [("error", 0)]
        h2_request(conn, sock, 3, second)
        bodies = h2_read(conn, sock, lambda bodies, ended: 3 in ended)
    result = check_chat_stream(bodies[3])
    assert calls_of(result) == SEED_CALLS and result["usage"] == USAGE and result["done"]
    assert log.probes(second) == [("response", 0)]
    assert not [line for line in log.lines() if re.search(r"(?i)warn|exception", line) and "flow-probe" not in line]
    log.assert_no_addon_errors()


# -- SSE syntax -----------------------------------------------------------------------------------


@pytest.mark.parametrize("line_end", ["\r\n", "\r"], ids=["crlf", "cr"])
def test_crlf_and_cr_line_ends(upstream, shim, log, unique_model, line_end):
    body = sse_body(kimi_chunks(unique_model, SEED_000)).replace(b"\n", line_end.encode())
    upstream.add(unique_model, chunks=split_bytes(body, range(0, len(body), 61)), delay=0.001)
    received = post(shim, unique_model).content
    assert received.startswith(sse_blocks(body)[0])  # an event needing no change keeps its line ends
    assert calls_of(check_chat_stream(received)) == SEED_CALLS
    message, finish = sdk_result(shim, unique_model)
    assert sdk_calls(message) == SEED_CALLS and finish == "tool_calls"
    assert message.model_extra["reasoning_content"] == "I will list the headers."
    log.assert_no_addon_errors()


def test_comment_and_keep_alive_lines_fields_and_multi_line_data(upstream, shim, log, unique_model):
    chunks = [json.dumps(c, separators=(",", ":")) for c in kimi_chunks(unique_model, SEED_000, fields=("content",))]
    blocks = [": keep-alive\n\n", "retry: 3000\n\n"]
    for n, chunk in enumerate(chunks):
        if n % 3 == 0:  # a comment, an id, an event name, and the JSON over two data lines
            half = chunk.index('"choices"')
            blocks.append(f": chunk {n}\nid: {n}\nevent: message\ndata: {chunk[:half]}\ndata: {chunk[half:]}\n\n")
        elif n % 3 == 1:
            blocks.append(f"id: {n}\ndata:{chunk}\n\n")  # no space after the colon
        else:
            blocks.append(f"data: {chunk}\n\n")
        blocks.append(": ping\n\n")
    blocks.append("data: [DONE]\n\n")
    upstream.add(unique_model, chunks=[b.encode() for b in blocks], delay=0.001)

    received = post(shim, unique_model).content
    result = check_chat_stream(received)
    assert result["content"] == "I will list the headers."
    assert calls_of(result) == SEED_CALLS and result["usage"] == USAGE and result["done"]
    # keep-alives, `retry:`, and the events before the markup (fields, comment, two data
    # lines and all) arrive as they were sent
    assert received.startswith("".join(blocks[:6]).encode())
    assert received.count(b": ping\n\n") == len(chunks)
    # every `id:` reaches the client in order, on the event sent in its event's place (or the
    # next one, when the event was held), and `retry:` as it was
    ids = re.findall(rb"(?m)^id: (\d+)$", received)
    assert ids == [str(n).encode() for n in range(len(chunks)) if n % 3 != 2]
    assert received.count(b"retry: 3000\n") == 1
    log.assert_no_addon_errors()


def test_responses_ids_go_forward_through_held_and_rewritten_events(upstream, shim, log, unique_model):
    """Responses API with an `id:` line on every event, their line ends mixed: the item and part
    announcements are held until the first text, a `<tool_call>` block is held and rewritten
    into a call. The client's ids only go forward, none twice, ending on upstream's last, and
    the SDK builds the call."""
    block = hermes("Paris")
    stream = responses_events(unique_model, ["Let me check. ", block[:9], block[9:30], block[30:], " Done."], tools=RESPONSES_TOOLS)
    raws = [raw.partition(b"\n")[2] for raw in events(responses_sse(stream))]  # no `event:` lines: one line each
    line_ends = ["\r", "\n", "\r\n"]  # the last one CR: its event (response.completed) is rewritten
    blocks = [f"id: {n}{line_ends[(n - len(raws) + 1) % 3]}".encode() + raw for n, raw in enumerate(raws)]
    upstream.add(unique_model, chunks=blocks, delay=0.001)

    received = post(shim, unique_model, "responses").content
    check_responses_stream(received)
    ids = [int(n) for n in re.findall(rb"(?:^|(?<=[\r\n]))id: (\d+)(?=[\r\n])", received)]
    assert ids == sorted(set(ids)) and ids[-1] == len(blocks) - 1
    with openai.OpenAI(base_url=shim.base_url, api_key="sk-test", max_retries=0, timeout=30) as client:
        with client.responses.stream(model=unique_model, input="Weather?", tools=RESPONSES_TOOLS) as sdk_stream:
            final = sdk_stream.get_final_response()
    assert [(item.name, json.loads(item.arguments)) for item in final.output if item.type == "function_call"] == [("get_weather", {"city": "Paris"})]
    assert final.output_text == "Let me check.  Done."
    log.assert_no_addon_errors()


# -- bad input ------------------------------------------------------------------------------------


def peak_rss_kib(pid: int, *, reset: bool = False) -> int:
    """The process's peak resident memory (VmHWM, from Linux's /proc: the suite runs on Linux,
    as CI does); `reset` restarts the peak at the current size (`clear_refs` 5), where allowed."""
    if reset:
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        except OSError:
            pass  # the peak then covers earlier cases too: the bound below still holds
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status)[1])


def test_a_10_mb_single_event_passes_whole_in_bounded_memory(upstream, shim, log, unique_model):
    big = "".join(f"line {n}: plain text, no markup.\n" for n in range(350_000))[: 10 << 20]
    call = f" {CALL_BEGIN}functions.bash:1{ARG_BEGIN}{{\"command\": \"ls\"}}{CALL_END}"
    chunks = kimi_chunks(unique_model, ["Hello.", big, call], fields=("content",))
    body = sse_body(chunks)
    big_event = sse_body([chunks[2]], done=False)
    upstream.add(unique_model, chunks=[body], framing="content-length")  # mitmproxy reads it in 64 KiB pieces
    pid = shim.pid
    before = peak_rss_kib(pid, reset=True)

    received = post(shim, unique_model).content

    assert big_event in received  # the event passed whole, byte for byte
    result = check_chat_stream(received)
    assert result["content"] == "Hello." + big and [c["name"] for c in result["tool_calls"]] == ["bash"]
    # Linear work is counted, not timed, in the next test (reads that copied and rescanned the
    # held event took seconds here).
    # A few copies of the body (~6 here: the flow keeps what came and what was sent), not one
    # per read.
    assert peak_rss_kib(pid) - before < 12 * 10 * 1024, (before, peak_rss_kib(pid))
    log.assert_no_addon_errors()


def test_a_long_event_in_many_reads_is_framed_in_linear_work(monkeypatch):
    """The 10 MB case, counted instead of timed: with the fast path on (plain content seen), an
    event arriving in many reads is scanned once, not once per read."""
    from toolshim import sse
    from toolshim.chat import ChatStreamRewriter
    from toolshim.tools import RequestContext

    scanned = 0
    cut = sse.SseFramer._cut

    def counting_cut(framer, final):
        nonlocal scanned
        scanned += len(framer._buf) - framer._scan
        return cut(framer, final)

    monkeypatch.setattr(sse.SseFramer, "_cut", counting_cut)
    rewriter = ChatStreamRewriter(RequestContext())
    assert rewriter.feed(sse_body([chat_chunk("m", content="Hello.")], done=False))
    event = sse_body([chat_chunk("m", content="x" * (1 << 20))], done=False)
    out = [piece for at in range(0, len(event), 1024) for piece in rewriter.feed(event[at : at + 1024])]
    assert b"".join(out) == event
    assert scanned < 2 * len(event), scanned


JUNK = [
    b"data: hello world, not JSON\n\n",
    b"data: [1, 2, 3]\n\n",
    b"data: 42\n\n",
    b'data: "a string"\n\n',
    b"data: null\n\n",
    b'data: {"choices": 5, "type": 7}\n\n',
    b'data: {"error": {"message": "overloaded <|tool_call_begin|>functions.bash:0"}}\n\n',
    b'data: {"type": "x", "delta": "\xff\xfe not UTF-8 <tool_call>{\\"name\\": \\"bash\\"}</tool_call>"}\n\n',
    b"data: [DONE-ish\n\n",
    b"event: \xc3\n\n",
]


@pytest.mark.parametrize("api", ["chat/completions", "responses"])
def test_non_json_scalar_array_error_and_invalid_utf8_events_pass_unchanged(upstream, shim, log, unique_model, api):
    if api == "responses":
        good = events(responses_sse(responses_events(unique_model, ["Checking. ", hermes("Paris")[:20], hermes("Paris")[20:], " Done."], tools=RESPONSES_TOOLS)))
    else:
        good = events(sse_body(kimi_chunks(unique_model, SEED_000)))
    mixed = [block for pair in zip(good, JUNK + [b""] * len(good)) for block in pair]
    upstream.add(unique_model, headers={"content-type": "text/event-stream"}, chunks=mixed, delay=0.001)

    received = post(shim, unique_model, api).content
    for junk in JUNK:
        assert received.count(junk) == 1, junk  # passed on as it came
        received = received.replace(junk, b"")
    if api == "responses":
        result = check_responses_stream(received)
        assert result["text"] == "Checking.  Done." and [c["name"] for c in result["calls"]] == ["get_weather"]
    else:
        result = check_chat_stream(received)
        assert calls_of(result) == SEED_CALLS and result["reasoning_content"] == "I will list the headers."
    log.assert_no_addon_errors()


def test_done_missing_releases_what_was_held_at_the_end_of_the_body(upstream, shim, log, unique_model):
    # no finish_reason, no usage, no [DONE]: the last block lacks its end tag, which is forgiven
    # once the body ends with its JSON complete
    block = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'
    chunks = kimi_chunks(unique_model, ["Sure. ", block[:25], block[25:]], fields=("content",), usage=None)[:-1]
    upstream.add(unique_model, chunks=[sse_body(chunks, done=False)])
    result = check_chat_stream(post(shim, unique_model).content)
    assert result["content"] == "Sure. " and not result["done"]
    assert [(c["name"], json.loads(c["arguments"])) for c in result["tool_calls"]] == [("get_weather", {"city": "Paris"})]
    log.assert_no_addon_errors()


def test_events_after_done_reach_the_client(upstream, shim, log, unique_model):
    late = [
        sse_body([chat_chunk(unique_model, content="late text")], done=False),
        b": a comment\n\n",
        sse_body([chat_chunk(unique_model, content=hermes("Oslo"))], done=False),
    ]
    body = sse_body(kimi_chunks(unique_model, SEED_000)) + b"".join(late)
    upstream.add(unique_model, chunks=[body])
    received = post(shim, unique_model).content
    before, after = received.split(b"data: [DONE]\n\n")
    assert calls_of(check_chat_stream(before + b"data: [DONE]\n\n")) == SEED_CALLS
    assert after.startswith(late[0] + late[1])  # nothing is cut off after the end
    assert "Oslo" in after.decode()  # the late block reaches the client too, as text or as a call
    message, _ = sdk_result(shim, unique_model)  # the SDK stops at [DONE]
    assert sdk_calls(message) == SEED_CALLS
    log.assert_no_addon_errors()


@pytest.mark.parametrize("status, content_type", [(503, "text/event-stream"), (401, "application/json")])
def test_error_answers_pass_byte_for_byte_compressed_and_leave_no_state(upstream, shim, log, unique_model, status, content_type):
    """Beyond `test_e2e_chat.py`'s error cases: a gzip body in pieces keeps its encoding and bytes."""
    body = b'{"error": {"message": "busy <|tool_call_begin|>functions.bash:0", "code": %d}}' % status
    if content_type == "text/event-stream":
        body = b"event: error\ndata: " + body + b"\n\n"
    compressed = gzip.compress(body, mtime=0)
    upstream.add(unique_model, status=status, headers={"content-type": content_type, "content-encoding": "gzip"},
                 chunks=split_bytes(compressed, range(0, len(compressed), 20)), delay=0.001)
    with httpx.stream("POST", f"{shim.base_url}/chat/completions", json=chat_request(unique_model), timeout=30) as response:
        raw = b"".join(response.iter_raw())
    assert response.status_code == status and response.headers["content-encoding"] == "gzip"
    assert raw == compressed
    assert log.probes(unique_model) == [("response", 0)]
    log.assert_no_addon_errors()


# Markup held while it may still become a call, and never completed: a `<tool_call>` block that
# never closes; a Kimi call whose bare-counter header leaves its tool to be inferred from
# argument keys that never end. (opening, the rest after the prose, the text it is released as)
UNENDING_MARKUP = {
    "hermes": (["<tool_call>", '{"name": "get_weather", "arguments": {"city": "'], ['"}}'], '<tool_call>{"name": "get_weather", "arguments": {"city": "'),
    "kimi": ([SECTION_BEGIN, CALL_BEGIN, "7", ARG_BEGIN, '{"'], ['": 1}', CALL_END, SECTION_END], f'{CALL_BEGIN}7{ARG_BEGIN}{{"'),
}


@pytest.mark.parametrize("api, dialect", [("chat/completions", "hermes"), ("responses", "hermes"), ("chat/completions", "kimi")])
def test_markup_that_never_closes_is_released_as_text_past_the_cap(upstream, shim, log, unique_model, api, dialect):
    """`toolshim_max_held` bounds what a channel holds: past 1024 characters the markup is
    released as text while upstream still streams, and the rest of the stream flows on."""
    opening, rest, released_as = UNENDING_MARKUP[dialect]
    model = f"Kimi-K2-{unique_model}" if dialect == "kimi" else unique_model
    prose = "".join(f"word{n} " for n in range(700))  # ~5000 characters
    then = hermes("Rome") if dialect == "hermes" else f"{SECTION_BEGIN}{CALL_BEGIN}functions.get_weather:8{ARG_BEGIN}{{\"city\": \"Rome\"}}{CALL_END}{SECTION_END}"
    pieces = ["Start. ", *opening, *(prose[i : i + 100] for i in range(0, len(prose), 100)), *rest, " Then: ", then, " End."]
    if api == "responses":
        body = responses_sse(responses_events(model, pieces, tools=RESPONSES_TOOLS))
    else:
        body = sse_body(kimi_chunks(model, pieces, fields=("content",)))
    upstream.add(model, headers={"content-type": "text/event-stream"}, chunks=events(body), delay=0.015)

    request = responses_request(model) if api == "responses" else chat_request(model)
    arrivals: list[tuple[float, bytes]] = []
    with httpx.stream("POST", f"{shim.base_url}/{api}", json=request, timeout=30) as response:
        for piece in response.iter_bytes():
            arrivals.append((time.monotonic(), piece))
    received = b"".join(piece for _, piece in arrivals)
    first_marker = released_as[: released_as.index(">") + 1].encode()  # `<tool_call>`, `<|tool_call_begin|>`
    released = next(t for t, piece in arrivals if first_marker in piece)
    # released once past the cap (~11 of ~60 upstream events, each 15 ms apart), not at the end
    assert arrivals[-1][0] - released > 0.25

    if api == "responses":
        result = check_responses_stream(received)
        text, calls = result["text"], result["calls"]
    else:
        result = check_chat_stream(received)
        text, calls = result["content"], result["tool_calls"]
    assert text.startswith("Start. " + released_as + prose + rest[0]) and text.endswith("End.")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Rome"})]
    log.assert_no_addon_errors()


# -- load -----------------------------------------------------------------------------------------


def test_200_concurrent_streams_of_different_dialects_do_not_cross(upstream, shim, log, unique_model):
    """Kimi (reasoning), Hermes, Qwen3-Coder XML, plain text, and Hermes on the Responses API,
    each stream with its own model, text and arguments, all in flight at once."""
    streams = []
    for n in range(200):
        kind = ("kimi", "hermes", "qwen_xml", "plain", "responses")[n % 5]
        if kind == "kimi":
            model = f"Kimi-K2-{unique_model}-{n}"
            pieces = [f"Plan {n}.", " " + SECTION_BEGIN, CALL_BEGIN, f"functions.bash:{n}", ARG_BEGIN, '{"command": ', f'"echo {n}"', "}", CALL_END, SECTION_END]
            body = sse_body(kimi_chunks(model, pieces))
            expected = (f"Plan {n}.", [(f"functions.bash:{n}", "bash", {"command": f"echo {n}"})])
        elif kind == "hermes":
            model = f"Qwen2.5-{unique_model}-{n}"
            call = hermes(f"City {n}")
            body = sse_body(kimi_chunks(model, [f"Looking up {n}.", call[:17], call[17:40], call[40:], f" Done {n}."], fields=("content",)))
            expected = (f"Looking up {n}. Done {n}.", [(None, "get_weather", {"city": f"City {n}"})])
        elif kind == "qwen_xml":
            model = f"Qwen3-Coder-{unique_model}-{n}"
            text = f"Reading {n}.\n<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/file_{n}.py\n</parameter>\n</function>\n</tool_call>"
            body = sse_body(kimi_chunks(model, [text[i : i + 9] for i in range(0, len(text), 9)], fields=("content",)))
            expected = (f"Reading {n}.", [(None, "read_file", {"path": f"src/file_{n}.py"})])
        elif kind == "plain":
            model = f"plain-{unique_model}-{n}"
            pieces = [f"Just text {n}", ", with a < b", " and [brackets]", f" to {n}."]
            body = sse_body(kimi_chunks(model, pieces, fields=("content",)))
            expected = ("".join(pieces), [])
        else:
            model = f"resp-{unique_model}-{n}"
            call = hermes(f"Town {n}")
            body = responses_sse(responses_events(model, [f"Checking {n}. ", call[:20], call[20:], f" ok {n}"], tools=RESPONSES_TOOLS))
            expected = (f"Checking {n}.  ok {n}", [(None, "get_weather", {"city": f"Town {n}"})])
        upstream.add(model, headers={"content-type": "text/event-stream"}, chunks=events(body), delay=0.01)
        streams.append((kind, model, expected))

    start = threading.Barrier(len(streams), timeout=30)
    limits = httpx.Limits(max_connections=len(streams), max_keepalive_connections=len(streams))
    with httpx.Client(limits=limits, timeout=60) as http:

        def run(stream) -> bytes:
            kind, model, _ = stream
            api = "responses" if kind == "responses" else "chat/completions"
            request = responses_request(model) if kind == "responses" else chat_request(model)
            start.wait()
            response = http.post(f"{shim.base_url}/{api}", json=request)
            assert response.status_code == 200, response.text
            return response.content

        with ThreadPoolExecutor(len(streams)) as pool:
            bodies = list(pool.map(run, streams))

    models = [model for _, model, _ in streams]
    for (kind, model, (text, calls)), received in zip(streams, bodies):
        if kind == "responses":
            result = check_responses_stream(received)
            got_text = result["text"]
            got_calls = [(None, c["name"], json.loads(c["arguments"])) for c in result["calls"]]
        else:
            result = check_chat_stream(received)
            got_text = result["reasoning_content"] if kind == "kimi" else result["content"]
            got_calls = [(c["id"] if kind == "kimi" else None, c["name"], json.loads(c["arguments"])) for c in result["tool_calls"]]
        assert (got_text, got_calls) == (text, calls), model
        # its own model in its events, no other's (bar the names this one begins with: `-1`, `-10`)
        assert model.encode() in received
        assert not [m for m in models if m.encode() in received and not model.startswith(m)], model
    # every flow ended normally, and its state is freed: the last one done leaves none held
    assert all([hook for hook, _ in log.probes(model)] == ["response"] for model in models)
    last_done = [line for line in log.lines() if "flow-probe:" in line][-1]
    assert last_done.endswith(" open=0"), last_done
    log.assert_no_addon_errors()
