"""Test harness: a byte-exact scripted upstream and a real mitmdump subprocess.

The addon rewrites streamed responses in flight, so tests must control exactly
how the upstream frames its bytes and how they are split across network reads.
`ScriptedUpstream` writes raw HTTP/1.1 itself for that reason; `Mitmdump` runs
the real proxy binary so the addon is exercised the same way as in production.
"""

from __future__ import annotations

import gzip as gzip_module
import http
import json
import os
import re
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Literal, Self

PROJECT_ROOT = Path(__file__).resolve().parents[1]
ADDON_SCRIPT = PROJECT_ROOT / "addon" / "toolshim.py"

Framing = Literal["chunked", "content-length", "close"]
FRAMINGS: tuple[Framing, ...] = ("chunked", "content-length", "close")


# --------------------------------------------------------------------------
# Body helpers
# --------------------------------------------------------------------------


def sse_body(chunks: Iterable[dict[str, Any] | str], done: bool = True) -> bytes:
    """Build an SSE body of `data:` events, the way OpenAI-compatible servers do.

    Dicts become compact JSON (non-ASCII kept verbatim, as real servers often
    send it); strings are used as the raw data payload.
    """
    out: list[str] = []
    for chunk in chunks:
        payload = (
            chunk
            if isinstance(chunk, str)
            else json.dumps(chunk, separators=(",", ":"), ensure_ascii=False)
        )
        out.append(f"data: {payload}\n\n")
    if done:
        out.append("data: [DONE]\n\n")
    return "".join(out).encode("utf-8")


