"""Upstream's own tool-call deltas, normalised (addon/toolshim/native.py): one test per broken
shape real servers send, the well-formed stream untouched, then a property over random splits
and breakages. Every normalised stream is checked against the clients' wire rules."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import chat_chunk, sse_body
from toolshim.native import (
    DOUBLE_ENCODED,
    MERGED,
    MISSING_INDEX,
    OBJECT_ARGUMENTS,
    REPEATED_HEAD,
    REUSED_INDEX,
    SNAPSHOT,
    NativeCalls,
)
from wire import check_chat_stream

MODEL = "m"
Chunks = list[list[dict[str, Any]]]


def normalise(chunks: Chunks, first_index: int = 0) -> tuple[NativeCalls, Chunks, list[bool]]:
    """Feed each chunk's entries; the non-empty outputs, and `changed` after each feed."""
    counter = itertools.count(first_index)
    calls = NativeCalls(lambda: next(counter))
    out: Chunks = []
    changed: list[bool] = []
    for entries in chunks:
        out.append(calls.feed(entries))
        changed.append(calls.changed)
    out.append(calls.finish())
    return calls, [c for c in out if c], changed


def accumulate(chunks: Chunks, before: Chunks = ()) -> list[dict[str, Any]]:
    """The calls a client accumulates from these entries, after checking the wire rules."""
    body = sse_body(
        [
            chat_chunk(MODEL, role="assistant", content=""),
            *(chat_chunk(MODEL, tool_calls=entries) for entries in [*before, *chunks]),
            chat_chunk(MODEL, finish_reason="tool_calls"),
        ]
    )
    return check_chat_stream(body)["tool_calls"]


def repaired(chunks: Chunks) -> list[dict[str, Any]]:
    return accumulate(normalise(chunks)[1])


def head(index: int | None, call_id: str | None, name: str | None, arguments: Any = "") -> dict[str, Any]:
    entry: dict[str, Any] = {}
    if index is not None:
        entry["index"] = index
    if call_id is not None:
        entry |= {"id": call_id, "type": "function"}
    entry["function"] = {"arguments": arguments} if name is None else {"name": name, "arguments": arguments}
    return entry


def cont(index: int | None, arguments: Any) -> dict[str, Any]:
    return head(index, None, None, arguments)


WEATHER = {"id": "call_a", "name": "get_weather", "arguments": '{"city": "Paris"}'}
TIME = {"id": "call_b", "name": "get_time", "arguments": '{"tz":"CET"}'}

# research/wire.md 1.4, the canonical stream
WELL_FORMED: Chunks = [
    [head(0, "call_a", "get_weather")],
    [cont(0, '{"city": ')],
    [cont(0, '"Paris"}')],
    [head(1, "call_b", "get_time", '{"tz":"CET"}')],
]


# -- well-formed --------------------------------------------------------------------------------


def test_well_formed_stream_passes_entry_for_entry():
    calls, out, changed = normalise(WELL_FORMED)
    assert out == WELL_FORMED
    assert changed == [False] * len(WELL_FORMED)
    assert calls.emitted == 2 and calls.idle and not calls.repairs
    assert accumulate(out) == [WEATHER, TIME]


def test_well_formed_edge_entries_pass_too():
    """An empty continuation, two calls in one chunk, extra keys: all kept as they are."""
    chunks = [
        [head(0, "call_a", "get_weather", '{"city": "Paris"}'), head(1, "call_b", "get_time")],
        [cont(1, "")],
        [{"index": 1, "function": {"arguments": '{"tz":"CET"}'}, "x_vendor": 1}],
    ]
    _, out, changed = normalise(chunks)
    assert out == chunks and not any(changed)
    assert accumulate(out) == [WEATHER, TIME]


def test_indices_follow_the_shared_allocator():
    """Calls found in markup came first: upstream's own calls take the next indices."""
    markup = [[head(0, "call_m", "bash", "{}")]]
    calls, out, changed = normalise(WELL_FORMED, first_index=1)
    assert [[{k: v for k, v in e.items() if k != "index"} for e in c] for c in out] == [
        [{k: v for k, v in e.items() if k != "index"} for e in c] for c in WELL_FORMED
    ]
    assert all(changed)  # the index moved: chat.py must re-serialise
    assert accumulate(out, before=markup)[1:] == [WEATHER, TIME]
    assert calls.emitted == 2


# -- missing or reused index --------------------------------------------------------------------


def test_missing_index_everywhere():
    chunks = [[{k: v for k, v in e.items() if k != "index"} for e in c] for c in WELL_FORMED]
    calls, out, _ = normalise(chunks)
    assert out == WELL_FORMED
    assert calls.repairs[MISSING_INDEX] == 4


