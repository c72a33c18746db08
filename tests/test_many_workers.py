"""Many mitmdump workers behind a real load balancer, sharing state through a real Redis.

Kimi's thinking mode wants every assistant message with tool calls sent back with its
`reasoning_content`; clients such as LangChain and opencode drop it. toolshim remembers the
reasoning it sent with a tool call and puts it back into the later request that lost it. With
several workers behind a round-robin balancer the next turn usually lands on another worker, so
the memory has to be shared (`toolshim_state=redis://...`).

Everything here is a real process: two mitmdump workers with the addon, HAProxy in front of
them, `redis-server`, a scripted upstream that answers like Moonshot in thinking mode, and the
OpenAI SDK as the client. The servers come from Debian's packages (tests/run installs them).
"""

from __future__ import annotations

import http.client
import json
import re
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest

from harness import Mitmdump, RecordedRequest, Script, ScriptedUpstream, chat_chunk, sse_body
from services import HaProxy, RedisServer

WORKER_HEADER = "x-toolshim-worker"
WORKER_NAMES = ("A", "B")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
TOOL_OUTPUT = {"ls": "notes.txt", "pwd": "/srv/app"}

# What the upstream streams, one SSE event per piece: Kimi's tool-call markup leaked at the end
# of reasoning_content (a marker cut between two events, too), finish_reason "stop".
TURN_REASONING = {
    1: [
        "Let me look.",
        " <|tool_calls_sec",
        "tion_begin|><|tool_call_begin|>functions.",
        "bash:0<|tool_call_argument_begin|>",
        '{"command": ',
        '"ls"}<|tool_call_end|>',
        "<|tool_calls_section_end|>",
    ],
    2: [
        "One file there;",
        " now where am I?",
        "<|tool_calls_section_begin|><|tool_call_begin|>",
        "functions.bash:1",
        "<|tool_call_argument_begin|>",
        '{"command": "pwd"}',
        "<|tool_call_end|><|tool_calls_section_end|>",
    ],
    3: ["Both commands answered."],
}
# The reasoning the client sees: the markup gone (toolshim may keep the space before it).
REASONING_SEEN = {1: "Let me look.", 2: "One file there; now where am I?", 3: "Both commands answered."}
EXPECTED_CALLS = {
    1: ("functions.bash:0", "bash", {"command": "ls"}),
    2: ("functions.bash:1", "bash", {"command": "pwd"}),
}
FINAL_ANSWER = "There is one file, notes.txt, in /srv/app."
MISSING_REASONING = (
    "thinking is enabled but reasoning_content is missing in assistant tool call message at index {}"
)

STORE_WARNING = re.compile(r"(?=.*toolshim)(?=.*state)(?=.*unreachable)", re.IGNORECASE)
ADDON_ERROR = re.compile(r"Traceback|addon error", re.IGNORECASE)


# --------------------------------------------------------------------------
# The upstream: Moonshot in thinking mode
# --------------------------------------------------------------------------


def _error(status: int, message: str) -> Script:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error"}})
    return Script(
        status=status,
        headers=(("content-type", "application/json"),),
        chunks=(body.encode(),),
        framing="content-length",
    )


def moonshot_thinking(model: str):
    """A responder for ScriptedUpstream.add_responder: the turn is told by the number of tool
    results in the history; an assistant message with tool calls but no reasoning_content is
    refused with Moonshot's 400."""

    def respond(request: RecordedRequest) -> Script:
        body = request.json if isinstance(request.json, dict) else {}
        messages = body.get("messages") or []
        for index, message in enumerate(messages):
            if message.get("role") == "assistant" and message.get("tool_calls"):
                reasoning = message.get("reasoning_content")
                if not isinstance(reasoning, str) or not reasoning:
                    return _error(400, MISSING_REASONING.format(index))
        turn = 1 + sum(1 for message in messages if message.get("role") == "tool")
        if turn not in TURN_REASONING:
            return _error(400, f"unexpected turn {turn}")
        chunks = [chat_chunk(model, role="assistant", content="")]
        chunks += [
            chat_chunk(model, extra_delta={"reasoning_content": piece})
            for piece in TURN_REASONING[turn]
        ]
        if turn == 3:
            chunks += [
                chat_chunk(model, content=FINAL_ANSWER[:20]),
                chat_chunk(model, content=FINAL_ANSWER[20:]),
            ]
        chunks.append(chat_chunk(model, extra_delta={"reasoning_content": ""}, finish_reason="stop"))
        chunks.append(
            {
                **chat_chunk(model),
                "choices": [],
                "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
            }
        )
        events = [sse_body([c], done=False) for c in chunks] + [b"data: [DONE]\n\n"]
        return Script(chunks=tuple(events), framing="chunked", delay=0.005)

    return respond


