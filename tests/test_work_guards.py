"""Guards against quadratic regressions, counted rather than timed (bench/ times them).

The scaling cases of the benchmark, at small sizes: one tool call whose arguments grow,
delivered 1-4 characters per event (Kimi streams them live; Hermes holds the block), and text
with a `<` every few characters. The work counted: characters the marker search looks at
(`find_marker` from where it starts to the end of its buffer), characters the `<tool_call>`
block scanner examines, bytes the SSE framer scans, and events serialised again. Linear work per character stays the same when the input grows 16-fold.
"""

from __future__ import annotations

import json
import random
from collections import Counter

import orjson
import pytest

from harness import sse_body
from toolshim import chat, sse
from toolshim.chat import ChatStreamRewriter
from toolshim.lexers import base, deepseek, engine, harmony, kimi, think, tokens
from toolshim.tools import RequestContext

KINDS = ("marker search", "block scan", "framing")
LEXER_MODULES = (base, deepseek, engine, harmony, kimi, think, tokens)
BASH = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}


class Work(Counter):
    """Work counted by kind; `engine_lexers` are the engine lexers made meanwhile."""

    engine_lexers: list[engine.BlockLexer]


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch) -> Work:
    counted = Work()
    find_marker, cut, feed, dumps = base.find_marker, sse.SseFramer._cut, sse.SseFramer.feed, orjson.dumps
    hermes_init = engine.BlockLexer.__init__
    engine_lexers: list[engine.BlockLexer] = []

    def registering_init(lexer, *args, **kwargs):
        hermes_init(lexer, *args, **kwargs)
        engine_lexers.append(lexer)

    def counting_find_marker(buf, start, markers, final):
        counted["marker search"] += len(buf) - start
        return find_marker(buf, start, markers, final)

    def counting_cut(framer, final):
        counted["framing"] += len(framer._buf) - framer._scan
        return cut(framer, final)

    def counting_feed(framer, data):
        before = counted["framing"]
        blocks = feed(framer, data)
        if counted["framing"] == before:  # a read that was one whole event: looked at once
            counted["framing"] += len(data)
        return blocks

    def counting_dumps(value, *args, **kwargs):
        counted["serialised"] += 1
        return dumps(value, *args, **kwargs)

    for module in LEXER_MODULES:
        if hasattr(module, "find_marker"):
            monkeypatch.setattr(module, "find_marker", counting_find_marker)
    monkeypatch.setattr(sse.SseFramer, "_cut", counting_cut)
    monkeypatch.setattr(sse.SseFramer, "feed", counting_feed)
    monkeypatch.setattr(chat.orjson, "dumps", counting_dumps)
    monkeypatch.setattr(engine.BlockLexer, "__init__", registering_init)
    counted.engine_lexers = engine_lexers  # their block scanner counts its own work
    return counted


def tokens(text: str, seed: int) -> list[str]:
    rng, out, at = random.Random(seed), [], 0
    while at < len(text):
        size = rng.randint(1, 4)
        out.append(text[at : at + size])
        at += size
    return out


def arguments(size: int) -> str:
    rng = random.Random(size)
    return orjson.dumps({"command": "".join(rng.choice("abcdefgh ij/._-") for _ in range(size - 16))}).decode()


def kimi_call(size: int) -> list[str]:
    return ["<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions.bash:0", "<|tool_call_argument_begin|>",
            *tokens(arguments(size), 1), "<|tool_call_end|>", "<|tool_calls_section_end|>"]  # fmt: skip


def hermes_call(size: int) -> list[str]:
    return tokens('<tool_call>{"name": "bash", "arguments": ' + arguments(size) + "}</tool_call>", 2)