def split_bytes(body: bytes, cuts: Iterable[int]) -> list[bytes]:
    """Split `body` at the given offsets (sorted, deduplicated, 0/len ignored).

    Lenient on order/duplicates so property tests can pass random cut lists;
    out-of-range offsets are a test bug and raise.
    """
    points = sorted(set(cuts))
    for c in points:
        if not 0 <= c <= len(body):
            raise ValueError(f"cut {c} outside body of length {len(body)}")
    bounds = [0, *(c for c in points if 0 < c < len(body)), len(body)]
    return [body[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


def chat_chunk(
    model: str,
    *,
    content: str | None = None,
    role: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str | None = None,
    chunk_id: str = "chatcmpl-test",
    created: int = 1_700_000_000,
    extra_delta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One `chat.completion.chunk` object with a single choice, for `sse_body`."""
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    if extra_delta:
        delta.update(extra_delta)
    return {
        "id": chunk_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def chat_completion(
    model: str,
    *,
    content: str | None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str = "stop",
    completion_id: str = "chatcmpl-test",
    created: int = 1_700_000_000,
) -> dict[str, Any]:
    """A non-streaming `chat.completion` object with a single choice."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _split_like(data: bytes, template: Sequence[bytes]) -> list[bytes]:
    """Split `data` at the same relative proportions as `template`'s pieces."""
    total = sum(len(p) for p in template)
    if len(template) <= 1 or total == 0:
        return [data] if data else []
    cuts: list[int] = []
    acc = 0
    for piece in template[:-1]:
        acc += len(piece)
        cuts.append(round(acc / total * len(data)))
    return split_bytes(data, cuts)


# --------------------------------------------------------------------------
# Scripted upstream
# --------------------------------------------------------------------------


class Headers(dict[str, str]):
    """Request headers keyed by lower-cased name; lookups are case-insensitive."""

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and super().__contains__(key.lower())

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(key.lower(), default)


@dataclass(frozen=True)
class Script:
    """One canned reply; immutable so it can serve any number of requests."""

    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    chunks: tuple[bytes, ...] = ()
    framing: Framing = "chunked"
    delay: float = 0.0
    gzip: bool = False
    # The chunks are the whole response as it goes on the wire, status line and headers
    # included, for what no framing describes (a chunked body cut inside a chunk, a
    # content-length that lies); the connection closes after the last write.
    raw: bool = False

    @property
    def body(self) -> bytes:
        """The uncompressed body as the client should finally see it."""
        return b"".join(self.chunks)


@dataclass
class RecordedRequest:
    """A request as received by the upstream (i.e. after the proxy)."""

    method: str
    path: str
    headers: Headers
    body: bytes
    json: Any
    conn_id: int  # which TCP connection it arrived on, to observe keep-alive
    key: str  # the routing key that was looked up
    received_at: float = field(default_factory=time.monotonic)


class _BadRequest(Exception):
    pass


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    # Keep-alive handler threads may be parked in recv(); stop() closes their
    # sockets instead of joining them.
    block_on_close = False
    # socketserver's default backlog of 5 drops connections when many streams start at once
    # (mitmdump then answers 502 "server closed connection").
    request_queue_size = 1024

    def __init__(self, owner: ScriptedUpstream) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        owner = self.server.owner
        conn_id = owner._register_conn(sock)
        rfile = sock.makefile("rb")
        try:
            while owner._serve_one(sock, rfile, conn_id):
                pass
        except (OSError, ValueError, _BadRequest):
            # Client went away / stop() closed the socket / garbage on the
            # wire: nothing useful to report from a background thread.
            pass
        finally:
            owner._unregister_conn(sock)
            rfile.close()
            try:
                sock.close()
            except OSError:
                pass


class ScriptedUpstream:
    """A real HTTP/1.1 server on 127.0.0.1 replying with byte-exact scripts.

    Requests are routed by the JSON body's `model` (what the OpenAI SDK always
    sends), else by path, so concurrent tests can register disjoint scripts.
    """

    def __init__(self) -> None:
        self._scripts: dict[str, Script | Callable[[RecordedRequest], Script]] = {}
        self._requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._conns: dict[int, socket.socket] = {}
        self._next_conn = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port: int = 0

    # ---- lifecycle -------------------------------------------------------

    def start(self) -> Self:
        if self._server is not None:
            return self
        self._server = _Server(self)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"scripted-upstream-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            conns = list(self._conns.values())
        for sock in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---- scripting -------------------------------------------------------

    def add(
        self,
        key: str,
        *,
        status: int = 200,
        headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
        chunks: Iterable[bytes] = (),
        framing: Framing = "chunked",
        delay: float = 0.0,
        gzip: bool = False,
        raw: bool = False,
    ) -> Script:
        """Register (or replace) the reply for a model name or path.

        Each element of `chunks` is one socket write (one HTTP chunk with
        chunked framing); with `delay` > 0 they arrive as separate reads.
        """
        if framing not in FRAMINGS:
            raise ValueError(f"unknown framing {framing!r}")
        hdrs = tuple((headers.items() if isinstance(headers, Mapping) else headers) or ())
        script = Script(
            status=status,
            headers=tuple((str(k), str(v)) for k, v in hdrs),
            chunks=tuple(bytes(c) for c in chunks),
            framing=framing,
            delay=delay,
            gzip=gzip,
            raw=raw,
        )
        with self._lock:
            self._scripts[key] = script
        return script

    def add_json(
        self, key: str, obj: Any, *, status: int = 200, framing: Framing = "content-length"
    ) -> Script:
        """Register a plain JSON reply (e.g. a non-streaming completion)."""
        return self.add(
            key,
            status=status,
            headers={"content-type": "application/json"},
            chunks=[json.dumps(obj).encode()],
            framing=framing,
        )

    def add_responder(self, key: str, responder: Callable[[RecordedRequest], Script]) -> None:
        """Register a function that picks the reply from the request (a backend's own rules,
        such as refusing requests that carry `tools`)."""
        with self._lock:
            self._scripts[key] = responder

    def remove(self, key: str) -> None:
        with self._lock:
            self._scripts.pop(key, None)

    # ---- inspection ------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of all requests received so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    def requests_for(self, key: str) -> list[RecordedRequest]:
        """Requests routed by `key` (a model name or path)."""
        return [r for r in self.requests if r.key == key]

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    # ---- connection handling (called from handler threads) ---------------

    def _register_conn(self, sock: socket.socket) -> int:
        with self._lock:
            self._next_conn += 1
            self._conns[self._next_conn] = sock
            return self._next_conn

    def _unregister_conn(self, sock: socket.socket) -> None:
        with self._lock:
            for cid, s in list(self._conns.items()):
                if s is sock:
                    del self._conns[cid]

    def _serve_one(self, sock: socket.socket, rfile: BinaryIO, conn_id: int) -> bool:
        """Read one request, send its reply; return whether to keep the connection."""
        line = rfile.readline(65537)
        if not line:
            return False
        if not line.strip():  # tolerate stray CRLF between requests
            return True
        parts = line.decode("latin-1").rstrip("\r\n").split(" ")
        if len(parts) != 3:
            raise _BadRequest(line)
        method, target, version = parts
        headers = self._read_headers(rfile)
        body = self._read_body(rfile, headers)

        key, parsed = self._route(target, body)
        req = RecordedRequest(
            method=method,
            path=target,
            headers=headers,
            body=body,
            json=parsed,
            conn_id=conn_id,
            key=key,
        )
        with self._lock:
            self._requests.append(req)
            script = self._scripts.get(key)
            if script is None and "?" in target:
                script = self._scripts.get(target.split("?", 1)[0])
        if callable(script):
            script = script(req)

        tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        keep_alive = "close" not in tokens and (
            version == "HTTP/1.1" or "keep-alive" in tokens
        )
        if script is None:
            what = f"model {key!r}" if parsed is not None and key != target else f"path {key!r}"
            err = json.dumps({"error": {"message": f"no script for {what}"}}).encode()
            script = Script(
                status=404,
                headers=(("content-type", "application/json"),),
                chunks=(err,),
                framing="content-length",
            )
        return self._send(sock, script, keep_alive)

    @staticmethod
    def _read_headers(rfile: BinaryIO) -> Headers:
        headers = Headers()
        while True:
            line = rfile.readline(65537)
            if not line:
                raise _BadRequest("eof in headers")
            if line in (b"\r\n", b"\n"):
                return headers
            name, sep, value = line.decode("latin-1").partition(":")
            if not sep:
                raise _BadRequest(line)
            name = name.strip().lower()
            value = value.strip()
            # Repeated headers are folded, as RFC 9110 permits for lists.
            headers[name] = f"{headers[name]}, {value}" if name in headers else value

    @staticmethod
    def _read_body(rfile: BinaryIO, headers: Headers) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            out = bytearray()
            while True:
                size_line = rfile.readline(65537)
                if not size_line:
                    raise _BadRequest("eof in chunk size")
                size = int(size_line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    # Skip trailers up to the terminating empty line.
                    while rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                data = rfile.read(size)
                if len(data) != size:
                    raise _BadRequest("eof in chunk")
                out += data
                rfile.readline(65537)  # CRLF after chunk data
        length = int(headers.get("content-length", "0") or 0)
        data = rfile.read(length) if length else b""
        if len(data) != length:
            raise _BadRequest("eof in body")
        return data

    @staticmethod
    def _route(target: str, body: bytes) -> tuple[str, Any]:
        parsed: Any = None
        if body:
            try:
                parsed = json.loads(body)
            except (ValueError, UnicodeDecodeError):
                parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("model"), str):
            return parsed["model"], parsed
        return target, parsed

    @staticmethod
    def _send(sock: socket.socket, script: Script, keep_alive: bool) -> bool:
        if script.raw:
            for data in script.chunks:
                if script.delay > 0:
                    time.sleep(script.delay)
                sock.sendall(data)
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            return False
        pieces: list[bytes] = [c for c in script.chunks if c]
        if script.gzip:
            compressed = gzip_module.compress(script.body, mtime=0)
            pieces = _split_like(compressed, pieces)
        framing = script.framing

        try:
            reason = http.HTTPStatus(script.status).phrase
        except ValueError:
            reason = "Unknown"
        head: list[tuple[str, str]] = list(script.headers)
        names = {k.lower() for k, _ in head}
        if "content-type" not in names:
            head.append(("content-type", "text/event-stream"))
        if script.gzip and "content-encoding" not in names:
            head.append(("content-encoding", "gzip"))
        if framing == "chunked":
            head.append(("transfer-encoding", "chunked"))
        elif framing == "content-length":
            head.append(("content-length", str(sum(len(p) for p in pieces))))
        if framing == "close" or not keep_alive:
            head.append(("connection", "close"))
            keep_alive = False

        lines = [f"HTTP/1.1 {script.status} {reason}\r\n"]
        lines += [f"{k}: {v}\r\n" for k, v in head]
        lines.append("\r\n")
        sock.sendall("".join(lines).encode("latin-1"))

        writes: list[bytes]
        if framing == "chunked":
            writes = [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces]
            writes.append(b"0\r\n\r\n")
        else:
            writes = pieces
        for data in writes:
            if script.delay > 0:
                time.sleep(script.delay)
            sock.sendall(data)

        if not keep_alive:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        return keep_alive


# --------------------------------------------------------------------------
# mitmdump subprocess
# --------------------------------------------------------------------------


def mitmdump_executable() -> str:
    """The venv's mitmdump (next to this interpreter), else the one on PATH."""
    exe = Path(sys.executable).parent / "mitmdump"
    if exe.exists():
        return str(exe)
    found = shutil.which("mitmdump")
    if found is None:
        raise FileNotFoundError("mitmdump not found next to sys.executable or on PATH")
    return found


_LISTENING = re.compile(r"listening at .*?:(\d+)")


class Mitmdump:
    """A real mitmdump reverse proxy in front of `upstream_url`.

    Output is drained continuously by a thread: a full pipe would block
    mitmdump's event loop and hang the test.
    """

    def __init__(
        self,
        upstream_url: str,
        *,
        script: Path | str | None = ADDON_SCRIPT,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.upstream_url = upstream_url
        self.script = Path(script) if script is not None else None
        self.extra_args = list(extra_args)
        self.startup_timeout = startup_timeout
        self.extra_env = dict(env or {})
        self.port: int = 0
        self._proc: subprocess.Popen[str] | None = None
        self._lines: list[str] = []
        self._cond = threading.Condition()
        self._reader: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """OpenAI-style base URL (the SDK appends `/chat/completions`)."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def command(self) -> list[str]:
        cmd = [
            mitmdump_executable(),
            "--mode",
            f"reverse:{self.upstream_url}",
            "--listen-host",
            "127.0.0.1",
            "--listen-port",
            "0",
        ]
        if self.script is not None:
            cmd += ["-s", str(self.script)]
        cmd += ["--set", "flow_detail=0", *self.extra_args]
        return cmd

    def start(self) -> Self:
        if self._proc is not None:
            return self
        if self.script is not None and not self.script.exists():
            raise FileNotFoundError(f"addon script not found: {self.script}")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.extra_env}
        self._proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            encoding="utf-8",
            errors="replace",
            bufsize=1,
            env=env,
        )
        self._reader = threading.Thread(target=self._drain, name="mitmdump-drain", daemon=True)
        self._reader.start()
        try:
            self.port = self._wait_listening()
        except BaseException:
            self.stop()
            raise
        return self

    def _drain(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            with self._cond:
                self._lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def _wait_listening(self) -> int:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        seen = 0
        with self._cond:
            while True:
                for line in self._lines[seen:]:
                    if m := _LISTENING.search(line):
                        return int(m.group(1))
                seen = len(self._lines)
                if self._proc.poll() is not None and not (
                    self._reader and self._reader.is_alive()
                ):
                    raise RuntimeError(
                        f"mitmdump exited with {self._proc.returncode} before listening:\n"
                        + "\n".join(self._lines)
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"mitmdump not listening after {self.startup_timeout}s:\n"
                        + "\n".join(self._lines)
                    )
                self._cond.wait(min(remaining, 0.2))

    def log_lines(self) -> list[str]:
        with self._cond:
            return list(self._lines)

    def log_text(self) -> str:
        """All mitmdump output so far (stdout and stderr interleaved)."""
        return "\n".join(self.log_lines())

    def wait_for_log(self, pattern: str | re.Pattern[str], timeout: float = 10.0) -> str:
        """Block until an output line matches `pattern`; return that line."""
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self._lines[seen:]:
                    if rx.search(line):
                        return line
                seen = len(self._lines)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"no log line matching {rx.pattern!r}:\n" + "\n".join(self._lines)
                    )
                self._cond.wait(min(remaining, 0.2))

    def stop(self) -> int | None:
        """SIGTERM (lets mitmdump flush `-w` files), then kill after 15 s."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
        if self._reader is not None:
            self._reader.join(timeout=5)
        if proc.stdout is not None:
            proc.stdout.close()
        return proc.returncode

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def run_offline(
    src: Path,
    dst: Path,
    script: bool | Path | str = True,
    extra_args: Sequence[str] = (),
    quiet: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Replay recorded flows from `src` through the addon into `dst`, no network.

    `script=True` uses the real addon, `False` none, a path that script.
    """
    cmd = [mitmdump_executable(), "-n", *(["-q"] if quiet else []), "-r", str(src), "-w", str(dst)]
    if script is True:
        cmd += ["-s", str(ADDON_SCRIPT)]
    elif script is not False:
        cmd += ["-s", str(script)]
    cmd += list(extra_args)
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
    )


def read_flows(path: Path | str) -> list[Any]:
    """The HTTP flows stored in a mitmproxy `.flow` file, in order."""
    from mitmproxy import http as mhttp
    from mitmproxy import io as mio

    with open(path, "rb") as f:
        return [fl for fl in mio.FlowReader(f).stream() if isinstance(fl, mhttp.HTTPFlow)]


def iter_sse_data(body: bytes) -> Iterator[str]:
    """The `data:` payloads of an SSE body (multi-line data joined with \\n)."""
    text = body.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    for event in text.split("\n\n"):
        data = [
            line[5:].removeprefix(" ") for line in event.split("\n") if line.startswith("data:")
        ]
        if data:
            yield "\n".join(data)
