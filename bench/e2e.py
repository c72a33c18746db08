"""End to end: a real mitmdump running toolshim against a mitmdump that only streams.

Both proxies are `mitmdump --mode reverse:UPSTREAM --set flow_detail=0 -q` (neither writes a line
during the runs: checked), one with `-s addon/toolshim.py`, the baseline with
`-s bench/passthrough.py`, whose addon only sets `flow.response.stream = True`. The upstream and
the client live in this process, on one asyncio loop in one thread (2 cores: the proxies get the
rest). The upstream speaks raw HTTP/1.1 with TCP_NODELAY and writes one SSE event per write, as
one HTTP chunk; a stream's events go out on a fixed grid (event n at first + n * interval, the
streams' phases spread over the interval), so that streams never bunch up behind a late timer
and the load stays smooth. The client is a raw socket that reads and keeps every byte.

Streams: `bash` declared, one event per token-sized delta. Chat Completions: plain prose for an
unknown model (no markup: the fast path); Kimi-K2.5 with tool-call sections in mirrored
`reasoning`/`reasoning_content` (as `tests/kimi.py` builds them: markers whole, everything else in
1-4 character deltas); Qwen2.5 with `<tool_call>{...}</tool_call>` blocks in `content`, the tags
too in 1-4 character deltas; Qwen3-Coder with `<tool_call><function=bash><parameter=command>`
blocks (the wrapper tags whole, the rest in 1-4 character deltas). The Responses API: Qwen2.5's
`<tool_call>` blocks in a message's `output_text`. The Messages API: plain text, and Kimi calls in
a thinking block (`bench/streams.py`, `bench/messages.py`).

CPU. 40 streams at once per proxy, 2,500 events/s per proxy (60 tokens/s a stream), written two
ways. Paced: an event every 16 ms on each stream, so that every event reaches mitmdump in a
network read of its own, as from a real model. In bursts: 8 events written back to back every
128 ms, in one HTTP chunk (mitmproxy hands the stream callable one chunk a call, so 8 chunks
written at once are still 8 reads), as a fast model or a busy proxy delivers them: a read holds
several events. The passthrough clients count the HTTP chunks they get (one per read with
`stream = True`) and the table reports reads per event. The same load goes through the proxies
at the same time, so that whatever else the machine does weighs on each alike. mitmdump's
user+sys CPU (/proc/PID/stat) is sampled before the first request and after the last answer of a
run (start-up and warm-up excluded) and divided by the upstream events; per-flow work (request
parsing, the `response` hook) is included, spread over the stream's events. Figures are medians
over the runs, a ratio the median of the per-run ratios (their range beside it). A third proxy,
the baseline script with an identity stream callable, gives mitmproxy's own cost of calling a
stream function (plain text); a fourth, with a callable that parses and re-serialises each event
with orjson and sends the read as it came, runs with the Kimi load: the least any rewrite that
reads every event costs inside mitmdump (the core's floor), next to what the addon costs. Every
addon answer is checked: plain bodies byte for byte, every tool call of the other streams present
in the client's SSE, no markup left.

Latency. Streams whose deltas carry a sequence tag (`q0001234!`): in `content` for plain prose,
which passes untouched, and in the arguments of one long Kimi call, which stream live through the
rewrite. The upstream notes when it writes each tagged event, the client when the read holding
the tag arrives (same process, `time.perf_counter`; the bench's garbage collector is off during a
run). 1 stream (an event every 5 ms) and 50 streams (an event every 20 ms each); each proxy
alone, interleaved and repeated; a proxy's median (p99) is the median over its runs of each
run's median (p99), so that a run disturbed by other work on the machine counts as one run. Only the steady state counts: events sent after
the last stream of a run started (streams open over half a second) and before the first one
ended, so per-flow set-up and tear-down stay out. Added latency = the addon's median (p99) minus
the baseline's. `<tool_call>` blocks are held until they close by design, so their latency is
the block's, not a per-event figure: not measured.

Memory. (a) In process, with tracemalloc: flows go through the addon's own hooks
(requestheaders, request, responseheaders, in mitmproxy's `taddons`), then the stream callable
they installed gets a stream up to the middle of a call (a Kimi call's arguments; a `<tool_call>`
block), one event per call. Bytes per stream: all of it, with `toolshim_keep_upstream` on (the
default) and off; and the state once `release()` dropped the body copies, less the held-back
text (what the rewriter releases if the stream ends there): the target applies to this. The two
largest allocation sites of that state are named. (b) For context: the RSS of each mitmdump
(fresh, a few streams in) before and while 200 Kimi streams are held open mid-call, per stream.

Run alone: `.venv/bin/python bench/e2e.py [--quick]` (full: about 8 minutes; quick: about two).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # a checkout that was not pip-installed

from messages import BASH as MESSAGES_BASH  # noqa: E402
from messages import messages_events  # noqa: E402
from streams import (  # noqa: E402
    KIMI_MODEL,
    PLAIN_MODEL,
    QWEN_CODER_MODEL,
    QWEN_MODEL,
    kimi_pieces,
    plain_pieces,
    prose,
    request_body,
    responses_events,
    responses_request,
    sentinel_pieces,
    tokens,
    xml_pieces,
)
from table import Row  # noqa: E402

SECTION = "end to end"
ADDON_SCRIPT = ROOT / "addon" / "toolshim.py"
BASELINE_SCRIPT = BENCH / "passthrough.py"
KIMI_FIELDS = ("reasoning", "reasoning_content")  # Kimi-K2.5 behind vLLM mirrors its reasoning
TAG = re.compile(rb"q(\d{7})!")
MARKUP = (b"<|tool_call", b"tool_calls_section", b"<tool_call>", b"</tool_call>")


# -- streams ------------------------------------------------------------------------------------


def chunk(model: str, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
    obj = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1772234856,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chat_stream(model: str, pieces: list[str], fields: tuple[str, ...]) -> list[bytes]:
    """One event per piece (written to every field of `fields`), the finish, usage, [DONE]."""
    events = [chunk(model, {"role": "assistant", "content": ""})]
    events += [chunk(model, {name: piece for name in fields}) for piece in pieces]
    events.append(chunk(model, {name: "" for name in fields}, "stop"))
    usage = {"prompt_tokens": 1000, "completion_tokens": len(pieces), "total_tokens": 1000 + len(pieces)}
    events.append(_usage(model, usage))
    events.append(b"data: [DONE]\n\n")
    return events


def _usage(model: str, usage: dict[str, int]) -> bytes:
    obj = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1772234856, "model": model, "choices": [], "usage": usage}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


CHAT, RESPONSES, MESSAGES = "chat", "responses", "messages"


@dataclass(frozen=True)
class Kind:
    name: str
    model: str
    fields: tuple[str, ...]  # Chat: the delta fields each piece goes to; Messages: the block kind
    pieces: Callable[[int, int], list[str]]  # (events, seed) -> deltas
    calls: Callable[[list[str]], int]  # the tool calls those deltas hold
    api: str = CHAT

    @property
    def plain(self) -> bool:
        """No markup: the addon's answer must be upstream's, byte for byte."""
        return self.calls is _NO_CALLS

    def stream(self, events: int, seed: int) -> tuple[list[bytes], int]:
        pieces = self.pieces(events, seed)
        if self.api == MESSAGES:
            return messages_events(self.model, self.fields[0], pieces), self.calls(pieces)
        if self.api == RESPONSES:
            return responses_events(pieces, self.model), self.calls(pieces)
        return chat_stream(self.model, pieces, self.fields), self.calls(pieces)

    def request_body(self) -> bytes:
        if self.api == RESPONSES:
            body = responses_request(self.model)
            BODY_PATHS[body] = "/v1/responses"
            return body
        if self.api != MESSAGES:
            return request_body(self.model)
        body = orjson.dumps({"model": self.model, "max_tokens": 4096, "stream": True, "tools": [MESSAGES_BASH], "messages": [{"role": "user", "content": "hi"}]})
        BODY_PATHS[body] = "/v1/messages"
        return body

    def complete(self, body: bytes) -> bool:
        """Does an answer end as a whole stream does (its last event)?"""
        if self.api == RESPONSES:
            return body[body.rfind(b"\n\n", 0, len(body) - 2) + 2 :].startswith(b"event: response.completed\n")
        return body.endswith(b'data: {"type":"message_stop"}\n\n' if self.api == MESSAGES else b"data: [DONE]\n\n")


def _NO_CALLS(pieces: list[str]) -> int:
    return 0


# The path a request body goes to (Chat Completions unless named here).
BODY_PATHS: dict[bytes, str] = {}


PLAIN = Kind("plain text", PLAIN_MODEL, ("content",), lambda n, seed: plain_pieces(n, seed), _NO_CALLS)
KIMI = Kind(
    "Kimi tool calls", KIMI_MODEL, KIMI_FIELDS, lambda n, seed: kimi_pieces(n, seed), lambda p: 2 * p.count("<|tool_calls_section_begin|>")
)
SENTINEL = Kind(
    "<tool_call> blocks", QWEN_MODEL, ("content",), lambda n, seed: sentinel_pieces(n, seed), lambda p: "".join(p).count("<tool_call>")
)
XML = Kind(
    "Qwen3-Coder XML <function=> blocks", QWEN_CODER_MODEL, ("content",), lambda n, seed: xml_pieces(n, seed),
    lambda p: "".join(p).count("<function="),
)  # fmt: skip
RESPONSES_SENTINEL = Kind(
    "Responses API, <tool_call> blocks", QWEN_MODEL, ("output_text",), lambda n, seed: sentinel_pieces(n, seed),
    lambda p: "".join(p).count("<tool_call>"), api=RESPONSES,
)  # fmt: skip
MESSAGES_PLAIN = Kind("Messages API, plain text", PLAIN_MODEL, ("text",), lambda n, seed: plain_pieces(n, seed), _NO_CALLS, api=MESSAGES)
MESSAGES_KIMI = Kind(
    "Messages API, Kimi calls in thinking", KIMI_MODEL, ("thinking",), lambda n, seed: kimi_pieces(n, seed),
    lambda p: 2 * p.count("<|tool_calls_section_begin|>"), api=MESSAGES,
)  # fmt: skip
KINDS = (PLAIN, KIMI, SENTINEL, XML, RESPONSES_SENTINEL, MESSAGES_PLAIN, MESSAGES_KIMI)


# -- the upstream: raw HTTP/1.1, one event per write --------------------------------------------

RESPONSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
_PLAN_HEADER = re.compile(rb"\r\nx-bench-plan: *([^\r]+)", re.I)
_LENGTH_HEADER = re.compile(rb"\r\ncontent-length: *(\d+)", re.I)


@dataclass
class Plan:
    """What the upstream answers to a request naming this plan."""

    events: list[bytes]
    interval: float  # seconds between two writes of one stream
    tags: list[int | None] | None = None  # per event: the sequence tag whose send time is kept
    hold_at: int | None = None  # stop before this event until released
    phase: float | None = None  # where in the interval the stream writes (None: at random)
    burst: int = 1  # events per write, back to back in one HTTP chunk (mitmproxy hands the stream one chunk a call)
    writes: list[bytes] = field(init=False)

    def __post_init__(self) -> None:
        if self.burst > 1:  # the writes are the plan's steps: a burst is one
            self.events = [b"".join(self.events[at : at + self.burst]) for at in range(0, len(self.events), self.burst)]
        self.writes = [b"%x\r\n%s\r\n" % (len(e), e) for e in self.events] + [b"0\r\n\r\n"]


class Upstream:
    def __init__(self) -> None:
        self.plans: dict[str, Plan] = {}
        self.sent_at: dict[int, float] = {}
        self.started: list[float] = []  # when each answer's head was written
        self.ended: list[float] = []  # when each answer's last event was written
        self.held: list[UpstreamConnection] = []
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: UpstreamConnection(self), "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


class UpstreamConnection(asyncio.Protocol):
    """Answers each request with its plan: event n goes out at first + n * interval (absolute
    times, so that streams keep their phases and never bunch up behind a late timer)."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.buf = b""
        self.plan: Plan | None = None
        self.next = 0
        self.first = 0.0
        self.hold_at: int | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.plan is not None:
            return
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = self.buf[:head_end]
        length = _LENGTH_HEADER.search(head)
        end = head_end + 4 + (int(length.group(1)) if length else 0)
        if len(self.buf) < end:
            return
        self.buf = self.buf[end:]
        plan = self.plan = self.upstream.plans[_PLAN_HEADER.search(head).group(1).decode()]
        self.next = 0
        self.hold_at = plan.hold_at
        self.transport.write(RESPONSE_HEAD)
        self.upstream.started.append(time.perf_counter())
        # The first event at the stream's phase of the interval grid: streams started together
        # do not write in step.
        now, phase = asyncio.get_running_loop().time(), random.uniform(0, plan.interval) if plan.phase is None else plan.phase
        self.first = phase + math.ceil((now - phase) / plan.interval) * plan.interval if plan.interval else now
        self._schedule()

    def _schedule(self) -> None:
        self.timer = asyncio.get_running_loop().call_at(self.first + self.next * self.plan.interval, self.send_next)

    def send_next(self) -> None:
        plan = self.plan
        if plan is None or self.transport.is_closing():
            return
        if self.next == self.hold_at:
            self.upstream.held.append(self)
            return
        if plan.tags is not None and self.next < len(plan.tags) and (tag := plan.tags[self.next]) is not None:
            self.upstream.sent_at[tag] = time.perf_counter()
        self.transport.write(plan.writes[self.next])
        self.next += 1
        if self.next == len(plan.events):
            self.upstream.ended.append(time.perf_counter())
        if self.next < len(plan.writes):
            self._schedule()
        else:
            self.plan = None  # keep-alive: ready for the next request

    def release(self) -> None:
        """Go on after `hold_at`, paced from now."""
        self.hold_at = None
        self.first = asyncio.get_running_loop().time() - self.next * self.plan.interval
        self.send_next()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.plan = None


