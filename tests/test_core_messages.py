"""The Messages rewriter, sans-IO (addon/toolshim/messages.py): the wire rules, every split,
broken native streams, cut-offs, and the JSON-prefix check behind the native repair."""

from __future__ import annotations

import json

import pytest
from anthropic_stream import BASH_TOOL, block_events, check_messages_stream, message_body, message_start, sse, stream, tool_use_events
from hypothesis import given, settings
from hypothesis import strategies as st
from kimi import ARG_BEGIN, CALL_BEGIN, CALL_END, SECTION_BEGIN, SECTION_END
from toolshim.messages import JsonPrefix, MessagesStreamRewriter, rewrite_messages_body
from toolshim.tools import RequestContext

KIMI = [SECTION_BEGIN, CALL_BEGIN, "functions.Bash:0", ARG_BEGIN, '{"command": "ls"}', CALL_END, SECTION_END]
MINIMAX = '<minimax:tool_call>\n<invoke name="Bash">\n<parameter name="command">ls</parameter>\n</invoke>\n</minimax:tool_call>'
HERMES = '<tool_call>{"name": "Bash", "arguments": {"command": "ls"}}</tool_call>'


def rewrite(model: str, body: bytes, pieces: list[bytes] | None = None, tools=(BASH_TOOL,), **request) -> tuple[bytes, MessagesStreamRewriter]:
    rewriter = MessagesStreamRewriter(RequestContext.from_request({"model": model, "tools": list(tools), **request}))
    out = b"".join(b"".join(rewriter.feed(piece)) for piece in (pieces if pieces is not None else [body]))
    return out + b"".join(rewriter.close()), rewriter


def without_ids(result: dict) -> dict:
    """Minted ids are random: compared as one placeholder."""
    minted = lambda block: block.get("type") == "tool_use" and str(block.get("id", "")).startswith("toolu_")  # noqa: E731
    return {**result, "content": [{**b, "id": "ID"} if minted(b) else b for b in result["content"]]}


CASES = {
    "kimi in thinking": ("kimi-k2", stream("kimi-k2", block_events(0, "thinking", ["Look ", "first.", *KIMI]))),
    "minimax in text": ("MiniMax-M2", stream("MiniMax-M2", block_events(0, "text", ["Before. ", MINIMAX[:30], MINIMAX[30:], " After."]))),
    "hermes in text after thinking": ("qwen3", stream("qwen3", block_events(0, "thinking", ["Plan."], signature="c2ln"), block_events(1, "text", [HERMES[:17], HERMES[17:]]))),
    "think tags in text": ("MiniMax-M2", stream("MiniMax-M2", block_events(0, "text", ["<think>", "Plan.", "</think>", "Hi"]))),
}


@pytest.mark.parametrize("name", CASES)
def test_every_one_piece_split_gives_the_same_blocks(name):
    model, body = CASES[name]
    whole, _ = rewrite(model, body)
    expected = without_ids(check_messages_stream(whole))
    assert any(b["type"] == "tool_use" for b in expected["content"]) or name == "think tags in text"
    for cut in range(1, len(body)):
        out, _ = rewrite(model, body, [body[:cut], body[cut:]])
        assert without_ids(check_messages_stream(out)) == expected, f"cut at {cut}"


@settings(deadline=None)
@given(st.sampled_from(sorted(CASES)), st.lists(st.integers(1, 2000), max_size=12))
def test_random_splits_give_the_same_blocks(name, cuts):
    model, body = CASES[name]
    points = sorted({c % len(body) for c in cuts} - {0})
    pieces = [body[a:b] for a, b in zip([0, *points], [*points, len(body)])]
    expected = without_ids(check_messages_stream(rewrite(model, body)[0]))
    assert without_ids(check_messages_stream(rewrite(model, body, pieces)[0])) == expected


def test_blocks_and_ids_as_the_wire_wants_them():
    out, rewriter = rewrite("kimi-k2", CASES["kimi in thinking"][1])
    result = check_messages_stream(out)
    assert result["content"] == [
        {"type": "thinking", "thinking": "Look first.", "signature": ""},
        {"type": "tool_use", "id": "functions.Bash:0", "name": "Bash", "input": {"command": "ls"}},
    ]
    assert result["stop_reason"] == "tool_use" and rewriter.stats.calls == 1
    out, _ = rewrite("MiniMax-M2", CASES["minimax in text"][1])
    content = check_messages_stream(out)["content"]
    assert [b["type"] for b in content] == ["text", "tool_use", "text"]
    assert content[1]["id"].startswith("toolu_") and len(content[1]["id"]) == 30
    assert content[0]["text"] + content[2]["text"] == "Before.  After." or content[0]["text"].strip() == "Before."