def test_missing_index_on_continuations_only():
    chunks = [
        [head(0, "call_a", "get_weather")],
        [cont(None, '{"city": ')],
        [cont(None, '"Paris"}')],
        [head(1, "call_b", "get_time")],
        [cont(None, '{"tz":"CET"}')],
    ]
    assert repaired(chunks) == [WEATHER, TIME]


def test_missing_index_and_ids_a_new_name_starts_a_call():
    chunks = [
        [head(None, None, "get_weather", '{"city": ')],
        [cont(None, '"Paris"}')],
        [head(None, None, "get_time", '{"tz":"CET"}')],
    ]
    calls = repaired(chunks)
    assert [(c["name"], c["arguments"]) for c in calls] == [
        ("get_weather", WEATHER["arguments"]),
        ("get_time", TIME["arguments"]),
    ]
    assert all(c["id"].startswith("call_") for c in calls) and calls[0]["id"] != calls[1]["id"]


def test_every_call_at_index_zero_with_its_own_id():
    """Ollama: each call is index 0; the clients would join them into one call."""
    chunks = [
        [head(0, "call_a", "get_weather", '{"city": "Paris"}')],
        [head(0, "call_b", "get_time", '{"tz":')],
        [cont(0, '"CET"}')],
        [head(0, "call_c", "get_time", '{"tz":"UTC"}')],
    ]
    calls, out, _ = normalise(chunks)
    assert [e["index"] for c in out for e in c] == [0, 1, 1, 2]
    assert accumulate(out) == [WEATHER, TIME, {"id": "call_c", "name": "get_time", "arguments": '{"tz":"UTC"}'}]
    assert calls.repairs[REUSED_INDEX] == 2


def test_reused_index_same_tool_without_ids():
    """Same name, no id: a new call once the previous arguments are a complete object."""
    chunks = [
        [head(0, None, "get_time", '{"tz":')],
        [head(0, None, "get_time", '"CET"}')],  # name repeated: still the first call
        [head(0, None, "get_time", '{"tz":"UTC"}')],  # complete before: a second call
    ]
    calls = repaired(chunks)
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_time", '{"tz":"CET"}'), ("get_time", '{"tz":"UTC"}')]


def test_fresh_id_per_delta_stays_one_call():
    """A server minting an id per delta: while the arguments are unfinished it is one call."""
    chunks = [
        [head(0, "call_1", "get_time", '{"tz":')],
        [{"index": 0, "id": "call_2", "function": {"arguments": '"CET"}'}}],
        [head(0, "call_3", "get_weather", '{"city": "Paris"}')],
    ]
    assert repaired(chunks) == [
        {"id": "call_1", "name": "get_time", "arguments": '{"tz":"CET"}'},
        {"id": "call_3", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    ]


def test_indices_starting_at_one():
    chunks = [[{**e, "index": e["index"] + 1} for e in c] for c in WELL_FORMED]
    _, out, _ = normalise(chunks)
    assert out == WELL_FORMED


# -- repeated head ------------------------------------------------------------------------------


def test_id_type_and_name_repeated_on_every_delta():
    chunks = [
        [head(0, "call_a", "get_weather", '{"city": ')],
        [head(0, "call_a", "get_weather", '"Paris"}')],
        [head(1, "call_b", "get_time", '{"tz":')],
        [head(1, "call_b", "get_time", '"CET"}')],
    ]
    calls, out, changed = normalise(chunks)
    assert out[1] == [cont(0, '"Paris"}')] and out[3] == [cont(1, '"CET"}')]
    assert changed == [False, True, False, True]
    assert accumulate(out) == [WEATHER, TIME]
    assert calls.repairs[REPEATED_HEAD] == 2


def test_null_and_empty_head_fields_on_continuations_are_dropped():
    chunks = [
        [head(0, "call_a", "get_weather")],
        [{"index": 0, "id": "", "type": None, "function": {"name": None, "arguments": '{"city": '}}],
        [{"index": 0, "id": None, "function": {"name": "", "arguments": '"Paris"}'}}],
    ]
    _, out, _ = normalise(chunks)
    assert out[1:] == [[cont(0, '{"city": ')], [cont(0, '"Paris"}')]]
    assert accumulate(out) == [WEATHER]


# -- snapshots ----------------------------------------------------------------------------------


def test_full_arguments_sent_again_after_the_deltas():
    """GLM: the deltas, then the whole arguments again (with the metadata)."""
    chunks = [*WELL_FORMED[:3], [head(0, "call_a", "get_weather", '{"city": "Paris"}')], WELL_FORMED[3]]
    calls, out, _ = normalise(chunks)
    assert out == WELL_FORMED
    assert calls.repairs[SNAPSHOT] == 1


def test_snapshot_that_extends_the_deltas_sends_only_the_rest():
    chunks = [
        [head(0, "call_a", "get_weather", '{"city": ')],
        [cont(0, '"Par')],
        [cont(0, '{"city": "Paris"}')],  # the last delta was lost; the snapshot has it
    ]
    _, out, _ = normalise(chunks)
    assert out[-1] == [cont(0, 'is"}')]
    assert accumulate(out) == [WEATHER]


def test_snapshot_spelled_differently_or_as_an_object():
    base = [[head(0, "call_a", "get_weather", '{"city": "Par\\u00eds"}')]]
    for snapshot in ('{"city":"París"}', {"city": "París"}, ' {"city": "París"} '):
        _, out, _ = normalise([*base, [cont(0, snapshot)]])
        assert out == base, snapshot


def test_snapshot_in_the_same_chunk_as_the_last_delta():
    chunks = [
        [head(0, "call_a", "get_weather", '{"city": ')],
        [cont(0, '"Paris"}'), head(0, "call_a", "get_weather", '{"city": "Paris"}')],
    ]
    assert repaired(chunks) == [WEATHER]


# -- double encoding and object arguments -------------------------------------------------------


DOUBLE = json.dumps('{"cmd": "echo \\"hi\\" \\\\ é 😀\\n"}', ensure_ascii=True)


def test_double_encoded_arguments_in_one_delta():
    """Kimi-K2#26: the object text as a JSON string (`"{\\"a\\": 1}"`)."""
    calls, out, _ = normalise([[head(0, "call_a", "bash", DOUBLE)]])
    assert accumulate(out) == [{"id": "call_a", "name": "bash", "arguments": json.loads(DOUBLE)}]
    assert calls.repairs[DOUBLE_ENCODED] == 1


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11])
def test_double_encoded_arguments_cut_anywhere(size):
    """Escapes (`\\uXXXX` surrogate pairs included) cut at any point: at most 11 chars held."""
    for offset in range(size):
        cut = [DOUBLE[:offset], *[DOUBLE[offset:][i : i + size] for i in range(0, len(DOUBLE) - offset, size)]]
        chunks = [[head(0, "call_a", "bash", cut[0])], *([cont(0, p)] for p in cut[1:])]
        calls, out, _ = normalise(chunks)
        assert accumulate(out) == [{"id": "call_a", "name": "bash", "arguments": json.loads(DOUBLE)}], cut
        assert calls.idle


