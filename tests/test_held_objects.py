"""What a stream's rewriter keeps from one read to the next: state, not objects made for each
lane or block. Inside a busy mitmdump every container a stream holds across a read counts toward
the garbage collector's next young collection (its count only goes back down for frees before
that collection runs), and the collections, the full ones with them, come that much sooner
(bench/HISTORY.md, the round "Objects a stream holds"). So the lanes' readers are functions of
their modules, not closures made for each lane (a cell for every value they hold), lanes keep
their leaf's class functions, not bound methods, and a lexer empties its lists and scanner for
the next block rather than making new ones. Counted with the collector off: each read's new
objects that outlive it are those in the youngest generation after it."""

from __future__ import annotations

import gc
import json
import random
import types

import pytest

from anthropic_stream import block_events, stream
from harness import sse_body
from kimi import kimi_chunks
from responses import number_events, responses_events, responses_sse
from toolshim.chat import ChatStreamRewriter
from toolshim.lexers.engine import lexer
from toolshim.lexers.specs import HERMES
from toolshim.messages import MessagesStreamRewriter
from toolshim.responses import ResponsesStreamRewriter
from toolshim.tools import RequestContext

from test_core_hermes import make_scope

BASH = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}
QWEN3 = "Qwen/Qwen3-32B"
KIMI = "moonshotai/Kimi-K2.5"
RESPONSES_TOOLS = [{"type": "function", "name": "bash", "parameters": BASH["function"]["parameters"]}]
MESSAGES_TOOLS = [{"name": "bash", "input_schema": BASH["function"]["parameters"]}]


def tokens(text: str, rng: random.Random) -> list[str]:
    """`text` in pieces of 1-4 characters, as a model's tokens come."""
    out, at = [], 0
    while at < len(text):
        size = rng.randint(1, 4)
        out.append(text[at : at + size])
        at += size
    return out


def kimi_pieces(calls: int) -> list[str]:
    rng, out = random.Random(5), []
    for n in range(calls):
        out += tokens(f"Step {n}: let me look at the files. ", rng)
        out += ["<|tool_calls_section_begin|>", "<|tool_call_begin|>", *tokens(f"functions.bash:{n}", rng), "<|tool_call_argument_begin|>"]
        out += tokens(json.dumps({"command": f"ls -la /srv/data/{n} && wc -l notes.txt"}), rng)
        out += ["<|tool_call_end|>", "<|tool_calls_section_end|>"]
    return out


def hermes_pieces(calls: int) -> list[str]:
    rng, out = random.Random(6), []
    for n in range(calls):
        out += tokens(f"Step {n}: let me look at the files.\n", rng)
        out += tokens("<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": f"ls -la /srv/data/{n} && wc -l notes.txt"}}) + "\n</tool_call>\n", rng)
    return out


def chat_body(model: str, pieces: list[str], field: str = "content") -> bytes:
    chunks = [{"id": "c", "object": "chat.completion.chunk", "model": model, "choices": [{"index": 0, "delta": {field: p}, "finish_reason": None}]} for p in pieces]
    return sse_body([*chunks, {"id": "c", "object": "chat.completion.chunk", "model": model, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}])


STREAMS = [
    pytest.param(lambda: ChatStreamRewriter(RequestContext.from_request({"model": KIMI, "tools": [BASH]})), sse_body(kimi_chunks(KIMI, kimi_pieces(6))), id="chat, Kimi"),
    pytest.param(lambda: ChatStreamRewriter(RequestContext.from_request({"model": QWEN3, "tools": [BASH]})), chat_body(QWEN3, hermes_pieces(6)), id="chat, <tool_call>"),
    pytest.param(
        lambda: ResponsesStreamRewriter(RequestContext.from_request({"model": QWEN3, "tools": RESPONSES_TOOLS, "stream": True})),
        responses_sse(number_events(responses_events(QWEN3, hermes_pieces(6)))), id="responses, <tool_call>",
    ),  # fmt: skip
    pytest.param(
        lambda: MessagesStreamRewriter(RequestContext.from_request({"model": KIMI, "tools": MESSAGES_TOOLS, "stream": True})),
        stream(KIMI, block_events(0, "thinking", kimi_pieces(6))), id="messages, Kimi",
    ),  # fmt: skip
]