# -- the client: reads everything, keeps it, notes when tags arrive ------------------------------


class ClientConnection(asyncio.Protocol):
    def __init__(self, request: bytes, done: asyncio.Future[bytes], arrivals: dict[int, float] | None) -> None:
        self.request = request
        self.done = done
        self.arrivals = arrivals
        self.parts: list[bytes] = []
        self.tail = b""
        self.carry = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if self.arrivals is not None:
            now = time.perf_counter()
            text = self.carry + data
            for m in TAG.finditer(text):
                self.arrivals.setdefault(int(m.group(1)), now)
            self.carry = text[-9:]  # a tag cut by a read: its start (never a whole tag)
        self.parts.append(data)
        self.tail = (self.tail + data)[-7:]
        if self.tail == b"\r\n0\r\n\r\n":  # the chunked body's end
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(b"".join(self.parts))


def request_bytes(port: int, plan_id: str, body: bytes) -> bytes:
    path = BODY_PATHS.get(body, "/v1/chat/completions")
    return (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
        f"accept: text/event-stream\r\nx-bench-plan: {plan_id}\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body


async def fetch(port: int, plan_id: str, body: bytes, arrivals: dict[int, float] | None, timeout: float) -> bytes:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bytes] = loop.create_future()
    transport, _ = await loop.create_connection(lambda: ClientConnection(request_bytes(port, plan_id, body), done, arrivals), "127.0.0.1", port)
    try:
        return await asyncio.wait_for(done, timeout)
    finally:
        transport.close()