# --------------------------------------------------------------------------
# The client: the OpenAI SDK, dropping reasoning_content like LangChain and opencode
# --------------------------------------------------------------------------


@dataclass
class Turn:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class Conversation:
    client: openai.OpenAI
    model: str
    user_text: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.messages = [
            {"role": "system", "content": "You are a careful shell assistant."},
            {"role": "user", "content": self.user_text},
        ]

    def step(self) -> Turn:
        """One streamed turn; its tool calls go into the history without reasoning_content,
        followed by their results."""
        turn = Turn()
        calls: dict[int, dict[str, str]] = {}
        stream = self.client.chat.completions.create(
            model=self.model, messages=self.messages, tools=TOOLS, stream=True
        )
        for chunk in stream:
            for choice in chunk.choices:
                delta = choice.delta
                reasoning = (delta.model_extra or {}).get("reasoning_content")
                if reasoning:
                    turn.reasoning += reasoning
                if delta.content:
                    turn.content += delta.content
                for call in delta.tool_calls or []:
                    slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                    if call.id:
                        slot["id"] = call.id
                    if call.function is not None:
                        if call.function.name:
                            slot["name"] = call.function.name
                        if call.function.arguments:
                            slot["arguments"] += call.function.arguments
                if choice.finish_reason:
                    turn.finish_reason = choice.finish_reason
        turn.tool_calls = [calls[i] for i in sorted(calls)]
        self.turns.append(turn)
        if turn.tool_calls:
            self.messages.append(
                {
                    "role": "assistant",
                    "content": turn.content,
                    "tool_calls": [
                        {
                            "id": c["id"],
                            "type": "function",
                            "function": {"name": c["name"], "arguments": c["arguments"]},
                        }
                        for c in turn.tool_calls
                    ],
                }
            )
            for c in turn.tool_calls:
                command = json.loads(c["arguments"]).get("command", "")
                self.messages.append(
                    {"role": "tool", "tool_call_id": c["id"], "content": TOOL_OUTPUT.get(command, "")}
                )
        return turn


def check_turn(turn: Turn, number: int) -> None:
    """The turn reached the client repaired: a real tool call, no markup in the reasoning."""
    assert "<|" not in turn.reasoning and "|>" not in turn.reasoning, turn.reasoning
    assert turn.reasoning.strip() == REASONING_SEEN[number]
    if number in EXPECTED_CALLS:
        call_id, name, arguments = EXPECTED_CALLS[number]
        assert turn.finish_reason == "tool_calls", turn
        assert [(c["id"], c["name"], json.loads(c["arguments"])) for c in turn.tool_calls] == [
            (call_id, name, arguments)
        ]
    else:
        assert turn.tool_calls == []
        assert turn.content == FINAL_ANSWER
        assert turn.finish_reason == "stop"


# --------------------------------------------------------------------------
# Workers behind HAProxy
# --------------------------------------------------------------------------


@dataclass
class Cluster:
    workers: dict[str, Mitmdump]
    balancer: HaProxy

    @property
    def base_url(self) -> str:
        return self.balancer.base_url

    def client(self, api_key: str = "sk-test-key", **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.base_url, api_key=api_key, max_retries=0, timeout=30, **kwargs
        )

    def check_logs_clean(self) -> None:
        for name, worker in self.workers.items():
            assert worker.returncode is None, f"worker {name} exited:\n{worker.log_text()}"
            bad = [line for line in worker.log_lines() if ADDON_ERROR.search(line)]
            assert not bad, f"worker {name} logged an error:\n{worker.log_text()}"