def test_a_signature_is_kept_and_never_invented_when_signed():
    out, _ = rewrite("qwen3", CASES["hermes in text after thinking"][1])
    content = check_messages_stream(out)["content"]
    assert content[0] == {"type": "thinking", "thinking": "Plan.", "signature": "c2ln"}


def test_the_empty_signature_can_be_turned_off():
    rewriter = MessagesStreamRewriter(RequestContext.from_request({"model": "kimi-k2", "tools": [BASH_TOOL]}), sign_thinking=False)
    out = b"".join(rewriter.feed(CASES["kimi in thinking"][1]) + rewriter.close())
    assert b"signature_delta" not in out


def test_untouched_streams_and_events_leave_as_their_bytes():
    body = stream("qwen3", block_events(0, "thinking", ["Hmm, <b>bold</b>."], signature="x"), block_events(1, "text", ["a < b", " and 2 > 1"]))
    out, rewriter = rewrite("qwen3", body)
    assert out == body and not rewriter.changed


def test_undeclared_and_tool_choice_none_stay_text_exactly():
    body = stream("MiniMax-M2", block_events(0, "text", [MINIMAX]))
    for tools, request in (([], {}), ([BASH_TOOL], {"tool_choice": {"type": "none"}})):
        out, _ = rewrite("MiniMax-M2", body, tools=tools, **request)
        assert check_messages_stream(out)["content"] == [{"type": "text", "text": MINIMAX}]


def test_disable_parallel_tool_use_makes_only_the_first_call():
    body = stream("qwen3", block_events(0, "text", [HERMES, HERMES]))
    out, _ = rewrite("qwen3", body, tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    content = check_messages_stream(out)["content"]
    assert [b["type"] for b in content] == ["tool_use", "text"] and content[1]["text"] == HERMES


def test_native_tool_use_repairs():
    """Split blocks for one id, input at the start and in deltas, empty pieces, a piece that
    would break the JSON, a block never closed, stop_reason end_turn."""
    events = [
        message_start("m"),
        *tool_use_events(0, "toolu_A", "Bash", ['{"comm', ""], start_input={"command": "l"}),
        *tool_use_events(1, "toolu_A", "Bash", ['and": "ls"', "}"]),
        {"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_B", "name": "Bash", "input": {"command": "pwd"}}},
        {"type": "content_block_stop", "index": 2},
        {"type": "content_block_start", "index": 3, "content_block": {"type": "tool_use", "id": "toolu_C", "name": "Bash", "input": {}}},
        {"type": "content_block_delta", "index": 3, "delta": {"type": "input_json_delta", "partial_json": '{"command": "x"'}},
        {"type": "content_block_delta", "index": 3, "delta": {"type": "input_json_delta", "partial_json": '}}garbage'}},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 5}},
        {"type": "message_stop"},
    ]
    out, rewriter = rewrite("qwen3", sse(events), parallel_tool_calls=True)
    result = check_messages_stream(out)
    assert [(b["id"], b["input"]) for b in result["content"]] == [("toolu_A", {"command": "ls"}), ("toolu_B", {"command": "pwd"}), ("toolu_C", {"command": "x"})]
    assert result["stop_reason"] == "tool_use"
    assert set(rewriter.stats.stream_repairs) == {"split_tool_use_blocks", "input_at_start", "empty_partial_json", "invalid_partial_json", "unclosed_block", "stop_reason"}


def test_a_cut_off_stream_closes_the_call_it_was_in():
    body = sse([message_start("kimi-k2"), *block_events(0, "thinking", ["Go.", SECTION_BEGIN, CALL_BEGIN, "functions.Bash:0", ARG_BEGIN, '{"command": "l'])[:-1]])
    out, _ = rewrite("kimi-k2", body)
    blocks = check_messages_stream(out)["content"]
    assert [b["type"] for b in blocks] == ["thinking", "tool_use"] and blocks[1]["name"] == "Bash"


def test_unreadable_events_pass_as_they_came():
    body = b"event: weird\ndata: not json\n\n" + b"data: [1, 2]\n\n" + stream("qwen3", block_events(0, "text", ["hi"]))
    out, rewriter = rewrite("qwen3", body)
    assert out == body and rewriter.failure is None


def test_non_streaming_bodies_get_the_same_blocks():
    body = message_body("kimi-k2", [{"type": "thinking", "thinking": "Look first." + "".join(KIMI), "signature": ""}, {"type": "text", "text": "Done."}])
    assert rewrite_messages_body(body, RequestContext.from_request({"model": "kimi-k2", "tools": [BASH_TOOL]})) is not None
    assert body["content"] == [
        {"type": "thinking", "thinking": "Look first.", "signature": ""},
        {"type": "tool_use", "id": "functions.Bash:0", "name": "Bash", "input": {"command": "ls"}},
        {"type": "text", "text": "Done."},
    ]
    assert body["stop_reason"] == "tool_use"
    plain = message_body("kimi-k2", [{"type": "text", "text": "Hi."}])
    assert rewrite_messages_body(plain, RequestContext.from_request({"model": "kimi-k2"})) is None