def angle_text(size: int) -> list[str]:
    rng = random.Random(3)
    return tokens("".join(rng.choice(("a < b ", "x<y ", "if i <n ", "<3 ", "<< ")) for _ in range(size // 5))[:size], 4)


def rewrite(model: str, pieces: list[str]) -> tuple[ChatStreamRewriter, bytes, bytes, int]:
    """The rewriter, its input and output bodies, and the number of events. (The test's own
    JSON is written with `json`: `orjson.dumps` is being counted.)"""
    chunks = [{"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]} for piece in pieces]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    body = sse_body(chunks)
    rewriter = ChatStreamRewriter(RequestContext.from_body(json.dumps({"model": model, "tools": [BASH]}).encode()))
    out = b"".join([piece for event in body.split(b"\n\n")[:-1] for piece in rewriter.feed(event + b"\n\n")] + rewriter.close())
    assert rewriter.failure is None
    return rewriter, body, out, len(chunks) + 1


@pytest.mark.parametrize(
    ("model", "make", "calls"),
    [("Kimi-K2.5", kimi_call, 1), ("Qwen2.5-72B", hermes_call, 1), ("Qwen2.5-72B", angle_text, 0), ("unknown-model", angle_text, 0)],
    ids=["kimi arguments", "hermes arguments", "text with '<' (qwen)", "text with '<' (all dialects)"],
)
def test_work_per_character_does_not_grow_with_the_input(work: Work, model, make, calls) -> None:
    per_char = {}
    for size in (2_000, 32_000):
        pieces = make(size)
        work.clear()
        work.engine_lexers.clear()
        rewriter, _, _, events = rewrite(model, pieces)
        assert rewriter.stats.calls == calls
        work["block scan"] = sum(lexer.examined for lexer in work.engine_lexers)
        chars = sum(map(len, pieces))
        per_char[size] = {kind: work[kind] / chars for kind in KINDS}
        assert work["serialised"] <= 2 * events, "an event may be serialised again once, plus its split-off finish"
    assert per_char[2_000]["framing"] > 0 and per_char[2_000]["marker search"] + per_char[2_000]["block scan"] > 0
    for kind in KINDS:
        assert per_char[32_000][kind] <= 1.3 * per_char[2_000][kind] + 0.05, (kind, per_char)


def test_a_stream_without_markup_is_never_serialised_again(work: Work) -> None:
    pieces = [f" word{n} and a [bracket] or {{brace}}" for n in range(500)]
    rewriter, body, out, _ = rewrite("unknown-model", pieces)
    assert work["serialised"] == 0 and not rewriter.changed
    assert out == body


def test_whole_reads_on_the_fast_path_give_what_event_by_event_reading_gives() -> None:
    """Reads that pass unframed (and the unfinished events they leave in the framer) change
    nothing: prose, a call, more prose, cut at random bytes, read like one event at a time."""
    from kimi import chunk
    from wire import check_chat_stream

    pieces = [f" word{n} [x] {{y}}" for n in range(60)] + tokens('<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>', 5)
    pieces += [f" after{n}" for n in range(60)]
    chunks = [chunk("Qwen2.5-72B", {"content": piece}) for piece in pieces]
    chunks.append(chunk("Qwen2.5-72B", {}, "stop"))
    body = sse_body(chunks)
    context = json.dumps({"model": "Qwen2.5-72B", "tools": [BASH]}).encode()

    def result(reads: list[bytes]) -> dict:
        rewriter = ChatStreamRewriter(RequestContext.from_body(context))
        out = b"".join([piece for read in reads for piece in rewriter.feed(read)] + rewriter.close())
        assert rewriter.failure is None
        accumulated = check_chat_stream(out)
        for call in accumulated["tool_calls"]:
            call["id"] = "minted"  # random each time
        return accumulated

    by_event = result([event + b"\n\n" for event in body.split(b"\n\n")[:-1]])
    assert [call["name"] for call in by_event["tool_calls"]] == ["bash"]
    rng = random.Random(7)
    for _ in range(40):
        cuts = sorted(rng.sample(range(1, len(body)), rng.randint(1, 40)))
        reads = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)])]
        assert result(reads) == by_event


# -- state held per open stream (bench/e2e.py measures its bytes; these count what it rests on) ---


def test_held_text_pieces_are_kept_as_a_few_long_strings():
    from toolshim.lexers.base import TextPieces

    rng = random.Random(7)
    pieces = ["".join(rng.choice("ab{}\"é ") for _ in range(rng.randint(1, 4))) for _ in range(10_000)]
    held = TextPieces()
    for count, piece in enumerate(pieces, 1):
        held.append(piece)
        stored = len(held._joined) + len(held._recent)
        assert stored <= count // TextPieces.BATCH + TextPieces.BATCH  # not one string per piece
        if count in (1, 300, 5_000):
            assert held.text() == "".join(pieces[:count])  # and reading it keeps it whole
    assert held.text() == "".join(pieces) and len(held._joined) + len(held._recent) == 1


def chat_events(pieces: list[str], done: bool = False) -> bytes:
    return sse_body([{"choices": [{"index": 0, "delta": {"content": piece}}]} for piece in pieces], done=done)


def qwen_with_bash() -> ChatStreamRewriter:
    return ChatStreamRewriter(RequestContext.from_request({"model": "qwen3", "tools": [BASH]}))


def test_a_long_held_block_is_compared_by_its_text_not_its_events():
    """Held events past `EchoCheck.MAX_UNSENT` bytes are read into what a client assembles:
    their text is kept (a byte a character), not their events (~85 bytes a character); text
    held past `MAX_HELD` decides it: changed, nothing kept. Released as it came, not changed."""
    from toolshim.stream import EchoCheck

    held_block = ["Hi ", "<tool_call>", "{"] + ["ab"] * 3_000
    rewriter = qwen_with_bash()
    body = chat_events(held_block)
    sent = [piece for start in range(0, len(body), 200) for piece in rewriter.feed(body[start : start + 200])]
    assert b"".join(sent).count(b"\n\n") == 1 and len(body) > 4 * EchoCheck.MAX_UNSENT  # "Hi " only: the block is held
    echo = rewriter._echo
    assert not rewriter.changed and len(echo._unsent) < EchoCheck.MAX_UNSENT  # the held events went into the assembly
    assert echo._assembly is not None and echo._assembly._held <= len("".join(held_block))
    rest = b"".join(rewriter.feed(chat_events([" and more"], done=True)) + rewriter.close())
    assert "<tool_call>{" + "ab" * 3_000 + " and more" in "".join(
        json.loads(line[6:])["choices"][0]["delta"]["content"] for line in rest.split(b"\n\n") if line.startswith(b"data: {")
    )  # released as text, nothing lost
    assert not rewriter.changed  # the client assembles what upstream sent

    rewriter = qwen_with_bash()
    longer = chat_events(["Hi ", "<tool_call>", "{"] + ["ab"] * (EchoCheck.MAX_HELD // 2 + 500))
    for start in range(0, len(longer), 200):
        rewriter.feed(longer[start : start + 200])
    assert rewriter.changed and rewriter._echo._assembly is None and not rewriter._echo._unsent  # decided: nothing kept


def test_one_large_event_passing_as_it_came_is_not_changed():
    from toolshim.stream import EchoCheck

    body = chat_events(["x" * (4 * EchoCheck.MAX_UNSENT), " then <b>", " more"], done=True)
    rewriter = qwen_with_bash()
    out = [piece for start in range(0, len(body), 1000) for piece in rewriter.feed(body[start : start + 1000])]
    assert b"".join(out + rewriter.close()) == body and not rewriter.changed


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n"], ids=["LF", "CRLF"])
def test_an_event_arriving_in_many_reads_is_scanned_once(work: Work, line_end: bytes) -> None:
    """The framer resumes where its last scan stopped: a long event cut into small reads costs
    each of its bytes one look, whatever its line ends (LF: `SseFramer._cut_lf`)."""
    for size in (20_000, 320_000):
        event = b"event: x" + line_end + b"data: " + b"y" * size + line_end + line_end
        framer = sse.SseFramer()
        work.clear()
        blocks = [block for at in range(0, len(event), 64) for block in framer.feed(event[at : at + 64])]
        assert blocks == [event] and framer.pending == 0
        assert work["framing"] <= len(event) + 64, (size, work["framing"])


@pytest.mark.parametrize(
    ("model", "thinking"),
    [("Qwen/Qwen3-Coder-480B-A35B-Instruct", False), ("Qwen/Qwen2.5-72B-Instruct", False), ("moonshotai/Kimi-K2.5", False),
     ("Qwen/Qwen3-235B-A22B", True), ("moonshotai/Kimi-K2-Thinking", True), ("moonshotai/Kimi-K2-Thinking", False), ("gpt-oss-120b", False)],
)  # fmt: skip
def test_a_model_s_second_stream_makes_no_marker_table(model, thinking):
    """Markers are compared by identity, and `find_marker` makes a table for each tuple of them
    it meets (`base._marker_table`, kept for the last 64): a lexer's tuples must be made of the
    same markers from one stream to the next (think.py's `_marker`), or every stream pays for
    tables of its own, and pushes out those of other models."""
    request = {"model": model, "tools": [BASH], "stream": True}
    if thinking:  # (a template that opens the reasoning: the lexer watches for a bare `</think>` after it)
        request["chat_template_kwargs"] = {"enable_thinking": True, "thinking": True}
    context = RequestContext.from_body(json.dumps(request).encode())
    text = "I will look. <think>no</think> <tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>"
    chunks = [{"choices": [{"index": 0, "delta": {"content": text[at : at + 3]}}]} for at in range(0, len(text), 3)]
    body = sse_body([*chunks, {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}])

    def stream_once() -> None:
        rewriter = ChatStreamRewriter(context)
        rewriter.feed(body)
        rewriter.close()

    stream_once()
    made = base._marker_table.cache_info().misses
    stream_once()
    assert base._marker_table.cache_info().misses == made


def test_think_lexers_alike_hold_the_same_markers():
    """Two think lexers made alike hold tuples of the same markers (equal as tuples: markers
    compare by identity), so that `find_marker` finds their tables made."""
    made = [think.ThinkLexer(tool_starts=("<tool_call>",), pairs={"<seed:think>": "</seed:think>"}, bare_close=("<tool_call>",)) for _ in range(2)]
    assert made[0]._think_markers == made[1]._think_markers and made[0]._watch_markers == made[1]._watch_markers