@contextmanager
def cluster(upstream: ScriptedUpstream, state: str | None, *extra: str) -> Iterator[Cluster]:
    """Two mitmdump workers (marking what they forward with x-toolshim-worker: A / B), with
    `toolshim_state=state` when given, behind HAProxy's round robin."""
    with ExitStack() as stack:
        workers = {}
        for name in WORKER_NAMES:
            args = ["--modify-headers", f"/~q/{WORKER_HEADER}/{name}", *extra]
            if state is not None:
                args += ["--set", f"toolshim_state={state}"]
            workers[name] = Mitmdump(upstream.url, extra_args=args)
            stack.callback(workers[name].stop)
        with ThreadPoolExecutor(len(workers)) as pool:
            list(pool.map(lambda worker: worker.start(), workers.values()))
        balancer = stack.enter_context(HaProxy([w.port for w in workers.values()]))
        try:
            yield Cluster(workers, balancer)
        except BaseException:
            # pytest shows this with the failure
            for name, worker in workers.items():
                print(f"--- mitmdump worker {name} ---\n{worker.log_text()}")
            print(f"--- haproxy ---\n{balancer.log_text()}")
            raise


def forwarded_by(upstream: ScriptedUpstream, model: str) -> list[str | None]:
    return [r.headers.get(WORKER_HEADER) for r in upstream.requests_for(model)]


def assistant_reasoning(request: RecordedRequest) -> list[Any]:
    """reasoning_content of each assistant message with tool calls, as upstream received it."""
    return [
        m.get("reasoning_content")
        for m in request.json["messages"]
        if m.get("role") == "assistant" and m.get("tool_calls")
    ]


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def kimi_model(unique_model: str) -> str:
    """A model name that makes toolshim treat the flow as Kimi's (reasoning round trip)."""
    return f"kimi-k2-thinking-{unique_model}"


# --------------------------------------------------------------------------
# The balancer itself
# --------------------------------------------------------------------------


def test_haproxy_balances_each_request_on_one_connection() -> None:
    """On ONE keep-alive client connection consecutive requests alternate between the backends."""
    with ScriptedUpstream() as first, ScriptedUpstream() as second:
        for server, name in ((first, b"A"), (second, b"B")):
            server.add("/who", chunks=[name], framing="content-length")
        with HaProxy([first.port, second.port]) as balancer:
            conn = http.client.HTTPConnection("127.0.0.1", balancer.port, timeout=10)
            try:
                answers, client_ports = [], set()
                for _ in range(6):
                    conn.request("GET", "/who")
                    answers.append(conn.getresponse().read())
                    client_ports.add(conn.sock.getsockname()[1])
            finally:
                conn.close()
    assert len(client_ports) == 1  # one client connection throughout
    assert answers in ([b"A", b"B"] * 3, [b"B", b"A"] * 3)


def test_haproxy_passes_each_event_before_the_next_is_written() -> None:
    """SSE through the balancer is not buffered: the upstream writes its second event only once
    the client has read the first (ordered by events, not timed)."""
    client_read_first = threading.Event()
    wrote_second_early = []

    def serve(listener: socket.socket) -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            conn.sendall(b"a\r\ndata: one\n\r\n")
            wrote_second_early.append(not client_read_first.wait(20))
            conn.sendall(b"a\r\ndata: two\n\r\n0\r\n\r\n")

    with socket.create_server(("127.0.0.1", 0)) as listener:
        server = threading.Thread(target=serve, args=(listener,), daemon=True)
        server.start()
        with HaProxy([listener.getsockname()[1]]) as balancer:
            conn = http.client.HTTPConnection("127.0.0.1", balancer.port, timeout=30)
            try:
                conn.request("GET", "/sse")
                response = conn.getresponse()
                first = response.readline()
                client_read_first.set()
                rest = response.read()
            finally:
                conn.close()
        server.join(timeout=30)
    assert first == b"data: one\n" and b"data: two" in rest
    assert wrote_second_early == [False]


# --------------------------------------------------------------------------
# The reasoning round trip across workers
# --------------------------------------------------------------------------


