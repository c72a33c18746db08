"""The request repairs and the conversation state, sans-IO (history.py, memory.py, backends.py)."""

from __future__ import annotations

import copy
import json
import re

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from toolshim.addon import CHAT_TERMINAL, MESSAGES_TERMINAL, StreamRewrite
from toolshim.apis import CHAT, MESSAGES, RESPONSES
from toolshim.backends import REPAIRS, RepairPolicy, backend_for
from toolshim.chat import ChatStreamRewriter
from toolshim.encoding import incremental_decoder
from toolshim.history import KIMI_ID, HistoryRepair
from toolshim.memory import KeyMaker, LocalStore, _noted_stretches, turns_given, turns_given_pieces
from toolshim.messages import MessagesStreamRewriter

from harness import sse_body
from kimi import chunk
from test_core_messages import hostile_messages
from test_fuzz import budget, by_event, chat_case, split_at
from toolshim.tools import RequestContext

ALL = frozenset(REPAIRS)
KEYS = KeyMaker(b"cred", "Go.")


def repaired(request, api=CHAT, repairs=ALL, model="kimi-k2", found=None, placeholder=""):
    repair = HistoryRepair(request, api, repairs, backend_for(model), KEYS)
    repair.apply(found or {}, placeholder)
    return repair


def call(call_id, name="bash", arguments="{}"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# -- the backend table and the option ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "family", "wanted"),
    [
        ("moonshotai/Kimi-K2-Thinking", "kimi", {"reasoning", "kimi_ids", "orphan_results", "tool_content"}),
        ("deepseek-reasoner", "deepseek", {"reasoning", "orphan_results"}),
        ("zai-org/GLM-4.6", "glm", {"reasoning", "developer_role"}),
        ("MiniMax-M2", "minimax", {"reasoning"}),
        ("Qwen/Qwen3-Coder-480B", "qwen", {"developer_role", "tool_content"}),
        ("openai/gpt-oss-120b", "gpt-oss", {"tool_content"}),
        ("llama-3.3-70b", "", set()),
    ],
)
def test_the_backend_table_picks_by_model_name(model, family, wanted):
    backend = backend_for(model)
    assert backend.family == family
    assert RepairPolicy.parse("auto").repairs_for(backend) == wanted


def test_the_option_adds_removes_and_turns_off():
    kimi = backend_for("kimi-k2")
    assert RepairPolicy.parse("off").repairs_for(kimi) == frozenset()
    assert RepairPolicy.parse("auto,-kimi_ids").repairs_for(kimi) == {"reasoning", "orphan_results", "tool_content"}
    assert RepairPolicy.parse("off,strip_strict").repairs_for(kimi) == {"strip_strict"}
    assert RepairPolicy.parse("").repairs_for(kimi) == kimi.repairs
    assert RepairPolicy.parse("strip_parallel_tool_calls").repairs_for(backend_for("llama")) == {"strip_parallel_tool_calls"}
    with pytest.raises(ValueError, match="unknown term 'reasonings'"):
        RepairPolicy.parse("reasonings")


# -- reasoning round trip -------------------------------------------------------------------------


def remembered(api, body, keys=KEYS, all_turns=False) -> LocalStore:
    store = LocalStore(100, 1 << 20, 3600)
    for turn in turns_given(api, body):
        store.put_many(turn.records(keys, all_turns))
    return store


def test_what_the_client_was_sent_comes_back_under_each_of_its_calls():
    body = sse_body([
        chunk("k", {"role": "assistant", "reasoning_content": "Two ", "reasoning": "Two "}),
        chunk("k", {"reasoning_content": "files.", "reasoning": "files."}),
        chunk("k", {"tool_calls": [{"index": 0, "id": "functions.ls:0", "type": "function", "function": {"name": "ls", "arguments": '{"a":'}}]}),
        chunk("k", {"tool_calls": [{"index": 0, "function": {"arguments": " 1}"}}]}),
        chunk("k", {"tool_calls": [{"index": 1, "id": "functions.cat:1", "type": "function", "function": {"name": "cat", "arguments": "{}"}}]}, "tool_calls"),
    ])
    store = remembered(CHAT, body)
    # The client re-serialised the arguments and kept only the second call's turn order.
    request = {"messages": [{"role": "user", "content": "Go."}, {"role": "assistant", "content": None, "tool_calls": [call("functions.ls:0", "ls", '{ "a" : 1 }'), call("functions.cat:1", "cat")]}]}
    repair = HistoryRepair(request, CHAT, frozenset({"reasoning"}), backend_for("kimi"), KEYS)
    repair.apply(store.get_many(repair.wanted_keys()))
    assert request["messages"][1]["reasoning_content"] == "Two files."
    assert request["messages"][1]["reasoning"] == "Two files."
    assert repair.changes == [{"repair": "reasoning", "at": "messages[1]"}] and repair.misses == []


