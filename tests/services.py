"""Real servers for the tests: Redis and HAProxy on free loopback ports.

Each helper starts the Debian binary as a child process with its data and its generated
config in a temporary directory of its own, waits until the server answers, and stops it
(SIGTERM, then SIGKILL) on `stop()` / leaving the `with` block. Nothing is mocked.

`RespClient` is a tiny Redis client (RESP2 over a socket), so the tests can wait for and
inspect a Redis without depending on a client library.

The binaries come from Debian's `redis-server` and `haproxy` packages; `tests/run` installs
them when they are missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

INSTALL_HINT = "install redis-server and haproxy: see tests/run"

# Debian puts haproxy in /usr/sbin, which is not on every PATH.
_SEARCH_DIRS = ("/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin", "/sbin")


class MissingBinary(RuntimeError):
    """A server binary the tests need is not installed."""


def find_binary(name: str) -> str:
    """The path of `name` on PATH or in the usual system directories, else MissingBinary."""
    found = shutil.which(name)
    if found:
        return found
    for directory in _SEARCH_DIRS:
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise MissingBinary(f"{name} not found: {INSTALL_HINT}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_accepts(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def _read_tail(path: Path, limit: int = 4000) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-limit:]
    except OSError:
        return ""


class _Process:
    """A server child process with its output in a log file of its temp directory."""

    name = "server"

    def __init__(self) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_handle: Any = None
        self._frozen = False

    @property
    def directory(self) -> Path:
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=f"toolshim-{self.name}-")
        return Path(self._tmp.name)

    @property
    def log_path(self) -> Path:
        return self.directory / f"{self.name}.out"

    def log_text(self) -> str:
        return _read_tail(self.log_path, 1 << 20)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _spawn(self, argv: Sequence[str]) -> None:
        self._log_handle = open(self.log_path, "ab")  # noqa: SIM115 - closed in _reap
        self._proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
            cwd=self.directory,
        )

    def _wait_until(self, ready: Any, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if ready():
                return
            assert self._proc is not None
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._reap()
                raise RuntimeError(
                    f"{self.name} exited with {code} before {what}:\n{_read_tail(self.log_path)}"
                )
            if time.monotonic() > deadline:
                self._terminate()
                raise TimeoutError(
                    f"{self.name} not {what} after {timeout}s:\n{_read_tail(self.log_path)}"
                )
            time.sleep(0.02)

    def _terminate(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            if self._frozen:
                proc.send_signal(signal.SIGCONT)
                self._frozen = False
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self._reap()

    def _reap(self) -> None:
        self._proc = None
        self._frozen = False
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None

    def freeze(self) -> None:
        """SIGSTOP: the port still accepts connections (the kernel's backlog) but nothing
        answers, like a hung server."""
        if self._proc is not None and not self._frozen:
            self._proc.send_signal(signal.SIGSTOP)
            self._frozen = True

    def thaw(self) -> None:
        if self._proc is not None and self._frozen:
            self._proc.send_signal(signal.SIGCONT)
            self._frozen = False

    def cleanup(self) -> None:
        """Stop the process and remove the temp directory."""
        self._terminate()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


# --------------------------------------------------------------------------
# A tiny Redis client (RESP2)
# --------------------------------------------------------------------------


class RespError(Exception):
    """An error reply (`-ERR ...`) from the server."""


class RespClient:
    """One connection to a Redis server speaking RESP2: `command("GET", key)`.

    Replies: simple strings and bulk strings as bytes, integers as int, arrays as lists,
    nil as None; an error reply raises RespError.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 6379, timeout: float = 5.0) -> None:
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._file = self._sock.makefile("rb")

    def close(self) -> None:
        try:
            self._file.close()
        finally:
            self._sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def command(self, *args: str | bytes | int) -> Any:
        out = [b"*%d\r\n" % len(args)]
        for arg in args:
            data = arg if isinstance(arg, bytes) else str(arg).encode("utf-8")
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
        self._sock.sendall(b"".join(out))
        return self._reply()

    def _line(self) -> bytes:
        line = self._file.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionError("connection closed by the Redis server")
        return line[:-2]

    def _reply(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            raise RespError(rest.decode("utf-8", "replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            data = self._file.read(size + 2)
            if len(data) != size + 2:
                raise ConnectionError("connection closed by the Redis server")
            return data[:-2]
        if kind == b"*":
            count = int(rest)
            if count < 0:
                return None
            return [self._reply() for _ in range(count)]
        raise ConnectionError(f"unexpected reply from the Redis server: {line[:80]!r}")

    # ---- helpers for the tests --------------------------------------------

    def keys(self) -> list[bytes]:
        """Every key (SCAN, so a big database does not block the server)."""
        cursor = b"0"
        found: list[bytes] = []
        while True:
            cursor, batch = self.command("SCAN", cursor, "COUNT", 1000)
            found.extend(batch)
            if cursor == b"0":
                return sorted(set(found))

    def value_parts(self, key: bytes) -> list[bytes]:
        """Every byte string stored under `key`, whatever its type (string, hash, list,
        set, sorted set, stream): what a leak check has to search."""
        kind = self.command("TYPE", key)
        if kind == b"string":
            return [self.command("GET", key) or b""]
        if kind == b"hash":
            return list(self.command("HGETALL", key))
        if kind == b"list":
            return list(self.command("LRANGE", key, 0, -1))
        if kind == b"set":
            return list(self.command("SMEMBERS", key))
        if kind == b"zset":
            return list(self.command("ZRANGE", key, 0, -1, "WITHSCORES"))
        if kind == b"stream":
            parts: list[bytes] = []

            def flatten(item: Any) -> None:
                if isinstance(item, list):
                    for sub in item:
                        flatten(sub)
                elif isinstance(item, bytes):
                    parts.append(item)

            flatten(self.command("XRANGE", key, "-", "+"))
            return parts
        if kind == b"none":  # expired between SCAN and TYPE
            return []
        raise AssertionError(f"unexpected Redis type {kind!r} for key {key!r}")

    def dump(self) -> dict[bytes, list[bytes]]:
        """All keys with all the byte strings stored under each."""
        return {key: self.value_parts(key) for key in self.keys()}


# --------------------------------------------------------------------------
# Redis
# --------------------------------------------------------------------------


class RedisServer(_Process):
    """A real `redis-server` on a free loopback port, no persistence, data in a temp dir.

    `stop()` makes it unreachable (connection refused) and `start()` brings it back on the
    same port (empty: nothing is saved); `freeze()` / `thaw()` make it hang instead.
    """

    name = "redis"

    def __init__(self, port: int | None = None, startup_timeout: float = 15.0) -> None:
        super().__init__()
        self.binary = find_binary("redis-server")
        self.port = port or free_port()
        self.startup_timeout = startup_timeout

    @property
    def url(self) -> str:
        """The URL for the addon's `toolshim_state` option (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.directory),
            "--daemonize", "no",
            "--logfile", "",  # to stdout, i.e. the log file of _Process
        ]  # fmt: skip

    def start(self) -> Self:
        if self.running:
            return self
        self._spawn(self.command())
        self._wait_until(self.ping, f"answering PING on port {self.port}", self.startup_timeout)
        return self

    def ping(self) -> bool:
        try:
            with RespClient(port=self.port, timeout=0.5) as client:
                return client.command("PING") == b"PONG"
        except (OSError, ConnectionError, RespError):
            return False

    def stop(self) -> None:
        """Stop the server; the port refuses connections until `start()`."""
        self._terminate()

    def restart(self) -> Self:
        self.stop()
        return self.start()

    def client(self, timeout: float = 5.0) -> RespClient:
        return RespClient(port=self.port, timeout=timeout)

    def dump(self) -> dict[bytes, list[bytes]]:
        with self.client() as client:
            return client.dump()

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()


# --------------------------------------------------------------------------
# HAProxy
# --------------------------------------------------------------------------


class HaProxy(_Process):
    """A real `haproxy` in HTTP mode balancing round robin over backends on loopback ports.

    Every request of a client's keep-alive connection is balanced on its own: consecutive
    requests alternate between the backends even on one client connection (HAProxy does so
    in its default keep-alive mode too; `option http-server-close` also closes each
    server-side connection after its response, so none is reused). Responses are
    streamed as they arrive (HAProxy does not buffer bodies in HTTP mode, and no compression
    or cache filter is configured), so SSE goes through event by event.
    """

    name = "haproxy"

    def __init__(
        self,
        backends: Sequence[int],
        port: int | None = None,
        startup_timeout: float = 15.0,
    ) -> None:
        super().__init__()
        if not backends:
            raise ValueError("HaProxy needs at least one backend port")
        self.binary = find_binary("haproxy")
        self.backends = list(backends)
        self.port = port or free_port()
        self.startup_timeout = startup_timeout

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """OpenAI-style base URL (the SDK appends `/chat/completions`)."""
        return f"{self.url}/v1"

    @property
    def config_path(self) -> Path:
        return self.directory / "haproxy.cfg"

    def config(self) -> str:
        servers = "\n".join(
            f"    server worker{i} 127.0.0.1:{port}" for i, port in enumerate(self.backends)
        )
        return f"""\
global
    maxconn 1024
    # one line per request on stderr, i.e. in log_text(): which worker, status, timings
    log stderr format raw daemon

defaults
    mode http
    log global
    option httplog
    timeout connect 5s
    timeout client 120s
    timeout server 120s
    timeout http-keep-alive 30s
    timeout http-request 30s
    # Every request is balanced on its own, also on a keep-alive client connection.
    option http-server-close

frontend toolshim_front
    bind 127.0.0.1:{self.port}
    default_backend toolshim_workers

backend toolshim_workers
    balance roundrobin
{servers}
"""

    def command(self) -> list[str]:
        return [self.binary, "-db", "-f", str(self.config_path)]

    def start(self) -> Self:
        if self.running:
            return self
        self.config_path.write_text(self.config(), encoding="utf-8")
        check = subprocess.run(
            [self.binary, "-c", "-q", "-f", str(self.config_path)],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
        if check.returncode != 0:
            raise RuntimeError(
                f"haproxy rejected its config ({check.returncode}):\n"
                f"{check.stdout}{check.stderr}\n{self.config()}"
            )
        self._spawn(self.command())
        self._wait_until(
            lambda: port_accepts(self.port), f"accepting on port {self.port}", self.startup_timeout
        )
        return self

    def stop(self) -> None:
        self._terminate()

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