async def fetch_all(port: int, jobs: list[tuple[str, bytes]], concurrency: int, timeout: float,
                    arrivals: dict[int, float] | None = None, ramp: float = 0.0) -> list[bytes]:  # fmt: skip
    """Every job, `concurrency` at a time; with `ramp`, the first ones start spread over that
    many seconds (not all connections at the same instant)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(n: int, plan_id: str, body: bytes) -> bytes:
        if ramp and n < concurrency:
            await asyncio.sleep(ramp * n / concurrency)
        async with gate:
            return await fetch(port, plan_id, body, arrivals, timeout)

    results = await asyncio.gather(*(one(n, plan_id, body) for n, (plan_id, body) in enumerate(jobs)), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


@dataclass
class Answer:
    status: int
    body: bytes
    chunks: int  # HTTP chunks: with `stream = True`, one per network read of mitmdump


def parse_answer(raw: bytes) -> Answer:
    head, _, rest = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" not in head.lower():
        return Answer(status, rest, 1)
    body, chunks, at = bytearray(), 0, 0
    while True:
        eol = rest.index(b"\r\n", at)
        size = int(rest[at:eol].split(b";")[0], 16)
        if size == 0:
            return Answer(status, bytes(body), chunks)
        body += rest[eol + 2 : eol + 2 + size]
        chunks += 1
        at = eol + 4 + size


def tool_calls(body: bytes) -> int:
    """Tool calls a client would build from an SSE body: entries that open a call (with an id)."""
    calls = 0
    for line in body.split(b"\n"):
        if line.startswith(b"data: {") and b'"content_block_start"' in line:  # Anthropic
            calls += orjson.loads(line[6:])["content_block"].get("type") == "tool_use"
        elif line.startswith(b"data: {") and b'"response.output_item.added"' in line:  # Responses
            calls += orjson.loads(line[6:])["item"].get("type") == "function_call"
        elif line.startswith(b"data: {"):
            for choice in orjson.loads(line[6:]).get("choices") or ():
                calls += sum(1 for call in (choice.get("delta") or {}).get("tool_calls") or () if call.get("id"))
    return calls


# -- mitmdump and the rig -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def mitmdump_command() -> list[str]:
    """The venv's mitmdump, next to this interpreter."""
    return [str(Path(sys.executable).parent / "mitmdump")]