def test_turns_are_read_the_same_whatever_the_line_ends():
    from anthropic_stream import block_events, sse, tool_use_events

    steady = [chunk("k", {"reasoning_content": piece, "reasoning": piece}) for piece in ("Two ", "fi", "les", ".")]
    chat = sse_body([*steady, chunk("k", {"tool_calls": [{"index": 0, "id": "functions.ls:0", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}, "tool_calls")])
    messages = sse([*block_events(0, "thinking", ["Run ", "it."], signature="sig"), *tool_use_events(1, "toolu_1", "Bash", ['{"command":', ' "ls"}'])])
    for api, body in ((CHAT, chat), (MESSAGES, messages)):
        assert b"\r" not in body
        [turn] = turns_given(api, body)
        assert turn.reasoning and turn.calls
        for end in (b"\r\n", b"\r"):
            assert turns_given(api, body.replace(b"\n", end)) == [turn]


def test_other_conversations_and_credentials_do_not_match():
    body = orjson.dumps({"choices": [{"message": {"reasoning_content": "secret", "tool_calls": [call("functions.ls:0")]}}]})
    store = remembered(CHAT, body)
    for keys in (KeyMaker(b"cred", "Another first message."), KeyMaker(b"other", "Go."), KeyMaker(b"", "Go.")):
        request = {"messages": [{"role": "assistant", "tool_calls": [call("functions.ls:0")]}]}
        repair = HistoryRepair(request, CHAT, frozenset({"reasoning"}), backend_for("kimi"), keys)
        repair.apply(store.get_many(repair.wanted_keys()))
        assert "reasoning_content" not in request["messages"][0] and repair.misses == ["messages[0]"]


def test_a_miss_leaves_the_turn_as_it_is_unless_a_placeholder_is_asked_for():
    request = {"messages": [{"role": "assistant", "tool_calls": [call("functions.ls:0")]}]}
    repair = repaired(copy.deepcopy(request), repairs=frozenset({"reasoning"}))
    assert repair.changes == [] and repair.misses == ["messages[0]"] and repair.request == request
    repair = repaired(request, repairs=frozenset({"reasoning"}), placeholder="(reasoning not kept)")
    assert request["messages"][0]["reasoning_content"] == "(reasoning not kept)"
    assert repair.changes == [{"repair": "reasoning", "at": "messages[0]", "placeholder": True}]


def test_turns_that_kept_their_reasoning_or_made_no_call_are_not_looked_up():
    request = {"messages": [
        {"role": "assistant", "reasoning_content": "kept", "tool_calls": [call("functions.a:0")]},
        {"role": "assistant", "content": "An answer."},
    ]}
    assert HistoryRepair(request, CHAT, frozenset({"reasoning"}), backend_for("kimi"), KEYS).wanted_keys() == []
    # DeepSeek wants answers back too.
    assert len(HistoryRepair(request, CHAT, frozenset({"reasoning"}), backend_for("deepseek"), KEYS).wanted_keys()) == 1


def test_only_reasoning_fields_come_back_and_a_call_without_a_function_object_is_looked_up():
    request = {"messages": [
        {"role": "assistant", "tool_calls": [{"id": "functions.ls:0", "type": "function", "function": "ls"}]},
        {"role": "assistant", "tool_calls": [call("functions.cat:1", "cat")]},
    ]}
    repair = HistoryRepair(request, CHAT, frozenset({"reasoning"}), backend_for("kimi"), KEYS)
    first, second = KEYS.call("functions.ls:0", None, None), KEYS.call("functions.cat:1", "cat", "{}")
    assert repair.wanted_keys() == [first, second]
    # A record holding more than reasoning (a shared store written by another version) gives
    # back only the reasoning fields.
    repair.apply({first: {"reasoning_content": "ls.", "content": "not this"}, second: {"reasoning": "cat.", "role": "user"}})
    assert request["messages"] == [
        {"role": "assistant", "tool_calls": [{"id": "functions.ls:0", "type": "function", "function": "ls"}], "reasoning_content": "ls."},
        {"role": "assistant", "tool_calls": [call("functions.cat:1", "cat")], "reasoning": "cat."},
    ]


def test_responses_reasoning_items_go_before_the_turn_that_lost_them():
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Look."}]}
    output = {"output": [reasoning, {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"}]}
    store = remembered(RESPONSES, orjson.dumps(output))
    request = {"input": [
        {"role": "user", "content": "Go."},
        {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "x"},
        {"role": "user", "content": "And?"},
    ]}
    repair = HistoryRepair(request, RESPONSES, frozenset({"reasoning"}), backend_for("kimi"), KEYS)
    repair.apply(store.get_many(repair.wanted_keys()))
    assert request["input"][1] == reasoning
    assert [i.get("type", "message") for i in request["input"]] == ["message", "reasoning", "function_call", "function_call_output", "message"]


# -- Kimi ids and hygiene -------------------------------------------------------------------------


def test_kimi_ids_results_follow_the_call_they_answer_among_duplicates():
    request = {"messages": [
        {"role": "assistant", "tool_calls": [call("dup")]},
        {"role": "tool", "tool_call_id": "dup", "content": "1"},
        {"role": "assistant", "tool_calls": [call("dup", "cat")]},
        {"role": "tool", "tool_call_id": "dup", "content": "2"},
        {"role": "tool", "tool_call_id": "never-called", "content": "3"},
    ]}
    repaired(request, repairs=frozenset({"kimi_ids"}))
    ids = [m.get("tool_call_id") or m["tool_calls"][0]["id"] for m in request["messages"]]
    assert ids == ["functions.bash:0", "functions.bash:0", "functions.cat:1", "functions.cat:1", "never-called"]


def test_kimi_ids_in_responses_items():
    request = {"input": [
        {"type": "function_call", "call_id": "call_9", "name": "ls", "arguments": "{}", "id": "fc_1"},
        {"type": "function_call", "call_id": "functions.ls:0", "name": "ls", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_9", "output": "a"},
    ]}
    repair = repaired(request, api=RESPONSES, repairs=frozenset({"kimi_ids", "orphan_results"}))
    assert [i["call_id"] for i in request["input"]] == ["functions.ls:1", "functions.ls:0", "functions.ls:1", "functions.ls:0"]
    assert request["input"][0]["id"] == "fc_1"  # the item id is not a call id
    assert request["input"][3] == {"type": "function_call_output", "call_id": "functions.ls:0", "output": "no result was returned"}
    assert {c["repair"] for c in repair.changes} == {"kimi_ids", "orphan_results"}


def test_hygiene_only_where_certain():
    request = {
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "assistant", "tool_calls": [call("functions.a:0")]},
            {"role": "tool", "tool_call_id": "functions.a:0", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
            {"role": "tool", "tool_call_id": "functions.a:0"},
        ],
        "tools": [{"type": "function", "function": {"name": "a", "strict": True}}],
        "parallel_tool_calls": True,
    }
    repair = repaired(request)
    assert request["messages"][0]["role"] == "system"
    assert request["messages"][2]["content"][0]["type"] == "image_url"  # not text: left as it is
    assert request["messages"][3]["content"] == ""
    assert "strict" not in request["tools"][0]["function"] and "parallel_tool_calls" not in request
    assert {c["repair"] for c in repair.changes} == {"developer_role", "tool_content", "strip_strict", "strip_parallel_tool_calls"}


# -- properties: never raises, a second pass changes nothing, ids well formed ---------------------

ids = st.sampled_from(["call_1", "call_2", "functions.bash:0", "functions.bash:3", "toolu_x", "", None, 7])
names = st.sampled_from(["bash", "read", "", None])
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5), lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=5)
chat_messages = st.one_of(
    st.fixed_dictionaries({"role": st.just("assistant"), "tool_calls": st.lists(st.builds(lambda i, n: {"id": i, "type": "function", "function": {"name": n, "arguments": "{}"}}, ids, names), max_size=3)}),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": ids, "content": st.one_of(st.text(max_size=5), st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image"]), "text": st.text(max_size=3)}), max_size=2), st.none())}),
    st.fixed_dictionaries({"role": st.sampled_from(["user", "developer", "system", "wizard"]), "content": st.text(max_size=5)}),
    json_values,
)
responses_items = st.one_of(
    st.builds(lambda i, n: {"type": "function_call", "call_id": i, "name": n, "arguments": "{}"}, ids, names),
    st.builds(lambda i: {"type": "function_call_output", "call_id": i, "output": "x"}, ids),
    st.fixed_dictionaries({"type": st.just("reasoning"), "summary": st.just([])}),
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "developer"]), "content": st.text(max_size=5)}),
    json_values,
)