def test_double_encoded_then_snapshot_and_a_second_call():
    chunks = [
        [head(0, "call_a", "bash", DOUBLE[:10])],
        [cont(0, DOUBLE[10:])],
        [cont(0, DOUBLE)],
        [head(1, "call_b", "get_time", json.dumps(TIME["arguments"]))],
    ]
    assert repaired(chunks) == [{"id": "call_a", "name": "bash", "arguments": json.loads(DOUBLE)}, TIME]


def test_unfinished_escape_is_released_at_the_end():
    calls, out, _ = normalise([[head(0, "call_a", "bash", '"{\\"a\\": \\u00')]])
    assert out[-1] == [cont(0, "\\u00")]
    assert calls.idle


def test_arguments_as_an_object():
    calls, out, _ = normalise([[head(0, "call_a", "get_weather", {"city": "París"})]])
    assert accumulate(out) == [{**WEATHER, "arguments": '{"city": "París"}'}]
    assert calls.repairs[OBJECT_ARGUMENTS] == 1


# -- one entry per index per chunk --------------------------------------------------------------


def test_several_entries_for_one_call_in_one_chunk_are_merged():
    chunks = [
        [head(0, "call_a", "get_weather"), cont(0, '{"city": '), cont(0, '"Paris"}'), head(1, "call_b", "get_time")],
        [cont(1, '{"tz":'), cont(1, '"CET"}')],
    ]
    calls, out, _ = normalise(chunks)
    assert out == [
        [head(0, "call_a", "get_weather", '{"city": "Paris"}'), head(1, "call_b", "get_time")],
        [cont(1, '{"tz":"CET"}')],
    ]
    assert accumulate(out) == [WEATHER, TIME]
    assert calls.repairs[MERGED] == 3


def test_calls_interleaved_within_a_chunk_are_regrouped():
    chunks = [[head(0, "call_a", "get_weather", '{"city": '), head(1, "call_b", "get_time", '{"tz":'), cont(0, '"Paris"}')], [cont(1, '"CET"}')]]
    assert repaired(chunks) == [WEATHER, TIME]


# -- missing head fields, empty entries ---------------------------------------------------------