class Mitmdump:
    """A mitmdump reverse proxy in front of the upstream (quiet: it prints nothing per flow)."""

    CLOCK_TICK = os.sysconf("SC_CLK_TCK")

    def __init__(self, name: str, upstream_port: int, script: Path, *options: str) -> None:
        self.name = name
        self.port = free_port()
        cmd = [*mitmdump_command(), "--mode", f"reverse:http://127.0.0.1:{upstream_port}", "--listen-host", "127.0.0.1",
               "--listen-port", str(self.port), "-s", str(script), "--set", "flow_detail=0", "-q"]  # fmt: skip
        for option in options:
            cmd += ["--set", option]
        self.lines: list[str] = []
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace", env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"mitmdump ({name}) did not start: " + "\n".join(self.lines))
            time.sleep(0.05)

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def cpu(self) -> float:
        """User + system CPU seconds of the process so far (all its threads)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / self.CLOCK_TICK

    def rss(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.reader.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Rig:
    """The upstream and the client on an asyncio loop in a thread of their own; the proxies."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bench-io", daemon=True)
        self.upstream = Upstream()
        self.proxies: list[Mitmdump] = []
        self._plans = 0

    def __enter__(self) -> Rig:
        self.thread.start()
        self.run(self.upstream.start(), 10)
        return self

    def __exit__(self, *exc: object) -> None:
        for proxy in self.proxies:
            proxy.stop()
        with contextlib.suppress(Exception):
            self.run(self.upstream.stop(), 10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()

    def proxy(self, name: str, script: Path, *options: str) -> Mitmdump:
        proxy = Mitmdump(name, self.upstream.port, script, *options)
        self.proxies.append(proxy)
        return proxy

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()  # a run that failed or timed out stops here, connections and all
            raise

    def plan(self, plan: Plan) -> str:
        self._plans += 1
        plan_id = f"p{self._plans}"
        self.upstream.plans[plan_id] = plan
        return plan_id

    def fetch_all(self, proxy: Mitmdump, jobs: list[tuple[str, bytes]], concurrency: int, timeout: float,
                  arrivals: dict[int, float] | None = None, ramp: float = 0.0) -> list[Answer]:  # fmt: skip
        raw = self.run(fetch_all(proxy.port, jobs, concurrency, timeout, arrivals, ramp), timeout + 30)
        return [parse_answer(r) for r in raw]

    def fetch_many(self, work: list[tuple[Mitmdump, list[tuple[str, bytes]]]], concurrency: int, timeout: float) -> list[list[Answer]]:
        """Several proxies' jobs at the same time; each proxy's answers."""

        async def everything() -> list[list[bytes]]:
            return await asyncio.gather(*(fetch_all(proxy.port, jobs, concurrency, timeout) for proxy, jobs in work))

        return [[parse_answer(r) for r in raw] for raw in self.run(everything(), timeout + 30)]


def median(values: list[float]) -> float:
    return statistics.median(values)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- 1. CPU per 10k events ----------------------------------------------------------------------


@dataclass
class Load:
    jobs: list[tuple[str, bytes]]  # (plan, request body) per stream
    events: int  # upstream events in all jobs
    calls: int  # tool calls in all jobs
    body: dict[str, bytes]  # plan -> the upstream body


def make_load(rig: Rig, kind: Kind, streams: int, per_stream: int, interval: float, templates: int = 8, burst: int = 1) -> Load:
    """`streams` streams of about `per_stream` events (whole tool calls), from a few templates;
    `burst` events written at once, every `burst` intervals."""
    plans = []
    for seed in range(templates):
        events, calls = kind.stream(per_stream, seed + 11)
        plans.append((rig.plan(Plan(events, interval * burst, burst=burst)), events, calls))
    body = kind.request_body()
    chosen = [plans[n % templates] for n in range(streams)]
    return Load(
        [(plan_id, body) for plan_id, _, _ in chosen],
        sum(len(events) for _, events, _ in chosen),
        sum(calls for _, _, calls in chosen),
        {plan_id: b"".join(events) for plan_id, events, _ in plans},
    )


def check(answers: list[Answer], load: Load, rewrites: bool, kind: Kind) -> int:
    """A benchmark of a broken proxy is worthless: every answer must be complete and right.
    Returns the tool calls the client got."""
    calls = 0
    for (plan_id, _), answer in zip(load.jobs, answers, strict=True):
        assert answer.status == 200, answer.status
        if not rewrites or kind.plain:
            assert answer.body == load.body[plan_id], f"{kind.name}: the body changed"
        else:
            assert not any(m in answer.body for m in MARKUP), f"{kind.name}: markup reached the client"
            assert kind.complete(answer.body), f"{kind.name}: the body is cut short"
            calls += tool_calls(answer.body)
    if rewrites and not kind.plain:
        assert calls == load.calls, f"{kind.name}: the client got {calls} tool calls of {load.calls}"
    return calls


# How the upstream writes: one event per write on a 16 ms grid ("paced", a model's pace: every
# event reaches mitmdump in a read of its own), or BURST events back to back in one write every
# BURST grid steps ("in bursts", as a fast model or a busy proxy delivers them: a read holds
# several events). The same events per second either way.
BURST = 8
MODES = (("paced", 1), ("in bursts", BURST))


def cpu_rows(rig: Rig, baseline: Mitmdump, addon: Mitmdump, identity: Mitmdump, floor: Mitmdump, quick: bool) -> list[Row]:
    """Each run sends the same load through the proxies at the same time (so that whatever else
    the machine does weighs on both alike), and samples their CPU before and after."""
    streams, interval = 40, 0.016  # 2,500 events/s per proxy
    per_stream = 150 if quick else 200
    repeats = 1 if quick else 5
    runs = [(kind, mode, burst) for kind in KINDS for mode, burst in MODES]
    loads = {(kind, mode): make_load(rig, kind, streams, per_stream, interval, burst=burst) for kind, mode, burst in runs}
    timeout = per_stream * 2 * interval * 10 + 30
    for kind in KINDS:  # warm up: imports, caches, the first flows
        warm = Load(loads[(kind, "paced")].jobs[:4], 0, 0, loads[(kind, "paced")].body)
        rig.fetch_many([(proxy, warm.jobs) for proxy in (baseline, addon, identity, floor)], 4, timeout)
    per10k: dict[tuple[Kind, str, str], list[float]] = {}
    reads: dict[str, list[float]] = {mode: [] for mode, _ in MODES}
    calls = 0
    order = random.Random(7)
    load_before = load_average()
    for _ in range(repeats):
        for kind, mode, _burst in runs:
            load = loads[(kind, mode)]
            # (The identity callable runs with the plain load, the parsing one with Kimi's: three
            # proxies at once in both.)
            proxies = (baseline, addon, identity) if kind is PLAIN else (baseline, addon, floor) if kind is KIMI else (baseline, addon)
            time.sleep(0.2)  # the previous run's connections are closed
            proxies = order.sample(proxies, len(proxies))  # who connects first changes from run to run
            before = [proxy.cpu() for proxy in proxies]
            answers = rig.fetch_many([(proxy, load.jobs) for proxy in proxies], streams, timeout)
            time.sleep(0.1)  # closing the last connections is part of the work
            after = [proxy.cpu() for proxy in proxies]
            for proxy, cpu0, cpu1, got in zip(proxies, before, after, answers):
                calls += check(got, load, proxy is addon, kind)
                per10k.setdefault((kind, mode, proxy.name), []).append((cpu1 - cpu0) / load.events * 10_000)
                if proxy is not addon or kind.plain:  # one chunk per read (the addon's fast path too)
                    reads[mode].append(sum(a.chunks for a in got) / load.events)
    rows = []
    for kind, mode, _burst in runs:
        base, mine = per10k[(kind, mode, baseline.name)], per10k[(kind, mode, addon.name)]
        ratios = [m / b for m, b in zip(mine, base)]
        ratio = median(ratios)
        target = 1.10 if kind.plain else 1.25
        rows.append(Row(
            SECTION, f"CPU of mitmdump per 10k events, {kind.name}, {mode}: addon vs baseline (`stream = True`)",
            f"{median(mine):.3f} s vs {median(base):.3f} s = {ratio:.3f}x{_spread(ratios)}",
            f"<= {target:.2f}x", ratio <= target,
        ))  # fmt: skip
    context = (  # rows with no target: what a stream callable costs that does nothing, or only parses
        (PLAIN, identity, "plain text", "an identity stream callable vs `stream = True` (mitmproxy's own cost)"),
        (KIMI, floor, "Kimi tool calls", "a callable that parses and re-serialises every event (orjson) vs `stream = True` (the floor of reading every event)"),
    )
    for mode, _burst in MODES:
        for kind, proxy, load_name, what in context:
            base, other = per10k[(kind, mode, baseline.name)], per10k[(kind, mode, proxy.name)]
            ratios = [o / b for o, b in zip(other, base)]
            rows.append(Row(
                SECTION, f"CPU per 10k events, {load_name}, {mode}: {what}",
                f"{median(other):.3f} s vs {median(base):.3f} s = {median(ratios):.2f}x{_spread(ratios)}",
            ))  # fmt: skip
    rows.append(Row(
        SECTION, "CPU runs: the load; network reads per upstream event; what the addon's clients got",
        f"{streams} streams of ~{per_stream} events per proxy at once, {streams / interval:,.0f} events/s per proxy: "
        f"paced, an event every {interval * 1000:g} ms per stream, {min(reads['paced']):.3f}..{max(reads['paced']):.3f} reads per event; "
        f"in bursts of {BURST} events every {interval * BURST * 1000:g} ms, {min(reads['in bursts']):.3f}..{max(reads['in bursts']):.3f} reads per event; "
        f"{repeats} run(s) per kind and mode; plain bodies byte for byte, {calls:,} tool calls, no markup; "
        f"the machine's load average {load_before} before, {load_average()} after (2 cores)",
    ))  # fmt: skip
    return rows


def load_average() -> str:
    """The 1-minute load average: other work on the machine weighs on every figure here."""
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:
        return "?"


def _spread(ratios: list[float]) -> str:
    return f" (runs {min(ratios):.2f}..{max(ratios):.2f})" if len(ratios) > 1 else ""


# -- 2. added latency per event -----------------------------------------------------------------


def tagged_plain(first: int, count: int) -> tuple[list[str], list[int]]:
    return [f" q{first + i:07d}!" for i in range(count)], list(range(first, first + count))


def tagged_kimi(first: int, count: int) -> tuple[list[str], list[int]]:
    """One Kimi call whose arguments stream one tagged delta per event."""
    head = ["Let me run it.", " <|tool_calls_section_begin|>", " <|tool_call_begin|>", " functions.bash:0",
            " <|tool_call_argument_begin|>", ' {"command": "echo']  # fmt: skip
    tail = ['"}', " <|tool_call_end|>", " <|tool_calls_section_end|>"]
    pieces, tags = tagged_plain(first, count)
    return head + pieces + tail, [None] * len(head) + tags + [None] * len(tail)


def latency_rows(rig: Rig, baseline: Mitmdump, addon: Mitmdump, quick: bool) -> list[Row]:
    """Per event, upstream write to client read, through each proxy in turn (interleaved and
    repeated; each figure the median over the runs). Only events of the steady state count: sent after every stream of the run
    has started (connections open at a fixed pace over `ramp` seconds) and before the first one
    ends, so that connection set-up and tear-down (per flow, not per event) stay out."""
    rows = []
    repeats = 2 if quick else 6
    ramp = 0.4
    next_tag = 0
    for kind, make in ((PLAIN, tagged_plain), (KIMI, tagged_kimi)):
        for streams, interval, seconds in ((1, 0.005, 0.6 if quick else 1.0), (50, 0.020, 1.0 if quick else 1.6)):
            per_stream = int(seconds / interval)
            runs: dict[str, list[list[float]]] = {baseline.name: [], addon.name: []}
            for rep in range(repeats):
                for proxy in (baseline, addon) if rep % 2 == 0 else (addon, baseline):
                    jobs = []
                    for k in range(streams):
                        pieces, tags = make(next_tag, per_stream)
                        next_tag += per_stream
                        # the role chunk first; the streams' writes spread evenly over the interval
                        plan = Plan(chat_stream(kind.model, pieces, kind.fields), interval, tags=[None, *tags], phase=k * interval / streams)
                        jobs.append((rig.plan(plan), request_body(kind.model)))
                    up = rig.upstream
                    up.sent_at.clear(), up.started.clear(), up.ended.clear()
                    arrivals: dict[int, float] = {}
                    gc.collect()
                    gc.disable()  # no collection of this process's heap in the middle of a sample
                    try:
                        answers = rig.fetch_all(proxy, jobs, streams, seconds * 10 + 30, arrivals, ramp if streams > 1 else 0.0)
                    finally:
                        gc.enable()
                    assert all(a.status == 200 for a in answers)
                    if proxy is addon and kind is KIMI:
                        assert all(tool_calls(a.body) == 1 for a in answers), "the Kimi call did not reach the client"
                    missing = len(up.sent_at) - len(arrivals.keys() & up.sent_at.keys())
                    assert missing == 0, f"{missing} tagged events never arrived"
                    first, last = max(up.started) + 0.1, min(up.ended)
                    runs[proxy.name].append([arrivals[tag] - at for tag, at in up.sent_at.items() if first <= at <= last])
            # Each run's median and p99, then the median over the runs: one run disturbed by
            # whatever else the machine did weighs no more than one run.
            b50, m50 = (median([median(run) for run in runs[p.name]]) for p in (baseline, addon))
            b99, m99 = (median([percentile(run, 0.99) for run in runs[p.name]]) for p in (baseline, addon))
            what = "plain text" if kind is PLAIN else "Kimi call arguments"
            events = sum(len(run) for run in runs[addon.name])
            load = f"{streams} stream{'s' if streams > 1 else ''}, an event every {interval * 1000:g} ms each, {repeats} x {events // repeats:,} events"
            at_50 = streams == 50
            rows.append(Row(
                SECTION, f"added latency per event, {what}, {load}: median (addon {m50 * 1e3:.3f} ms, baseline {b50 * 1e3:.3f} ms)",
                f"{(m50 - b50) * 1e3:+.3f} ms", "<= 0.3 ms" if at_50 else "", (m50 - b50) <= 0.0003 if at_50 else None,
            ))  # fmt: skip
            rows.append(Row(
                SECTION, f"added latency per event, {what}, {load}: p99 (addon {m99 * 1e3:.3f} ms, baseline {b99 * 1e3:.3f} ms)",
                f"{(m99 - b99) * 1e3:+.3f} ms", "<= 2 ms" if at_50 else "", (m99 - b99) <= 0.002 if at_50 else None,
            ))  # fmt: skip
    return rows


# -- 3. memory per open stream ------------------------------------------------------------------


def partial_kimi(seed: int, prose_events: int, args_chars: int) -> list[str]:
    """Reasoning prose, then a section and a call, its arguments cut half-way."""
    rng = random.Random(seed)
    pieces = tokens(prose(rng, prose_events // 2), rng)[:prose_events]
    pieces += [" <|tool_calls_section_begin|>", " <|tool_call_begin|>", " functions.bash:0", " <|tool_call_argument_begin|>"]
    arguments = orjson.dumps({"command": "cat > notes.txt <<'EOF'\n" + prose(rng, args_chars)[:args_chars] + "\nEOF"}).decode()
    return pieces + tokens(arguments[: len(arguments) // 2], rng)


def partial_sentinel(seed: int, prose_events: int, args_chars: int) -> list[str]:
    """Prose, then a `<tool_call>` block cut half-way through its JSON."""
    rng = random.Random(seed)
    block = {"name": "bash", "arguments": {"command": "cat > notes.txt <<'EOF'\n" + prose(rng, args_chars)[:args_chars] + "\nEOF"}}
    text = "<tool_call>\n" + orjson.dumps(block).decode()
    pieces = tokens(prose(rng, prose_events // 2), rng)[:prose_events] + ["\n"]
    return pieces + tokens(text[: len(text) // 2], rng)


def stream_state(kind: Kind, pieces: list[str], streams: int, keep_upstream: bool) -> dict[str, Any]:
    """What the addon keeps per open stream, by tracemalloc: `streams` flows go through the
    addon's own hooks (requestheaders, request, responseheaders, in `taddons`), then the stream
    callable they installed gets the stream up to `pieces`, one event per call. The flows
    themselves are made before tracing starts (they are mitmproxy's, baseline or not).

    Returns bytes per stream: everything; the state once `release()` dropped the body copies
    (what the client got, and with `toolshim_keep_upstream` what upstream sent); the largest
    allocation sites of that state; and the characters held back (released at the end)."""
    from mitmproxy.test import taddons, tflow, tutils

    from toolshim.addon import ToolShim

    events = chat_stream(kind.model, pieces, kind.fields)[:-3]  # no finish, usage, [DONE]: mid-stream
    shim = ToolShim()
    with taddons.context(shim) as tctx:
        tctx.configure(shim, toolshim_keep_upstream=keep_upstream)

        def flows(n: int) -> list[tuple[Any, Any]]:
            made = []
            for _ in range(n):
                flow = tflow.tflow()
                flow.request.method, flow.request.path = "POST", "/v1/chat/completions"
                flow.request.headers["content-type"] = "application/json"
                flow.request.content = request_body(kind.model)
                response = tutils.tresp(headers=((b"content-type", b"text/event-stream"), (b"transfer-encoding", b"chunked")))
                response.raw_content = None  # streamed: no body yet
                made.append((flow, response))
            return made

        def open_streams(made: list[tuple[Any, Any]]) -> None:
            for flow, response in made:
                shim.requestheaders(flow)
                shim.request(flow)
                flow.response = response
                shim.responseheaders(flow)
                for event in events:
                    response.stream(bytes(memoryview(event)))  # a new object per read, as mitmproxy hands them

        open_streams(flows(1))  # lazy imports, compiled patterns, caches: not per stream
        made = flows(streams)
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            open_streams(made)
            gc.collect()
            everything = tracemalloc.get_traced_memory()[0] - base
            for _, response in made:
                response.stream.release()  # the body copies go (the addon does this once a flow is done)
            gc.collect()
            state = tracemalloc.get_traced_memory()[0] - base
            top = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, "*toolshim*")]).statistics("lineno")[:2]
        finally:
            tracemalloc.stop()
        out = b"".join(made[0][1].stream.rewriter.close())  # what the rewriter still held
    held = 0
    for line in out.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in orjson.loads(line[6:]).get("choices") or ():
                delta = choice.get("delta") or {}
                held += max((len(delta.get(f) or "") for f in ("content", "reasoning_content")), default=0)
                held += sum(len((c.get("function") or {}).get("arguments") or "") for c in delta.get("tool_calls") or ())
    sites = [f"{_short(t.traceback[0].filename)}:{t.traceback[0].lineno} {t.size / streams / 1024:.1f} KB" for t in top]
    return {"all": everything / streams, "state": state / streams, "held": held, "sites": sites}


def _short(filename: str) -> str:
    return filename[filename.rfind("toolshim") :]


def memory_rows(quick: bool) -> list[Row]:
    streams = 6 if quick else 16
    rows = []
    for kind, pieces, where in (
        (KIMI, partial_kimi(5, 300, 2000), "mid-way through a Kimi call's arguments"),
        (SENTINEL, partial_sentinel(6, 300, 2000), "mid-way through a <tool_call> block"),
    ):
        kept = stream_state(kind, pieces, streams, keep_upstream=True)
        lean = stream_state(kind, pieces, streams, keep_upstream=False)
        beyond = kept["state"] - kept["held"]
        rows.append(Row(
            SECTION, f"memory per open stream, {where} ({len(pieces)} events in): the addon's state beyond the held-back text "
            f"({kept['held']:,} characters), body copies excluded; largest sites: {', '.join(kept['sites'])}",
            f"{beyond / 1024:.1f} KB", "<= 64 KB", beyond <= 64 * 1024,
        ))  # fmt: skip
        rows.append(Row(
            SECTION, f"memory per open stream, {where}: all of it, toolshim_keep_upstream on (default) / off",
            f"{kept['all'] / 1024:.1f} KB / {lean['all'] / 1024:.1f} KB",
        ))  # fmt: skip
    return rows


def rss_rows(rig: Rig, baseline: Mitmdump, addon: Mitmdump, quick: bool) -> list[Row]:
    """RSS of each mitmdump while `streams` Kimi streams are held open mid-call (sent fast: here
    a read may carry several events)."""
    streams = 50 if quick else 200
    pieces = partial_kimi(7, 60, 600)
    events = chat_stream(KIMI_MODEL, pieces + ['"}', " <|tool_call_end|>", " <|tool_calls_section_end|>"], KIMI_FIELDS)
    plan_id = rig.plan(Plan(events, 0.002, hold_at=len(pieces) + 1))
    body = request_body(KIMI_MODEL)
    per_stream = {}
    for proxy in (baseline, addon):
        rig.upstream.held.clear()
        before = proxy.rss()
        future = asyncio.run_coroutine_threadsafe(fetch_all(proxy.port, [(plan_id, body)] * streams, streams, 120), rig.loop)
        try:
            deadline = time.monotonic() + 60
            while len(rig.upstream.held) < streams and time.monotonic() < deadline and not future.done():
                time.sleep(0.05)
            assert len(rig.upstream.held) == streams, f"only {len(rig.upstream.held)} streams reached the middle of the call"
            time.sleep(1.0)  # mitmdump has handled every event sent
            during = proxy.rss()
            for conn in list(rig.upstream.held):
                rig.loop.call_soon_threadsafe(conn.release)
            answers = [parse_answer(r) for r in future.result(120)]
        finally:
            future.cancel()  # nothing left to cancel unless something failed
        assert all(a.status == 200 for a in answers)
        if proxy is addon:
            assert all(tool_calls(a.body) == 1 for a in answers)
        per_stream[proxy.name] = (during - before) / streams
    return [Row(
        SECTION, f"RSS of mitmdump per open stream, {streams} Kimi streams held mid-call ({len(pieces)} events in): addon / baseline",
        f"{per_stream[addon.name] / 1024:.0f} KB / {per_stream[baseline.name] / 1024:.0f} KB",
    )]  # fmt: skip


# -- all of it ----------------------------------------------------------------------------------


def run(quick: bool = False) -> list[Row]:
    """The "end to end" rows. Starts its own mitmdumps (and stops them), all on 127.0.0.1."""
    rows = memory_rows(quick)
    with Rig() as rig:
        baseline = rig.proxy("baseline", BASELINE_SCRIPT)
        addon = rig.proxy("addon", ADDON_SCRIPT)
        callable_ = rig.proxy("identity callable", BASELINE_SCRIPT, "passthrough_callable=true")
        floor = rig.proxy("parsing callable", BASELINE_SCRIPT, "passthrough_parse=true")
        # warm-up for the RSS figure: a few whole streams, so imports and caches are loaded
        warm = make_load(rig, KIMI, 4, 300, 0.0005, templates=2)
        for proxy in (baseline, addon):
            rig.fetch_all(proxy, warm.jobs, 2, 60)
        rows += rss_rows(rig, baseline, addon, quick)
        rows += cpu_rows(rig, baseline, addon, callable_, floor, quick)
        rows += latency_rows(rig, baseline, addon, quick)
        logged = {proxy.name: proxy.lines[:5] for proxy in rig.proxies if proxy.lines}
    assert not logged, f"a proxy wrote output during the bench (its CPU figures count it): {logged}"
    return rows


if __name__ == "__main__":
    from table import markdown

    started = time.perf_counter()
    result = run(quick="--quick" in sys.argv)
    print(markdown(result))
    print(f"\n({time.perf_counter() - started:.0f} s)")