@given(st.lists(chat_messages, max_size=8), st.sampled_from(["kimi-k2", "deepseek-v4", "qwen3"]), st.booleans())
def test_chat_repairs_never_raise_and_a_second_pass_changes_nothing(messages, model, placeholder):
    request = {"messages": messages, "tools": [{"function": {"strict": True}}], "parallel_tool_calls": False}
    repaired(request, model=model, placeholder="p" if placeholder else "")
    once = copy.deepcopy(request)
    again = repaired(request, model=model, placeholder="p" if placeholder else "")
    assert again.changes == [] and request == once
    for message in request["messages"]:
        for entry in message.get("tool_calls") or () if isinstance(message, dict) and message.get("role") == "assistant" else ():
            if isinstance(entry["id"], str) and isinstance(entry["function"]["name"], str) and entry["function"]["name"]:
                assert KIMI_ID.fullmatch(entry["id"])
    json.dumps(request)  # still plain JSON


@given(st.lists(responses_items, max_size=8), st.sampled_from(["kimi-k2", "minimax-m2", "glm-4.6"]))
def test_responses_repairs_never_raise_and_a_second_pass_changes_nothing(items, model):
    request = {"input": items}
    repaired(request, api=RESPONSES, model=model)
    once = copy.deepcopy(request)
    assert repaired(request, api=RESPONSES, model=model).changes == [] and request == once


@given(json_values)
def test_any_json_request_is_survived(request):
    repair = HistoryRepair(request if isinstance(request, dict) else {"messages": request}, CHAT, ALL, backend_for("kimi"), KEYS)
    repair.apply({})


# -- the in-process store -------------------------------------------------------------------------


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_local_store_is_bounded_by_entries_bytes_and_age():
    clock = Clock()
    store = LocalStore(max_entries=3, max_bytes=10, ttl=60, clock=clock)
    store.put_many({"a": b"1", "b": b"2", "c": b"3"})
    store.get_many(["a"])  # a is now the most recently used
    store.put_many({"d": b"4"})
    assert set(store.get_many("abcd")) == {"a", "c", "d"} and store.stats.evicted == 1
    store.put_many({"e": b"123456789"})  # 12 bytes in all: the least recently used go
    assert set(store.get_many("acde")) == {"d", "e"} and store.stats.bytes == 10
    store.put_many({"huge": b"x" * 11})  # larger than the whole store: not kept
    assert store.get_many(["huge"]) == {}
    clock.now = 61
    assert store.get_many(["d", "e"]) == {} and len(store) == 0 and store.stats.bytes == 0


# -- Anthropic Messages ---------------------------------------------------------------------------


def test_messages_thinking_blocks_come_back_before_the_tool_use():
    from anthropic_stream import block_events, sse, tool_use_events
    from toolshim.apis import MESSAGES

    body = sse([*block_events(0, "thinking", ["Run ", "it."], signature="sig"), *tool_use_events(1, "toolu_1", "Bash", ['{"command":', ' "ls"}'])])
    store = remembered(MESSAGES, body)
    request = {"messages": [
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a"}]},
    ]}
    repair = HistoryRepair(request, MESSAGES, frozenset({"reasoning"}), backend_for("deepseek"), KEYS)
    repair.apply(store.get_many(repair.wanted_keys()))
    assert request["messages"][1]["content"][0] == {"type": "thinking", "thinking": "Run it.", "signature": "sig"}
    assert request["messages"][1]["content"][1]["type"] == "tool_use"