def test_missing_id_is_minted_and_type_added():
    chunks = [[{"index": 0, "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]]
    counter = itertools.count()
    calls = NativeCalls(lambda: next(counter), mint_id=lambda: "call_minted")
    out = calls.feed(chunks[0])
    assert out == [head(0, "call_minted", "get_weather", '{"city": "Paris"}')] and calls.changed
    assert accumulate([out]) == [{**WEATHER, "id": "call_minted"}]


def test_entries_that_carry_nothing_are_dropped():
    """vLLM #54701: deltas with neither name nor arguments; no `function` at all (2d4)."""
    chunks = [
        [{"index": 0}],
        [{"index": 0, "function": {}}],
        [head(0, "call_a", "get_weather")],
        [{"index": 0}, {"index": 0, "function": None}, {"index": 0, "function": {"arguments": None}}],
        [cont(0, '{"city": "Paris"}')],
        ["not a dict"],
    ]
    calls, out, _ = normalise(chunks)
    assert out == [[head(0, "call_a", "get_weather")], [cont(0, '{"city": "Paris"}')]]
    assert calls.emitted == 1


def test_a_late_name_is_passed_on():
    """The first entry lacked a name: the SDKs accept it later, which beats no name."""
    calls, out, _ = normalise([[head(0, "call_a", None)], [head(0, None, "get_weather", "{}")]])
    assert out == [[head(0, "call_a", None)], [{"index": 0, "function": {"name": "get_weather", "arguments": "{}"}}]]


def test_emitted_counts_calls():
    calls = NativeCalls(lambda: 0)
    assert calls.emitted == 0 and calls.feed([]) == [] and not calls.changed
    calls.feed([head(0, "call_a", "get_weather")])
    assert calls.emitted == 1


# -- property -----------------------------------------------------------------------------------

# Top-level and nested keys differ: a nested object never starts with the top-level prefix, so
# a continuation delta can never look like a snapshot of what came before (see native.py).
_TEXT = st.text(alphabet='ab é😀"\\\n{}', max_size=6)
_LEAF = st.none() | st.booleans() | st.integers(-5, 5) | _TEXT
_NESTED = st.recursive(_LEAF, lambda c: st.lists(c, max_size=2) | st.dictionaries(st.sampled_from("xyz"), c, max_size=2), max_leaves=4)
_ARGS = st.dictionaries(st.sampled_from(["a", "b", "path"]), _NESTED, max_size=3)


def _split(text: str, fractions: list[float]) -> list[str]:
    cuts = sorted({int(f * len(text)) for f in fractions})
    bounds = [0, *(c for c in cuts if 0 < c < len(text)), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])] or [""]


@st.composite
def call_streams(draw) -> tuple[list[dict[str, Any]], Chunks, Chunks]:
    """(expected calls, well-formed chunks, broken chunks)."""
    reuse_index = draw(st.booleans())
    calls: list[dict[str, Any]] = []
    good: list[dict[str, Any]] = []  # entries, grouped into chunks below
    bad: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 4))):
        args = draw(_ARGS)
        form = draw(st.sampled_from(["plain", "double", "object"]))
        text = json.dumps(args, ensure_ascii=form != "object" and draw(st.booleans()))
        call_id, name = f"call_{i}{draw(st.text('xyz', max_size=2))}", draw(st.sampled_from(["bash", "read", "get_time"]))
        fractions = draw(st.lists(st.floats(0, 1), max_size=6))
        good += [head(i, call_id, name, p) if n == 0 else cont(i, p) for n, p in enumerate(_split(text, fractions))]

        sent: Any = args if form == "object" else text
        if form == "double":
            sent = json.dumps(text, ensure_ascii=draw(st.booleans()))
        pieces = [sent] if form == "object" else _split(sent, draw(st.lists(st.floats(0, 1), max_size=6)))
        calls.append({"id": call_id, "name": name, "arguments": text})
        index = 0 if reuse_index else i
        for n, piece in enumerate(pieces):
            repeat = n == 0 or draw(st.booleans())
            entry = head(index, call_id if repeat else None, name if n == 0 or draw(st.booleans()) else None, piece)
            if draw(st.booleans()):
                del entry["index"]
            bad.append(entry)
        if draw(st.booleans()):  # the whole arguments again
            snapshot = head(index, call_id if draw(st.booleans()) else None, name if draw(st.booleans()) else None, sent)
            if draw(st.booleans()):
                del snapshot["index"]
            bad.append(snapshot)

    def chunked(entries: list[dict[str, Any]], may_share_index: bool) -> Chunks:
        chunks: Chunks = []
        for entry in entries:
            same = chunks and any(e.get("index") == entry.get("index") for e in chunks[-1])
            if chunks and (may_share_index or not same) and draw(st.booleans()):
                chunks[-1].append(entry)
            else:
                chunks.append([entry])
        return chunks

    return calls, chunked(good, False), chunked(bad, True)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(call_streams())
def test_broken_streams_normalise_to_the_well_formed_calls(case):
    expected, good, bad = case
    normalised, out, changed = normalise(good)
    assert out == good and not any(changed) and normalised.idle
    assert accumulate(good) == expected
    assert repaired(bad) == expected