def test_shared_state_restores_reasoning_across_workers(
    upstream: ScriptedUpstream, redis_server: RedisServer, kimi_model: str
) -> None:
    upstream.add_responder(kimi_model, moonshot_thinking(kimi_model))
    with cluster(upstream, redis_server.url) as workers, workers.client() as client:
        chat = Conversation(client, kimi_model, "What is in the current directory, and where is it?")
        for number in (1, 2, 3):
            check_turn(chat.step(), number)
        workers.check_logs_clean()

    requests = upstream.requests_for(kimi_model)
    assert len(requests) == 3
    # round robin: the turns were forwarded by both workers, never twice in a row by one
    by = forwarded_by(upstream, kimi_model)
    assert set(by) == {"A", "B"} and by[0] != by[1] != by[2], by
    # the upstream got back exactly the reasoning the client had been sent, markup-free
    first, second = chat.turns[0].reasoning, chat.turns[1].reasoning
    assert assistant_reasoning(requests[1]) == [first]
    assert assistant_reasoning(requests[2]) == [first, second]
    # the client itself never sent any reasoning back
    assert all("reasoning_content" not in m for m in chat.messages)


def test_without_shared_state_the_other_worker_cannot_restore(
    upstream: ScriptedUpstream, kimi_model: str
) -> None:
    """Each worker remembers in its own process: the turn that lands on the other worker goes
    upstream without reasoning and gets Moonshot's 400; the same turn on the first worker
    again works. This is what the shared store is for."""
    upstream.add_responder(kimi_model, moonshot_thinking(kimi_model))
    with cluster(upstream, None) as workers, workers.client() as client:
        chat = Conversation(client, kimi_model, "What is in the current directory?")
        check_turn(chat.step(), 1)
        with pytest.raises(openai.BadRequestError) as refused:
            chat.step()
        assert refused.value.status_code == 400
        assert MISSING_REASONING.format(2) in str(refused.value)
        by = forwarded_by(upstream, kimi_model)
        assert by[0] != by[1], by
        assert assistant_reasoning(upstream.requests_for(kimi_model)[1]) == [None]

        # the next request goes to the worker that served turn 1, which remembers
        check_turn(chat.step(), 2)
        by = forwarded_by(upstream, kimi_model)
        assert by[2] == by[0], by
        assert assistant_reasoning(upstream.requests_for(kimi_model)[2]) == [chat.turns[0].reasoning]
        workers.check_logs_clean()


# --------------------------------------------------------------------------
# Failing open
# --------------------------------------------------------------------------


def store_warnings(worker: Mitmdump) -> list[str]:
    return [line for line in worker.log_lines() if STORE_WARNING.search(line)]


def test_store_unreachable_fails_open_then_recovers(
    upstream: ScriptedUpstream, redis_server: RedisServer, kimi_model: str
) -> None:
    """Redis stopped: requests go upstream as the client sent them (the upstream's own 400
    comes back), each worker warns once, nothing errors; Redis back: repairs again."""
    upstream.add_responder(kimi_model, moonshot_thinking(kimi_model))
    with cluster(upstream, redis_server.url) as workers, workers.client() as client:
        before = Conversation(client, kimi_model, "List the directory, then tell me where it is.")
        check_turn(before.step(), 1)  # its reasoning is stored while Redis is up

        redis_server.stop()  # connection refused from now on
        assert not redis_server.ping()

        # Turn 2 lands on the other worker: the lookup fails, the request goes upstream as the
        # client sent it, and the upstream's own 400 comes back (not a proxy error).
        with pytest.raises(openai.BadRequestError) as refused:
            before.step()
        assert MISSING_REASONING.format(2) in str(refused.value)
        assert assistant_reasoning(upstream.requests_for(kimi_model)[-1]) == [None]

        # A new conversation while Redis is down: the stream is still repaired (the store
        # write fails on one worker), its turn 2 fails upstream on the other.
        during = Conversation(client, kimi_model, "Same again, please, while the store is down.")
        check_turn(during.step(), 1)
        with pytest.raises(openai.BadRequestError) as refused:
            during.step()
        assert MISSING_REASONING.format(2) in str(refused.value)
        assert assistant_reasoning(upstream.requests_for(kimi_model)[-1]) == [None]

        by = forwarded_by(upstream, kimi_model)
        assert set(by[1:]) == {"A", "B"}, by  # both workers met the unreachable store
        for worker in workers.workers.values():
            worker.wait_for_log(STORE_WARNING, timeout=10)
        for name, worker in workers.workers.items():
            assert len(store_warnings(worker)) == 1, (
                f"worker {name}: not exactly one store warning:\n{worker.log_text()}"
            )
        workers.check_logs_clean()

        # Redis back on the same port (empty): repairs work again. A client may reconnect
        # after a pause, so a few fresh conversations are allowed before one must go through.
        redis_server.start()
        deadline = time.monotonic() + 20
        attempt = 0
        while True:
            attempt += 1
            after = Conversation(client, kimi_model, f"Once more, the store is back ({attempt}).")
            sent = len(upstream.requests_for(kimi_model))
            try:
                for number in (1, 2, 3):
                    check_turn(after.step(), number)
                break
            except openai.BadRequestError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        requests = upstream.requests_for(kimi_model)[sent:]
        assert {r.headers.get(WORKER_HEADER) for r in requests} == {"A", "B"}
        assert assistant_reasoning(requests[2]) == [after.turns[0].reasoning, after.turns[1].reasoning]
        for name, worker in workers.workers.items():
            assert len(store_warnings(worker)) == 1, f"worker {name}:\n{worker.log_text()}"
        workers.check_logs_clean()