def test_messages_kimi_ids_and_orphan_results_go_into_the_next_user_message():
    from toolshim.apis import MESSAGES

    request = {"messages": [
        {"role": "assistant", "content": [
            {"type": "text", "text": "Two."},
            {"type": "tool_use", "id": "toolu_a", "name": "Bash", "input": {}},
            {"type": "tool_use", "id": "toolu_b", "name": "Read", "input": {}},
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a", "content": "x"}, {"type": "text", "text": "and?"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_c", "name": "Bash", "input": {}}]},
    ]}
    repair = repaired(request, api=MESSAGES, repairs=frozenset({"kimi_ids", "orphan_results"}))
    assert [(c["at"], c["id"]) for c in repair.changes if c["repair"] == "kimi_ids"] == [
        ("messages[0].content[1]", "functions.Bash:0"),
        ("messages[0].content[2]", "functions.Read:1"),
        ("messages[2].content[0]", "functions.Bash:2"),
        ("messages[1].content[0].tool_use_id", "functions.Bash:0"),
    ]
    first, answer, last = request["messages"][:3]
    assert [b.get("id") for b in first["content"]] == [None, "functions.Bash:0", "functions.Read:1"]
    assert answer["content"] == [
        {"type": "tool_result", "tool_use_id": "functions.Bash:0", "content": "x"},
        {"type": "tool_result", "tool_use_id": "functions.Read:1", "content": "no result was returned"},
        {"type": "text", "text": "and?"},
    ]
    assert last["content"][0]["id"] == "functions.Bash:2"
    assert request["messages"][3] == {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "functions.Bash:2", "content": "no result was returned"}]}


def test_messages_a_tool_result_in_an_assistant_message_answers_no_call():
    from toolshim.apis import MESSAGES

    request = {"messages": [
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_a", "name": "Bash", "input": {}},
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": "misplaced"},
        ]},
        {"role": "user", "content": "and?"},
    ]}
    repaired(request, api=MESSAGES, repairs=frozenset({"orphan_results"}))
    assert request["messages"][1]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_a", "content": "no result was returned"},
        {"type": "text", "text": "and?"},
    ]


messages_blocks = st.one_of(
    st.builds(lambda i, n: {"type": "tool_use", "id": i, "name": n, "input": {}}, ids, names),
    st.builds(lambda i: {"type": "tool_result", "tool_use_id": i, "content": "x"}, ids),
    st.fixed_dictionaries({"type": st.sampled_from(["text", "thinking"]), "text": st.text(max_size=3)}),
    json_values,
)
messages_messages = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": st.one_of(st.lists(messages_blocks, max_size=4), st.text(max_size=4))}),
    json_values,
)


@given(st.lists(messages_messages, max_size=6), st.sampled_from(["kimi-k2", "deepseek-v4"]), st.booleans())
def test_messages_repairs_never_raise_and_a_second_pass_changes_nothing(messages, model, placeholder):
    from toolshim.apis import MESSAGES

    request = {"messages": messages}
    repaired(request, api=MESSAGES, model=model, placeholder="p" if placeholder else "")
    once = copy.deepcopy(request)
    assert repaired(request, api=MESSAGES, model=model, placeholder="p" if placeholder else "").changes == [] and request == once


