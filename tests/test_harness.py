"""Self-tests of the harness, run through a passthrough script, not the real addon.

They pin down the harness itself (framing, routing, recording, the mitmdump
wrapper) so that failures in addon tests can be trusted to be addon bugs.
"""

from __future__ import annotations

import gzip
import http.client
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from harness import (
    FRAMINGS,
    Framing,
    Mitmdump,
    ScriptedUpstream,
    chat_chunk,
    iter_sse_data,
    read_flows,
    run_offline,
    split_bytes,
    sse_body,
)

BODY = sse_body(
    [chat_chunk("m", role="assistant", content=""), chat_chunk("m", content="héllo")]
)


@pytest.fixture(scope="module")
def passthrough_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    script = tmp_path_factory.mktemp("addon") / "passthrough.py"
    script.write_text("addons = []\n")
    return script


@pytest.fixture(scope="module")
def passthrough_proxy(upstream: ScriptedUpstream, passthrough_script: Path) -> Iterator[Mitmdump]:
    with Mitmdump(upstream.url, script=passthrough_script) as proc:
        yield proc


# ---- pure helpers ----------------------------------------------------------


def test_sse_body_formats_dicts_compactly_and_strings_verbatim() -> None:
    body = sse_body([{"a": 1, "b": "é"}, "not json"], done=True)
    assert body == 'data: {"a":1,"b":"é"}\n\ndata: not json\n\ndata: [DONE]\n\n'.encode()
    assert sse_body(["x"], done=False) == b"data: x\n\n"
    assert list(iter_sse_data(body)) == ['{"a":1,"b":"é"}', "not json", "[DONE]"]


def test_split_bytes() -> None:
    assert split_bytes(b"abcdef", [2, 4]) == [b"ab", b"cd", b"ef"]
    assert split_bytes(b"abcdef", [4, 2, 2, 0, 6]) == [b"ab", b"cd", b"ef"]
    assert split_bytes(b"abc", []) == [b"abc"]
    assert split_bytes(b"", []) == []
    with pytest.raises(ValueError):
        split_bytes(b"abc", [4])


# ---- upstream directly -----------------------------------------------------


def _post(port: int, model: str, conn: http.client.HTTPConnection | None = None) -> tuple[
    http.client.HTTPResponse, bytes
]:
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=json.dumps({"model": model, "stream": True}),
        headers={"Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    return resp, resp.read()


@pytest.mark.parametrize("use_gzip", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("framing", FRAMINGS)
def test_framings_deliver_full_body_direct(
    upstream: ScriptedUpstream, unique_model: str, framing: Framing, use_gzip: bool
) -> None:
    upstream.add(unique_model, chunks=split_bytes(BODY, [5, 17, 40]), framing=framing, gzip=use_gzip)
    resp, raw = _post(upstream.port, unique_model)
    assert resp.status == 200
    assert resp.getheader("content-type") == "text/event-stream"
    assert (resp.getheader("transfer-encoding") == "chunked") == (framing == "chunked")
    assert (resp.getheader("content-length") is not None) == (framing == "content-length")
    if use_gzip:
        assert resp.getheader("content-encoding") == "gzip"
        raw = gzip.decompress(raw)
    assert raw == BODY


def test_chunked_writes_arrive_as_separate_reads(upstream: ScriptedUpstream, unique_model: str) -> None:
    """With a delay, each scripted chunk is exactly one HTTP chunk on the wire."""
    upstream.add(unique_model, chunks=[b"first", b"second!"], delay=0.2)
    req = json.dumps({"model": unique_model}).encode()
    with socket.create_connection(("127.0.0.1", upstream.port), timeout=10) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(req), req)
        )
        reads: list[bytes] = []
        while data := s.recv(65536):
            reads.append(data)
    assert reads[0].startswith(b"HTTP/1.1 200 OK\r\n") and reads[0].endswith(b"\r\n\r\n")
    assert b"connection: close\r\n" in reads[0]
    assert reads[1:] == [b"5\r\nfirst\r\n", b"7\r\nsecond!\r\n", b"0\r\n\r\n"]


def test_keep_alive_and_path_routing(upstream: ScriptedUpstream, unique_model: str) -> None:
    upstream.add(unique_model, chunks=[b"one"], framing="content-length")
    upstream.add("/health", headers={"Content-Type": "text/plain"}, chunks=[b"ok"])
    conn = http.client.HTTPConnection("127.0.0.1", upstream.port, timeout=10)
    _, first = _post(upstream.port, unique_model, conn)
    _, second = _post(upstream.port, unique_model, conn)
    conn.request("GET", "/health")
    health = conn.getresponse()
    assert (first, second, health.read()) == (b"one", b"one", b"ok")
    assert health.getheader("content-type") == "text/plain"
    conn.close()

    reqs = upstream.requests_for(unique_model)
    assert len(reqs) == 2
    assert reqs[0].conn_id == reqs[1].conn_id  # same TCP connection reused
    health_req = upstream.requests_for("/health")[-1]
    assert health_req.method == "GET" and health_req.json is None and health_req.body == b""