@pytest.mark.parametrize(
    ("pieces", "ok"),
    [
        (['{"a": [1, 2.5e3, true, null, "x\\u00e9"]}'], [True]),
        (['{"a"', ": 1", "}"], [True, True, True]),
        (["{", "}", "x"], [True, True, False]),
        (['{"a": tru', "e}"], [True, True]),
        (['{"a": tx'], [False]),
        (['{"a": 1}}'], [False]),
        (['{"a" 1'], [False]),
        (['["\\q"]'], [False]),
    ],
)
def test_json_prefix(pieces, ok):
    prefix = JsonPrefix()
    assert [prefix.feed(p) for p in pieces] == ok


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(), lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=10), st.data())
def test_json_prefix_accepts_every_split_of_valid_json(value, data):
    text = json.dumps(value, ensure_ascii=False)
    prefix = JsonPrefix()
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=5)))
    for a, b in zip([0, *cuts], [*cuts, len(text)]):
        assert prefix.feed(text[a:b])
    assert prefix.complete or not isinstance(value, (dict, list))


# -- fuzzing -------------------------------------------------------------------------------------

FRAGMENTS = [*KIMI, MINIMAX, MINIMAX[:25], HERMES, HERMES[:12], "<think>", "</think>", "<", "|", "{", '"', "\n", " ", "é", "Prose. ", "a < b", "[TOOL_CALLS]"]


@st.composite
def hostile_messages(draw):
    """A message of 1-3 text/thinking blocks and maybe a native tool_use, their text drawn from
    markup fragments and prose, and raw junk events between them."""
    blocks, index = [], 0
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["text", "thinking"]))
        pieces = draw(st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=4), min_size=1, max_size=12))
        blocks.append(block_events(index, kind, pieces, signature=draw(st.sampled_from([None, "s"])) if kind == "thinking" else None))
        index += 1
    if draw(st.booleans()):
        blocks.append(tool_use_events(index, "toolu_N", "Bash", draw(st.lists(st.sampled_from(['{"command"', ': "x"', "}", "", "}}"]), max_size=4))))
    body = stream(draw(st.sampled_from(["kimi-k2", "MiniMax-M2", "qwen3", "some-model"])), *blocks)
    junk = draw(st.sampled_from([b"", b": keep-alive\n\n", b"data: {oops\n\n", b"event: ping\ndata: {\"type\":\"ping\"}\n\n"]))
    cut = body.index(b"event: content_block_start")
    return body[:cut] + junk + body[cut:]


@settings(deadline=None)  # the first example imports the SDK's accumulator
@given(hostile_messages(), st.lists(st.integers(1, 5000), max_size=10), st.sampled_from(["kimi-k2", "MiniMax-M2", "qwen3", "llama-3"]))
def test_fuzz_messages_rewriter(body, cuts, model):
    """No exception; the same result however the body is cut; the wire rules hold (checked by
    our wire check and the SDK's accumulator); events unread pass as they came."""
    whole, rewriter = rewrite(model, body)
    assert rewriter.failure is None, rewriter.failure
    expected = without_ids(check_messages_stream(whole))
    points = sorted({c % len(body) for c in cuts} - {0})
    pieces = [body[a:b] for a, b in zip([0, *points], [*points, len(body)])]
    again, _ = rewrite(model, body, pieces)
    assert without_ids(check_messages_stream(again)) == expected
    assert (b"data: {oops\n\n" in body) is (b"data: {oops\n\n" in whole)


def test_native_tool_use_values_are_typed_by_the_schema():
    """Upstream's own tool_use with stringified values the schema types otherwise, and null."""
    tool = {"name": "search", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}, "limit": {"type": "integer"}}}}
    body = sse([
        message_start("m"),
        *tool_use_events(0, "toolu_A", "search", ['{"q": "5", "li', 'mit": "', '5"}']),
        *tool_use_events(1, "toolu_B", "search", ["nu", "ll"]),
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {"output_tokens": 5}},
        {"type": "message_stop"},
    ])
    out, rewriter = rewrite("qwen3", body, tools=[tool])
    result = check_messages_stream(out)
    assert [b["input"] for b in result["content"]] == [{"q": "5", "limit": 5}, {}]
    assert rewriter.stats.stream_repairs["typed_value"] == 1 and rewriter.stats.stream_repairs["empty_arguments"] == 1
