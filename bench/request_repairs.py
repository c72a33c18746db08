"""Request repairs: what they add to a request, and what the conversation state holds.

    repair of a 200-message, 1 MB Kimi history   the work after the one parse that decides
                                                  (lookups, repairs, serialising), median
    a request that needs nothing                  the work after that parse, median
    in-process state                              entries and bytes after many more records
                                                  than its bounds allow
    remembering a turn                            reading what the client was given (a Kimi
                                                  stream's mirrored reasoning in 4-character
                                                  deltas) at the end of a stream: time per
                                                  byte, 1 MB vs 1 KB of reasoning
    remembering at the end                        the same at the terminal event of a turn whose
                                                  call's arguments are 20 KB, and of one of 32 KB
                                                  of reasoning, as the addon does it (the pieces
                                                  the lanes noted taken, the rest read), beside
                                                  reading every event again

Times are the thread's CPU time (`time.thread_time`): a request's repair is pure computation on
one thread, and CPU time does not count the waits for a core that a shared machine adds.

Run alone with `.venv/bin/python bench/request_repairs.py`, or as part of `bench/run.py`.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from table import Row  # noqa: E402
from toolshim.apis import CHAT  # noqa: E402
from toolshim.backends import RepairPolicy, backend_for  # noqa: E402
from toolshim.history import HistoryRepair  # noqa: E402
from toolshim.memory import KeyMaker, LocalStore, turns_given, turns_given_pieces  # noqa: E402
from toolshim.stream import NotedEvents  # noqa: E402

POLICY = RepairPolicy.parse("auto")
HEADERS = {"authorization": "Bearer sk-bench"}


def kimi_history(turns: int = 100, size: int = 1 << 20) -> tuple[bytes, LocalStore]:
    """A request of 2 x `turns` messages and about `size` bytes whose assistant turns all lost
    their reasoning (as opencode sends them), half of them with foreign ids; and a state that
    holds the reasoning of every turn, as toolshim remembered it from the responses."""
    filler = "y" * (size // turns)
    messages = [{"role": "user", "content": "Refactor the parser."}]
    keys = KeyMaker.for_request({"messages": messages}, HEADERS)
    store = LocalStore(100_000, 1 << 30, 3600)
    for n in range(turns - 1):
        call_id = f"call_{n:04d}" if n % 2 else f"functions.bash:{n}"
        call = {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": orjson.dumps({"command": f"grep -n {n} src"}).decode()}}
        given = orjson.dumps({"choices": [{"message": {"reasoning_content": f"Step {n}: " + filler[:400], "tool_calls": [call]}}]})
        for turn in turns_given(CHAT, given):
            store.put_many(turn.records(keys, all_turns=False))
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": call_id, "content": filler}]
    messages.append({"role": "user", "content": "Go on."})
    return orjson.dumps({"model": "moonshotai/Kimi-K2-Thinking", "messages": messages, "stream": True}), store


def repair_seconds(body: bytes, store: LocalStore, rounds: int) -> tuple[float, float, int]:
    """(median seconds of the repair after the parse, median seconds of the parse, changes)."""
    repairs, parses, changes = [], [], 0
    for _ in range(rounds):
        # The last round's request (1 MB of objects) and output go before the clock starts, as the
        # addon is done with one request before it parses the next: kept alive into the next
        # round, they had the allocator hand memory back and fault it in again inside the timed
        # parse and repair (four times the page faults; parse and repair each read 1-2 ms more).
        request = repair = out = None
        start = time.thread_time()
        request = orjson.loads(body)  # the one parse the addon makes anyway
        parsed = time.thread_time()
        backend = backend_for(request["model"])
        repair = HistoryRepair(request, CHAT, POLICY.repairs_for(backend), backend, KeyMaker.for_request(request, HEADERS))
        if repair.apply(store.get_many(repair.wanted_keys())):
            out = orjson.dumps(request)
        done = time.thread_time()
        repairs.append(done - parsed)
        parses.append(parsed - start)
        changes = len(repair.changes)
    assert out != body and b"reasoning_content" in out
    return statistics.median(repairs), statistics.median(parses), changes


def untouched_seconds(body: bytes, rounds: int) -> float:
    """What a request to a model that needs nothing costs after the parse: the table lookup."""
    times = []
    for _ in range(rounds):
        request = orjson.loads(body)
        start = time.thread_time()
        assert not POLICY.repairs_for(backend_for(request["model"]))
        times.append(time.thread_time() - start)
    return statistics.median(times)


def state_bounds(records: int) -> tuple[int, int, LocalStore]:
    store = LocalStore(max_entries=10_000, max_bytes=8 << 20, ttl=3600)
    value = orjson.dumps({"reasoning_content": "z" * 2000})
    for n in range(records):
        store.put_many({f"toolshim:reasoning:{n:040x}": value})
    return len(store), store.stats.bytes, store


def remembering_seconds_per_byte(size: int) -> float:
    """`turns_given` of a Chat stream whose reasoning is `size` characters in 4-character deltas
    (`reasoning_content` and `reasoning` mirrored, as Kimi's servers send them), per character."""
    delta = b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"abcd","reasoning":"abcd"}}]}\n\n'
    body = delta * (size // 4) + b"data: [DONE]\n\n"
    rounds = max(1, (1 << 20) // size)
    start = time.thread_time()
    for _ in range(rounds):
        [turn] = turns_given(CHAT, body)
    assert len(turn.reasoning["reasoning_content"]) == size // 4 * 4
    return (time.thread_time() - start) / rounds / size


def streamed_kimi_turn(reasoning: str, events_a_read: int = 8) -> tuple[list[bytes], NotedEvents]:
    """A Kimi turn of `reasoning` (mirrored fields, 4-character deltas, as Kimi's servers send
    them; markup in it becomes calls) through the addon's stream callable in reads of
    `events_a_read`: what it hands to remembering at the terminal event (`sent`, and the events
    the lanes noted)."""
    from toolshim.addon import StreamRewrite
    from toolshim.chat import ChatStreamRewriter
    from toolshim.encoding import incremental_decoder
    from toolshim.tools import RequestContext

    model = "moonshotai/Kimi-K2.5"
    tools = [{"type": "function", "function": {"name": "write", "parameters": {"type": "object"}}}]
    context = RequestContext.from_body(orjson.dumps({"model": model, "tools": tools, "stream": True}))

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        return b"data: " + orjson.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + b"\n\n"

    pieces = [reasoning[at : at + 4] for at in range(0, len(reasoning), 4)]
    events = [chunk({"role": "assistant", "content": ""}), *(chunk({"reasoning": p, "reasoning_content": p}) for p in pieces), chunk({}, "tool_calls"), b"data: [DONE]\n\n"]
    handed = []
    stream = StreamRewrite(ChatStreamRewriter(context), incremental_decoder(""), "bench", False, on_terminal=lambda sent, noted: handed.append((sent, noted)))
    for at in range(0, len(events), events_a_read):
        stream(b"".join(events[at : at + events_a_read]))
    stream(b"")
    [(sent, noted)] = handed
    return sent, noted


def kimi_call(arguments: dict) -> str:
    """Kimi's markup of one call of `write`."""
    body = orjson.dumps(arguments).decode()
    return f"<|tool_calls_section_begin|><|tool_call_begin|>functions.write:0<|tool_call_argument_begin|>{body}<|tool_call_end|><|tool_calls_section_end|>"


# A call that writes a 20 KB file; 32 KB of thinking before a short call.
BIG_CALL = "Writing it." + kimi_call({"path": "a.py", "content": "x = 1\n" * 3500})
LONG_THOUGHT = "Let me think about the parser and what it does with each line. " * 500 + kimi_call({"path": "a.py", "content": ""})


def remembering_at_the_end(reasoning: str, rounds: int) -> tuple[float, float]:
    """Median seconds of remembering `streamed_kimi_turn(reasoning)` as the addon does (the
    events the lanes noted taken, the others read), and of reading every event sent again."""
    sent, noted = streamed_kimi_turn(reasoning)
    taken, read_again = [], []
    for _ in range(rounds):
        start = time.thread_time()
        [turn] = turns_given_pieces(CHAT, sent, noted)
        middle = time.thread_time()
        [again] = turns_given(CHAT, b"".join(sent))
        taken.append(middle - start)
        read_again.append(time.thread_time() - middle)
    assert turn == again and turn.calls
    return statistics.median(taken), statistics.median(read_again)


def run(quick: bool = False) -> list[Row]:
    rounds = 15 if quick else 60
    body, store = kimi_history()
    repair, parse, changes = repair_seconds(body, store, rounds)
    plain = orjson.dumps({**orjson.loads(body), "model": "llama-3.3-70b"})
    nothing = untouched_seconds(plain, rounds)
    entries, held, bounded = state_bounds(20_000 if quick else 100_000)
    small, large = remembering_seconds_per_byte(1 << 10), remembering_seconds_per_byte(1 << 20)
    call_taken, call_read = remembering_at_the_end(BIG_CALL, rounds // 3)
    thought_taken, thought_read = remembering_at_the_end(LONG_THOUGHT, rounds // 3)
    return [
        Row("requests", f"repair of a 200-message, {len(body) / 1e6:.1f} MB Kimi history ({changes} changes: reasoning, ids), added after the parse, median", f"{repair * 1e3:.2f} ms", "<= 1 ms", repair <= 1e-3),
        Row("requests", "the parse that decides (made for every LLM request, before and without repairs), median", f"{parse * 1e3:.2f} ms"),
        Row("requests", "a request to a model that needs nothing: work after the parse (no re-serialisation, byte for byte)", f"{nothing * 1e6:.1f} us", "no re-serialisation", True),
        Row("scaling", "remembering what the client was given (a Kimi stream's reasoning, 4-character deltas): time per byte, 1 MB vs 1 KB", f"{large * 1e9:.0f} ns vs {small * 1e9:.0f} ns = {large / small:.2f}x", "<= 1.3x", large / small <= 1.3),
        Row(
            "requests",
            "remembering a Kimi turn whose call writes 20 KB (6,200 events, reads of 8), at its terminal event, median: the lane's noted pieces taken / every event read again",
            f"{call_taken * 1e3:.2f} ms / {call_read * 1e3:.2f} ms",
        ),
        Row(
            "requests",
            "remembering a Kimi turn of 32 KB of reasoning and a short call (8,000 events, reads of 8), at its terminal event, median: the lanes' noted pieces taken / every event read again",
            f"{thought_taken * 1e3:.2f} ms / {thought_read * 1e3:.2f} ms",
        ),
        Row("requests", f"in-process state after {bounded.stats.evicted + entries:,} records of 2 KB (bounds 10,000 entries, 8 MB)", f"{entries:,} entries, {held / 2**20:.1f} MB", "<= the bounds", entries <= 10_000 and held <= 8 << 20),
    ]


if __name__ == "__main__":
    from table import markdown

    print(markdown(run("--quick" in sys.argv[1:])))