def test_chunked_request_body_is_recorded(upstream: ScriptedUpstream, unique_model: str) -> None:
    upstream.add(unique_model, chunks=[b"ok"])
    payload = json.dumps({"model": unique_model, "x": [1, 2]}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", upstream.port, timeout=10)
    conn.request("POST", "/v1/x", body=iter([payload[:7], payload[7:]]), encode_chunked=True)
    assert conn.getresponse().read() == b"ok"
    conn.close()
    (req,) = upstream.requests_for(unique_model)
    assert req.headers["Transfer-Encoding"] == "chunked"
    assert req.body == payload
    assert req.json == {"model": unique_model, "x": [1, 2]}


def test_unknown_model_is_404_with_json_error(upstream: ScriptedUpstream) -> None:
    resp, raw = _post(upstream.port, "no-such-model-anywhere")
    assert resp.status == 404
    assert "no-such-model-anywhere" in json.loads(raw)["error"]["message"]


# ---- through a real mitmdump (passthrough script) --------------------------


def test_openai_sdk_streams_through_proxy(
    upstream: ScriptedUpstream, passthrough_proxy: Mitmdump, unique_model: str
) -> None:
    pieces = ["Hel", "lo", " wör", "ld"]
    body = sse_body(
        [chat_chunk(unique_model, role="assistant", content="")]
        + [chat_chunk(unique_model, content=p) for p in pieces]
        + [chat_chunk(unique_model, finish_reason="stop")]
    )
    upstream.add(unique_model, chunks=split_bytes(body, [30, 100, 101, 250]), delay=0.01)

    with openai.OpenAI(
        base_url=passthrough_proxy.base_url, api_key="test-key", max_retries=0, timeout=30
    ) as client:
        stream = client.chat.completions.create(
            model=unique_model,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
        )
        chunks = list(stream)

    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert deltas == pieces
    assert chunks[-1].choices[0].finish_reason == "stop"

    (req,) = upstream.requests_for(unique_model)
    assert req.method == "POST"
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == "Bearer test-key"
    assert req.json["stream"] is True
    assert req.json["messages"] == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("framing", FRAMINGS)
def test_framings_deliver_full_body_through_proxy(
    upstream: ScriptedUpstream, passthrough_proxy: Mitmdump, unique_model: str, framing: Framing
) -> None:
    upstream.add(unique_model, chunks=split_bytes(BODY, [3, 9, 60]), framing=framing, gzip=True)
    resp = httpx.post(
        passthrough_proxy.base_url + "/chat/completions",
        json={"model": unique_model, "stream": True},
        timeout=30,
    )
    assert resp.status_code == 200
    assert resp.headers["content-encoding"] == "gzip"
    assert resp.content == BODY  # httpx decodes gzip


def test_unknown_model_through_proxy_raises_not_found(passthrough_proxy: Mitmdump) -> None:
    with openai.OpenAI(
        base_url=passthrough_proxy.base_url, api_key="k", max_retries=0, timeout=30
    ) as client:
        with pytest.raises(openai.NotFoundError) as info:
            client.chat.completions.create(
                model="unregistered-model", messages=[{"role": "user", "content": "x"}]
            )
    assert "no script for" in str(info.value)


def test_mitmdump_reports_startup_failure(upstream: ScriptedUpstream) -> None:
    """An early exit surfaces as an error carrying mitmdump's own output."""
    proc = Mitmdump(upstream.url, script=None, extra_args=["--set", "stream_large_bodies=xyz"])
    with pytest.raises(RuntimeError, match="Invalid stream_large_bodies"):
        proc.start()
    assert proc.returncode not in (None, 0)


def test_record_then_offline_replay(
    tmp_path: Path, upstream: ScriptedUpstream, passthrough_script: Path, unique_model: str
) -> None:
    """A flow recorded without any addon can be replayed offline through a script."""
    upstream.add(unique_model, chunks=[BODY[:10], BODY[10:]])
    recorded = tmp_path / "raw.flow"
    with Mitmdump(upstream.url, script=None, extra_args=["-w", str(recorded)]) as proc:
        resp = httpx.post(proc.base_url + "/chat/completions", json={"model": unique_model})
        assert resp.content == BODY
    assert proc.returncode == 0  # SIGTERM shut it down cleanly, flushing -w

    (flow,) = read_flows(recorded)
    assert flow.request.path == "/v1/chat/completions"
    assert json.loads(flow.request.content)["model"] == unique_model
    assert flow.response.content == BODY

    replayed = tmp_path / "out.flow"
    result = run_offline(recorded, replayed, script=passthrough_script)
    assert result.returncode == 0, result.stdout + result.stderr
    (out,) = read_flows(replayed)
    assert out.response.content == BODY
    assert out.request.content == flow.request.content