def test_a_stream_is_accumulated_as_the_sdks_do_it():
    """Chat: texts, call pieces and OpenRouter's `reasoning_details` pieces (same index and type)
    are concatenated; a detail's own list stays a list. Messages: a block's deltas are
    concatenated; a block started again at an index starts over."""
    body = sse_body([
        chunk("k", {"reasoning_content": "Two ", "reasoning_details": [{"type": "reasoning.text", "index": 0, "text": "Two ", "format": "x", "tags": ["a"]}]}),
        chunk("k", {"reasoning_content": "files.", "reasoning_details": [{"type": "reasoning.text", "index": 0, "text": "files.", "format": "y"}]}),
        chunk("k", {"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "ls", "arguments": '{"a":'}}]}),
        chunk("k", {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}], "content": "ok"}),
    ])
    [turn] = turns_given(CHAT, body)
    assert turn.reasoning == {
        "reasoning_content": "Two files.",
        "reasoning_details": [{"type": "reasoning.text", "index": 0, "text": "Two files.", "format": "x", "tags": ["a"]}],
    }
    assert turn.calls == [("call_1", "ls", '{"a":1}')]
    assert turn.text == "ok"

    def event(data: dict) -> bytes:
        return b"event: " + data["type"].encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    thinking = {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}
    body = b"".join([
        event(thinking),
        event({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "lost"}}),
        event(thinking),  # started again: what came before is not this block's
        *(event({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": piece}}) for piece in ("Two ", "files.")),
        event({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}}),
        event({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {}}}),
        *(event({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": piece}}) for piece in ('{"a"', ":1}")),
    ])
    [turn] = turns_given(MESSAGES, body)
    assert turn.reasoning == {"blocks": [{"type": "thinking", "thinking": "Two files.", "signature": "sig"}]}
    assert turn.calls == [("toolu_1", "ls", {"a": 1})]


# -- remembering from the bytes of steady deltas (memory.SteadyDeltas) ----------------------------

PIECE = st.text(alphabet=st.sampled_from(['a', ' ', '"', '\\', 'é', '\x01', '\n', '<', '}', ',', ':']), max_size=5)


@st.composite
def chat_streams(draw):
    """Chat streams of token deltas in the shapes SteadyDeltas reads from bytes (one field,
    mirrored fields, a call's arguments) and some it must not (two fields that differ, mirrored
    ones whose second string is another of the same length, call ids, two choices, no index),
    with events whose string was replaced by raw bytes (a quote unescaped, a cut escape: another
    JSON, or none)."""
    lines = []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["content", "reasoning_content", "mirrored", "unlike", "two", "args", "call", "choices", "raw"]))
        piece = draw(PIECE)
        if kind in ("content", "reasoning_content"):
            delta = {kind: piece}
        elif kind == "mirrored":
            delta = {"reasoning": piece, "reasoning_content": piece}
        elif kind == "unlike":  # the mirrored frame's length, not its second string
            delta = {"reasoning": piece, "reasoning_content": piece[::-1]}
        elif kind == "two":
            delta = {"content": piece, "reasoning_content": piece + "x"}
        elif kind in ("args", "call"):
            entry = {"index": draw(st.integers(0, 1)), "function": {"arguments": piece}}
            if kind == "call":
                entry |= {"id": "call_" + piece, "type": "function"}
                entry["function"]["name"] = "bash"
            delta = {"tool_calls": [entry]}
        if kind == "choices":
            data = {"id": "c", "choices": [{"index": 0, "delta": {"content": piece}}, {"index": 1, "delta": {"content": piece}}]}
        elif kind == "raw":
            lines.append(b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"' + draw(st.sampled_from([b'a"b', b'a\\', b'a","content":"b', b'\\u00'])) + b'"},"finish_reason":null}]}')
            continue
        else:
            data = {"id": "c", "choices": [{"index": draw(st.sampled_from([0, 0, 0, 1])), "delta": delta, "finish_reason": None}]}
        lines.append(b"data: " + orjson.dumps(data))
    return b"\n\n".join([*lines, b"data: [DONE]"]) + b"\n\n"


@st.composite
def messages_streams(draw):
    events = []
    for _ in range(draw(st.integers(1, 40))):
        index = draw(st.integers(0, 1))
        kind = draw(st.sampled_from(["text", "thinking", "start", "raw", "json"]))
        piece = draw(PIECE)
        if kind == "start":
            data = {"type": "content_block_start", "index": index, "content_block": {"type": draw(st.sampled_from(["text", "thinking"])), "text": ""}}
        elif kind == "json":
            data = {"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}}
        elif kind == "raw":
            events.append(b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"' + draw(st.sampled_from([b'a"b', b'a\\', b'a","text":"b'])) + b'"}}')
            continue
        else:
            data = {"type": "content_block_delta", "index": index, "delta": {"type": f"{kind}_delta", kind: piece}}
        events.append(b"event: x\ndata: " + orjson.dumps(data))
    return b"\n\n".join(events) + b"\n\n"


DELTA = re.compile(rb'_delta"|"delta":\s*\{"')


def both_ways(api: str, body: bytes, monkeypatch) -> list:
    """The turns of `body` read every event in full and read from steady bytes, in one window and
    in windows of every few lines (`memory.WINDOW`): the same."""
    from toolshim import memory

    monkeypatch.setattr(memory, "STEADY", False)
    full = turns_given(api, body)
    monkeypatch.setattr(memory, "STEADY", True)
    steady = turns_given(api, body)
    assert steady == full
    for window in (0, 7, 100):
        monkeypatch.setattr(memory, "WINDOW", window)
        assert turns_given(api, body) == full, window
    return steady


@given(chat_streams())
def test_chat_turns_read_from_steady_bytes_are_the_turns_read_in_full(body):
    with pytest.MonkeyPatch.context() as monkeypatch:
        both_ways(CHAT, body, monkeypatch)


@given(messages_streams())
def test_messages_turns_read_from_steady_bytes_are_the_turns_read_in_full(body):
    with pytest.MonkeyPatch.context() as monkeypatch:
        both_ways(MESSAGES, body, monkeypatch)


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"])
@pytest.mark.parametrize("api", [CHAT, MESSAGES, RESPONSES])
def test_a_long_stream_is_remembered_in_windows_of_lines(api, line_end, monkeypatch):
    """A stream longer than a window is read a window of lines at a time, cut after a LF (never
    inside a CRLF; lines that end in CR alone are not cut): the same turns as read in one piece,
    and no more than a window's lines held at once."""
    from toolshim import memory

    thought, answer = "Let me see. " * 700, "It is " + "done. " * 500
    if api == CHAT:
        events = [b'data: {"choices":[{"index":0,"delta":{"reasoning_content":' + orjson.dumps(thought[at : at + 4]) + b"}}]}" for at in range(0, len(thought), 4)]
        events += [b'data: {"choices":[{"index":0,"delta":{"content":' + orjson.dumps(answer[at : at + 3]) + b"}}]}" for at in range(0, len(answer), 3)]
        events.append(b"data: [DONE]")
    elif api == MESSAGES:
        def delta(index: int, kind: str, text: str) -> bytes:
            return b"event: content_block_delta" + line_end + b"data: " + orjson.dumps({"type": "content_block_delta", "index": index, "delta": {"type": f"{kind}_delta", kind: text}})

        events = [b"event: content_block_start" + line_end + b'data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}']
        events += [delta(0, "thinking", thought[at : at + 4]) for at in range(0, len(thought), 4)]
        events.append(b"event: content_block_start" + line_end + b'data: {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}')
        events += [delta(1, "text", answer[at : at + 3]) for at in range(0, len(answer), 3)]
    else:
        item = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]}
        events = [b'data: {"type":"response.output_text.delta","delta":' + orjson.dumps(answer[at : at + 3]) + b"}" for at in range(0, len(answer), 3)]
        events += [b"data: " + orjson.dumps({"type": "response.output_item.done", "output_index": 0, "item": item})]
        events.append(b"data: " + orjson.dumps({"type": "response.completed", "response": {"output": [item]}}))
    body = (line_end * 2).join(events) + line_end * 2
    monkeypatch.setattr(memory, "WINDOW", len(body) + 1)
    [whole] = turns_given(api, body)
    assert whole.text == answer
    if api != RESPONSES:
        assert (whole.reasoning or {}).get("reasoning_content", "") == thought or thought in str(whole.reasoning)

    held = []
    lines = memory._lines
    monkeypatch.setattr(memory, "_lines", lambda window: held.append(len(window)) or lines(window))
    monkeypatch.setattr(memory, "WINDOW", 1000)
    assert turns_given(api, body) == [whole]
    if line_end == b"\r":
        assert held == [len(body)]  # (no LF to cut after)
    else:
        longest = max(map(len, body.split(line_end))) + len(line_end)
        assert len(held) > 5 and max(held) <= 1000 + longest  # a window and the rest of its last line
    if api == CHAT:  # a run of steady events kept as one string, not a string an event
        turns = memory._ChatTurns()
        turns.read(body)
        assert len(turns.choices[0]["reasoning_content"]) <= len(held) + 2 < len(thought) // 4  # (a piece a window at most)


@pytest.mark.parametrize(
    "bodies",
    [
        [b"a\\", b',"b'],  # an escape cut at a piece's end: with the next, two strings in an array
        [b'a","b'],  # a quote not escaped: two strings where one piece was
        [b"\\u00", b"41"],  # an escape cut in two: one character
        [b"c\\\\", b"d\\\"e"],  # a backslash, a quote, escaped: pieces as they are
    ],
)
def test_a_run_of_steady_events_is_decoded_as_each_would_be(bodies, monkeypatch):
    """A run of events of one frame is decoded at once (`memory._each_string`): pieces that are
    no JSON string by themselves are read in full, however they would join."""
    def line(body: bytes) -> bytes:
        return b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"' + body + b'"},"finish_reason":null}]}'

    good = [b"x", b"y", b"z"]
    body = b"\n\n".join([line(good[0]), *(line(piece) for piece in bodies), line(good[1]), line(good[2]), b"data: [DONE]"]) + b"\n\n"
    [turn] = both_ways(CHAT, body, monkeypatch)
    # (a piece that is no string makes its event's JSON none: that event adds nothing)
    assert turn.text == "x" + "".join(orjson.loads(b'"' + piece + b'"') for piece in bodies if _one_string(piece)) + "yz"