def reads_of(body: bytes, events: int) -> list[bytes]:
    """The body in reads of `events` whole events each (bursts, as a fast upstream writes them)."""
    blocks = [block + b"\n\n" for block in body.split(b"\n\n") if block]
    return [b"".join(blocks[at : at + events]) for at in range(0, len(blocks), events)]


def outliving(make, reads: list[bytes]) -> list[tuple[bool, list[object]]]:
    """For each read: whether the echo check had decided before it, and the objects it made that
    outlive it (the collector off; the youngest generation emptied before each read)."""
    rewriter = make()
    for read in reads:  # (a first flow: the process's caches filled, compiled patterns and schemas)
        rewriter.feed(read)
    rewriter.close()
    gc.collect()
    gc.disable()
    try:
        rewriter = make()
        made = []
        for read in reads:
            decided = rewriter.changed
            gc.collect(0)
            out = rewriter.feed(read)
            del out
            made.append((decided, gc.get_objects(0)))
        return made
    finally:
        gc.enable()


@pytest.mark.parametrize(("make", "body"), STREAMS)
def test_no_read_leaves_a_function_a_cell_or_a_bound_method_behind_once_the_echo_check_decided(make, body):
    reads = reads_of(body, 8)
    made = outliving(make, reads)
    decided = [objects for was_decided, objects in made if was_decided]
    assert len(decided) >= len(reads) // 2  # (the first call decides it, early in each stream)
    left = [o for objects in decided for o in objects if type(o) in (types.FunctionType, types.CellType, types.MethodType)]
    assert not left, [getattr(o, "__qualname__", None) or getattr(o, "cell_contents", None) for o in left]


@pytest.mark.parametrize(("make", "body"), STREAMS)
def test_a_stream_holds_a_bounded_number_of_new_objects_across_its_reads(make, body):
    """Each call's lane and its rendered frames are new state (up to about twenty objects a
    call, after the stream's first reads); no read adds thirty: the closures a Responses lane
    was once made of (a cell for each value they held) added 40-55 at every call."""
    made = outliving(make, reads_of(body, 8))
    worst = max(len(objects) for decided, objects in made[3:])
    assert worst < 30, worst


def test_a_block_lexer_keeps_its_containers_from_block_to_block():
    """The `<tool_call>` lexer empties the block's text, its shown texts and its JSON scanner for
    the next block: six blocks later it holds the same containers as after the first."""
    rng = random.Random(7)
    hermes = lexer(HERMES, make_scope())
    blocks = [tokens('Hi.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris %d"}}\n</tool_call>\n' % n, rng) for n in range(7)]

    def containers() -> dict[str, int]:
        return {name: id(getattr(hermes, name)) for name in ("_raw", "_texts", "_scanner")} | {"_raw parts": id(hermes._raw._joined)}

    calls = 0
    for at, block in enumerate(blocks):
        for piece in block:
            calls += sum(type(s).__name__ == "CallEnd" for s in hermes.feed(piece))
        if at == 0:
            first = containers()
    assert calls == 7  # (each block was a call: the containers were filled and emptied)
    assert containers() == first


def test_the_kimi_lexer_keeps_its_lists_from_call_to_call():
    """Its whitespace held and its markup as written: emptied for the next call, not made again."""
    rewriter = ChatStreamRewriter(RequestContext.from_request({"model": KIMI, "tools": [BASH]}))
    leaf = None
    for read in reads_of(chat_body(KIMI, kimi_pieces(6)), 1):
        rewriter.feed(read)
        if leaf is None and rewriter._args is not None:
            leaf = rewriter._args.leaf
            first = (id(leaf._ws), id(leaf._raw))
    rewriter.close()
    assert type(leaf).__name__ == "KimiLexer" and rewriter.stats.calls == 6
    assert (id(leaf._ws), id(leaf._raw)) == first