def test_store_hanging_fails_open(
    upstream: ScriptedUpstream, redis_server: RedisServer, kimi_model: str
) -> None:
    """A Redis that accepts connections but never answers (SIGSTOP): requests still complete
    (the flow waits at most toolshim_state_timeout), with the upstream's own answer."""
    upstream.add_responder(kimi_model, moonshot_thinking(kimi_model))
    with cluster(upstream, redis_server.url, "--set", "toolshim_state_timeout=250") as workers:
        with workers.client() as client:
            chat = Conversation(client, kimi_model, "What is in the current directory?")
            check_turn(chat.step(), 1)
            redis_server.freeze()
            try:
                with pytest.raises(openai.BadRequestError) as refused:
                    chat.step()
                assert MISSING_REASONING.format(2) in str(refused.value)
                fresh = Conversation(client, kimi_model, "And with the store hanging?")
                check_turn(fresh.step(), 1)
            finally:
                redis_server.thaw()
        assert any(store_warnings(w) for w in workers.workers.values()), "the hang went unreported"
        workers.check_logs_clean()


# --------------------------------------------------------------------------
# What reaches Redis
# --------------------------------------------------------------------------

_WORD = re.compile(r"[A-Za-z0-9_.-]{1,24}")
_HASH = re.compile(r"[0-9a-fA-F]{32,}|[A-Za-z0-9_+/-]{22,}={0,2}")


def test_no_credential_or_header_value_reaches_redis(
    upstream: ScriptedUpstream, redis_server: RedisServer, kimi_model: str
) -> None:
    api_key = "sk-test-secret-" + secrets.token_hex(16)
    header_secret = "hdr-secret-" + secrets.token_hex(16)
    user_text = "Tell me what the directory holds " + secrets.token_hex(4)
    upstream.add_responder(kimi_model, moonshot_thinking(kimi_model))
    with cluster(upstream, redis_server.url) as workers:
        with workers.client(api_key, default_headers={"x-team-token": header_secret}) as client:
            chat = Conversation(client, kimi_model, user_text)
            for number in (1, 2, 3):
                check_turn(chat.step(), number)
        workers.check_logs_clean()

    # the secrets did go through the workers
    last = upstream.requests_for(kimi_model)[-1]
    assert last.headers["authorization"] == f"Bearer {api_key}"
    assert last.headers["x-team-token"] == header_secret

    stored = redis_server.dump()
    assert stored, "nothing was stored in Redis"
    blobs = [key for key in stored] + [part for parts in stored.values() for part in parts]
    for blob in blobs:
        lowered = blob.lower()
        assert api_key.encode() not in blob, blob
        assert header_secret.encode() not in blob, blob
        assert b"sk-test-secret" not in lowered, blob
        assert b"bearer" not in lowered and b"authorization" not in lowered, blob
        assert b"x-team-token" not in lowered, blob

    # keys are hashes: no call id, tool name, argument, user text or model name in them
    for key in stored:
        text = key.decode("ascii")  # a hash-based key is plain ASCII
        segments = text.split(":")
        assert all(_WORD.fullmatch(s) or _HASH.fullmatch(s) for s in segments), text
        assert any(_HASH.fullmatch(s) for s in segments), f"no hash in key {text!r}"
        assert kimi_model not in text and "functions" not in text and "bash" not in text, text