def _one_string(body: bytes) -> bool:
    try:
        return isinstance(orjson.loads(b'"' + body + b'"'), str)
    except orjson.JSONDecodeError:
        return False


def remembered_through_the_stream(context, reads: list[bytes], api: str = CHAT) -> tuple[list, list, int]:
    """A Chat or Messages stream through `StreamRewrite` in `reads`, remembered at its terminal
    event: the turns read from what the lanes noted (`turns_given_pieces`), the turns read again
    from the whole body (`turns_given`), and how many of the events the client got were taken
    from the notes, not read again."""
    handed = []
    rewriter = (MessagesStreamRewriter if api == MESSAGES else ChatStreamRewriter)(copy.deepcopy(context))
    terminal = MESSAGES_TERMINAL if api == MESSAGES else CHAT_TERMINAL
    stream = StreamRewrite(rewriter, incremental_decoder(""), "u", False, on_terminal=lambda sent, noted: handed.append((list(sent), noted)), terminal=terminal)
    for read in [*reads, b""]:
        stream(read)
    [(sent, noted)] = handed
    taken = sum(len(bodies) for call, bodies in _noted_stretches(sent, noted) if call is not None) if noted else 0
    return turns_given_pieces(api, sent, noted), turns_given(api, b"".join(sent)), taken


def noted_runs(noted) -> list[tuple[tuple | None, list[bytes]]]:
    """The runs of `NotedEvents`: what each adds to, and its events."""
    starts = [first for first, *_ in noted.runs]
    return [(call, noted[first:end]) for (first, call, *_), end in zip(noted.runs, [*starts[1:], len(noted)])]


def test_what_a_lane_noted_is_remembered_as_the_body_read_again(monkeypatch):
    """The lanes note the events they send (stream.py's `NotedEvents`), and those are not read
    again: the turns are those of the whole body read again, for the lanes' Chat and Messages
    streams and the recorded ones in every way of cutting them into reads (one event a read, two,
    eight, each event cut in two, random splits)."""
    from test_lanes import CountingSecrets, event_cuts, lane_streams, recorded_streams
    from toolshim import calls

    cases = [(name, api, context, body) for name, api, context, body in lane_streams() if api != RESPONSES]
    for param in recorded_streams():
        api, request_body, body = param.values
        if api == CHAT:
            cases.append((param.id, api, RequestContext.from_body(request_body), body))
        elif api == MESSAGES:
            cases.append((param.id, api, RequestContext.from_request(json.loads(request_body)), body))
    noted_in = set()
    for name, api, context, body in cases:
        events = by_event(body)
        for reads in [*event_cuts(body, 7), [b"".join(events[at : at + 8]) for at in range(0, len(events), 8)], [body]]:
            monkeypatch.setattr(calls, "secrets", CountingSecrets())  # (the same ids both ways)
            monkeypatch.setattr(calls, "_ID_CHARACTERS", calls.IdCharacters())
            fed, read_again, noted = remembered_through_the_stream(context, reads, api)
            assert fed == read_again, (name, [len(read) for read in reads][:20])
            if noted:
                noted_in.add(name)
    # (the lane's reads were taken from what it noted, not read again: in paced and burst reads)
    wanted = {"kimi in content", "kimi in mirrored reasoning", "kimi: prose and calls in turn", "messages: kimi in thinking"}
    assert wanted <= noted_in, noted_in


def test_a_read_of_a_lane_s_pieces_and_prose_after_the_call_is_read_again():
    """The call and its section end in one event, and prose follows in the same read, where no
    lane is armed (the lexer is idle): the lane's pieces are taken from its notes, the events
    after them read again, and the turn remembered holds the prose."""
    from test_lanes import BASH_CHAT, chat_chunk

    model = "moonshotai/Kimi-K2.5"
    context = RequestContext.from_body(json.dumps({"model": model, "tools": [BASH_CHAT], "stream": True}).encode())
    texts = ["Let me look.", "<|tool_calls_section_begin|><|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>", '{"co', "mmand", '": "l', 's"}']
    texts += ["<|tool_call_end|><|tool_calls_section_end|>", "Done", ", all", " listed."]
    events = [chat_chunk(model, {"role": "assistant", "content": ""}), *(chat_chunk(model, {"content": text}) for text in texts)]
    events += [chat_chunk(model, {}, "tool_calls"), b"data: [DONE]\n\n"]
    reads = [*events[:5], b"".join(events[5:11]), *events[11:]]  # (the last two pieces, the end, the prose)
    fed, read_again, noted = remembered_through_the_stream(context, reads)
    assert fed == read_again and noted >= 2
    assert fed[0].calls[0][1:] == ("bash", '{"command": "ls"}') and fed[0].text.endswith("Done, all listed.")


@pytest.mark.parametrize("events_a_read", [1, 8])
@pytest.mark.parametrize("details", [False, True])
def test_reasoning_passed_as_it_came_is_remembered_from_what_the_quiet_lane_noted(events_a_read, details):
    """A long reasoning (mirrored fields, as Kimi's servers send them) passes the quiet lane as it
    came: the lane notes its string bodies, and remembering takes them instead of reading the
    events again. Where the events hold something else a client accumulates as well (OpenRouter's
    `reasoning_details`), nothing is noted: the events are read again."""
    from test_lanes import BASH_CHAT, chat_chunk

    model = "moonshotai/Kimi-K2.5"
    context = RequestContext.from_body(json.dumps({"model": model, "tools": [BASH_CHAT], "stream": True}).encode())
    words = [f"w{n} " for n in range(300)]
    extra = {"reasoning_details": [{"type": "reasoning.text", "text": "d", "index": 0}]} if details else {}
    events = [chat_chunk(model, {"role": "assistant", "content": ""})]
    events += [chat_chunk(model, {"reasoning": word, "reasoning_content": word, **extra}) for word in words]
    events += [chat_chunk(model, {"content": "Done."}), chat_chunk(model, {}, "stop"), b"data: [DONE]\n\n"]
    reads = [b"".join(events[at : at + events_a_read]) for at in range(0, len(events), events_a_read)]
    fed, read_again, noted = remembered_through_the_stream(context, reads)
    assert fed == read_again and fed[0].reasoning["reasoning_content"] == "".join(words)
    assert (noted == 0) if details else (noted > 250), noted


@pytest.mark.parametrize("stream", ["kimi in content", "messages: kimi in thinking"])
def test_a_call_s_pieces_are_noted_in_one_run(stream):
    """Paced, a read is one event: each call's pieces of arguments are noted as one run, so
    that remembering at the terminal event decodes a call's pieces at once."""
    from test_lanes import lane_streams

    [(api, context, body)] = [(api, context, body) for name, api, context, body in lane_streams() if name == stream]
    handed = []
    rewriter = (MessagesStreamRewriter if api == MESSAGES else ChatStreamRewriter)(copy.deepcopy(context))
    terminal = MESSAGES_TERMINAL if api == MESSAGES else CHAT_TERMINAL
    stream_callable = StreamRewrite(rewriter, incremental_decoder(""), "u", False, on_terminal=lambda sent, noted: handed.append(noted), terminal=terminal)
    for read in [*by_event(body), b""]:
        stream_callable(read)
    [noted] = handed
    [turn] = turns_given(api, b"".join(stream_callable.sent))
    arguments = [events for call, events in noted_runs(noted) if call is not None and call[0] == "args" and events]
    assert len(arguments) == len(turn.calls) == 2 and all(len(events) >= 5 for events in arguments), noted.runs


def test_a_lane_armed_again_for_the_same_call_goes_on_with_its_run():
    """A lane armed again (after each event the full path read: a boundary, a piece that was not
    steady) for what the run's events already add to, around the same bytes, goes on with the
    run; anything else begins a new one."""
    from toolshim.stream import NotedEvents

    noted = NotedEvents()
    head, tail, wider = b'data: {"delta":"', b'"}\n\n', b'data: {"delta": "'
    noted.armed(("args", 0, 0), head, tail)
    noted.append(b"first")
    noted.armed(("args", 0, 0), head, tail)
    noted.append(b"second")
    noted.armed(("args", 0, 0), wider, tail)  # (another frame around the same call's pieces)
    noted.armed(("args", 0, 1), wider, tail)
    noted.append(b"third")
    noted.armed(("text", 0, ("a", "b")), head, tail, b'","b":"')
    assert noted.runs == [(0, ("args", 0, 0), head, tail, None), (2, ("args", 0, 0), wider, tail, None), (2, ("args", 0, 1), wider, tail, None), (3, ("text", 0, ("a", "b")), head, tail, b'","b":"')]


@pytest.mark.parametrize("events_a_read", [1, 8])
def test_text_a_block_lane_renders_is_read_again_not_taken_as_the_text_that_came(events_a_read):
    """A thinking block's lane notes the deltas it sends as they came, in upstream's own frame
    (here with spaces, as `json.dumps` writes it); a `<` it held goes out with the next piece, in
    a delta it renders itself, in its own frame: that one is not noted (its string does not sit
    where the run says), and the turn remembered is the one the client got."""
    from anthropic_stream import block_events, message_end, message_start

    model = "moonshotai/Kimi-K2.5"
    context = RequestContext.from_request({"model": model, "tools": [{"name": "bash", "input_schema": {"type": "object"}}]})
    pieces = ["Let me", " look", " at a", " <", "b <", "c <", "d and", " more", " text", " done."]
    events = [message_start(model), *block_events(0, "thinking", pieces, signature=""), *message_end("end_turn")]
    body = b"".join(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode() for event in events)
    split = by_event(body)
    reads = [b"".join(split[at : at + events_a_read]) for at in range(0, len(split), events_a_read)]
    fed, read_again, taken = remembered_through_the_stream(context, reads, MESSAGES)
    assert fed == read_again and fed[0].reasoning["blocks"][0]["thinking"] == "".join(pieces), fed
    assert taken >= 3 or events_a_read > 1  # (in reads of several, the quiet deltas pass whole: read again)


@pytest.mark.parametrize("events_a_read", [1, 2, 8])
@pytest.mark.parametrize("stream", ["kimi in content", "kimi in mirrored reasoning", "kimi: prose and calls in turn", "messages: kimi in thinking"])
def test_what_a_lane_notes_is_an_event_it_sent_with_its_string_where_the_run_says(stream, events_a_read):
    """Each event a lane notes is, by identity, one of the pieces the rewriter returned for the
    read it was noted in (an event the client gets as the lane made it), and its run finds in
    it a JSON string body that the event, parsed, holds in the place the run names: a call's
    arguments (Chat's `tool_calls` entry of that index, Messages' `input_json_delta` of that
    block) or the text fields (Chat's fields of the choice, Messages' text or thinking delta of
    the block)."""
    from test_lanes import REWRITERS, lane_streams
    from toolshim.stream import NotedEvents

    [(api, context, body)] = [(api, context, body) for name, api, context, body in lane_streams() if name == stream]
    rewriter = REWRITERS[api](copy.deepcopy(context))
    rewriter.laned = noted = NotedEvents()
    events = by_event(body)
    for at in range(0, len(events), events_a_read):
        before = len(noted)
        out = rewriter.feed(b"".join(events[at : at + events_a_read]))
        assert all(any(piece is event for piece in out) for event in noted[before:])
    checked = 0
    for (_, call, head, tail, mid), (_, events) in zip(noted.runs, noted_runs(noted)):
        for event in events:
            assert event.startswith(head) and event.endswith(tail)
            string = event[len(head) : len(event) - len(tail)]
            if mid is not None:  # (mirrored fields: the body, `mid`, the body again)
                size = (len(string) - len(mid)) // 2
                assert string == string[:size] + mid + string[:size]
                string = string[:size]
            text = json.loads(b'"' + string + b'"')
            chunk = json.loads(event[event.index(b"{") :])
            if call is None:
                continue
            if api == MESSAGES and call[0] == "args":
                assert call == ("args", chunk["index"]) and chunk["delta"] == {"type": "input_json_delta", "partial_json": text}
            elif api == MESSAGES:
                assert call == ("text", chunk["index"], call[2]) and chunk["delta"] == {"type": f"{call[2]}_delta", call[2]: text}
            elif call[0] == "args":
                [choice] = chunk["choices"]
                [entry] = choice["delta"]["tool_calls"]
                assert (choice["index"], entry["index"], entry["function"]["arguments"]) == (call[1], call[2], text)
            else:
                [choice] = chunk["choices"]
                assert choice["index"] == call[1] and all(choice["delta"][field] == text for field in call[2])
            checked += 1
    assert checked >= 10, noted.runs


@budget(100)
@given(chat_case())
def test_fuzz_what_a_lane_noted_is_remembered_as_the_body_read_again(case):
    for reads in (case["pieces"], by_event(case["body"])):
        fed, read_again, _ = remembered_through_the_stream(case["context"], reads)
        assert fed == read_again


@budget(100)
@given(hostile_messages(), st.lists(st.integers(1, 5000), max_size=10), st.sampled_from(["kimi-k2", "MiniMax-M2", "qwen3", "llama-3"]))
def test_fuzz_what_a_messages_lane_noted_is_remembered_as_the_body_read_again(body, cuts, model):
    context = RequestContext.from_request({"model": model, "tools": [{"name": "Bash", "input_schema": {"type": "object"}}]})
    events = by_event(body)
    for reads in (split_at(body, [cut % len(body) for cut in cuts]), events, [b"".join(events[at : at + 8]) for at in range(0, len(events), 8)]):
        fed, read_again, _ = remembered_through_the_stream(context, reads, MESSAGES)
        assert fed == read_again


def test_what_the_rewriters_send_is_remembered_the_same_from_steady_bytes(monkeypatch):
    """The lanes' streams (calls in content and in mirrored reasoning, prose and calls in turn,
    Responses, Messages) as the client gets them: the same turns read either way, and most
    events are not parsed."""
    from test_lanes import lane_streams, rewrite
    from toolshim import memory

    parsed = {"lines": 0}
    loads = orjson.loads

    def counting(data, *args):
        parsed["lines"] += isinstance(data, bytes) and DELTA.search(data) is not None  # (a delta read in full)
        return loads(data, *args)

    for name, api, context, body in lane_streams():
        sent, _ = rewrite(api, context, [body], True, monkeypatch)
        turns = both_ways(api, sent, monkeypatch)
        assert turns and (turns[0].calls or turns[0].text), name
        if api != RESPONSES and "the role in every delta" not in name:
            # (That one's events as sent alternate two frames, the role's chunk and the piece's:
            # no run of one frame to take at once. Its turns are checked above.)
            monkeypatch.setattr(memory.orjson, "loads", counting)
            parsed["lines"] = 0
            turns_given(api, sent)
            monkeypatch.setattr(memory.orjson, "loads", loads)
            deltas = sum(DELTA.search(line) is not None for line in sent.split(b"\n\n"))
            assert parsed["lines"] > 0 and parsed["lines"] < deltas / 2, (name, parsed, deltas)


@pytest.mark.parametrize(
    "fields",
    [
        [], [(b"Content-Type", b"application/json")], [(b"Authorization", b"Bearer sk-1")],
        [(b"authorization", b"Bearer a"), (b"AUTHORIZATION", b"Bearer b")],  # (joined, as mitmproxy's `get` joins them)
        [(b"x-api-key", b"k\xff\xfe")], [(b"authorization", b""), (b"api-key", b"z")], [(b"X-Goog-Api-Key", b"g"), (b"x-api-key", b"x")],
    ],
)  # fmt: skip
def test_the_credential_scope_of_mitmproxy_headers_is_that_of_their_values(fields):
    """Read from the raw fields in one pass, the credential is what mitmproxy's own `get` gives
    for the first of the credential headers that has one."""
    from mitmproxy.http import Headers

    from toolshim.memory import _CREDENTIAL_HEADERS, credential_scope

    headers = Headers(fields)
    expected = next((value for value in (headers.get(name) for name in _CREDENTIAL_HEADERS) if value), "")
    as_mapping = {"authorization": expected} if expected else {}
    assert credential_scope(headers) == credential_scope(as_mapping)
    assert (credential_scope(headers) == b"") == (expected == "")
