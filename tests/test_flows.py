"""Recorded flows replayed offline through the real addon, against hand-written expectations.

Each `flows/<situation>.flow` holds one flow recorded by `tests/record_flows.py` through a
mitmdump without toolshim, so its response is the upstream's raw body. Beside it,
`flows/<situation>.expected.json` says, written by hand, what toolshim must make of it.

Chat Completions flows (and anything else that is neither a Responses nor a Messages call):

    {"content", "reasoning", "reasoning_content", "tool_calls": [{"id", "name", "arguments"}],
     "finish_reason", "usage"}   the accumulated stream (tests/wire.py) or the JSON message

Responses API flows (the request path ends in /responses):

    {"text", "reasoning", "items": ["message" | "reasoning" | "function_call", ...],
     "calls": [{"name", "arguments", "call_id"?, "id"?}], "status", "usage"}

    from `check_responses_stream` (every wire rule checked) for a stream, or from the JSON
    body's `output` for a buffered answer: "text" joins the output_text parts of every message
    item, "reasoning" the reasoning_text parts of every reasoning item, "items" lists the item
    types in order, "calls" the function_call items (only the keys given are compared; "name"
    and "arguments" are required), "status" and "usage" are the response's.

Anthropic Messages API flows (the request path ends in /v1/messages):

    {"content": [{"type": "text", "text"} | {"type": "thinking", "thinking", "signature"} |
                 {"type": "tool_use", "id", "name", "input"}, ...],
     "stop_reason", "usage"}

    for a stream, what the anthropic SDK's own accumulator (`accumulate_event`, what
    `messages.stream()` → `get_final_message()` runs) builds from the events, after the wire
    rules of `check_messages_stream`; for a buffered answer, the JSON body's `content`,
    `stop_reason` and `usage` as they are (validated as the SDK's `Message`). "usage" is the
    message_start's, updated by the message_delta's (the totals a client ends with).

Any API:

    {"unchanged": true}          the response body stays byte for byte what was recorded

(it may appear together with a result; "note" is a free-text description). Minted ids are
random: an expected Chat `tool_calls[].id`, Responses `call_id` / `id` or Messages `tool_use`
`id` given as "re:PATTERN" must match PATTERN whole (`re.fullmatch`), e.g.
"re:call_[A-Za-z0-9]{24}" or "re:toolu_[A-Za-z0-9]{24}"; any other value is
compared as it is. All flows go through one `mitmdump -nr ... -s addon/toolshim.py` run, since
every mitmdump start costs about a second.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness import PROJECT_ROOT, iter_sse_data, read_flows, run_offline
from wire import check_chat_stream, check_responses_stream

FLOWS_DIR = PROJECT_ROOT / "flows"
FLOW_FILES = sorted(FLOWS_DIR.glob("*.flow"))
RESULT_KEYS = ("content", "reasoning", "reasoning_content", "tool_calls", "finish_reason", "usage")
RESPONSES_KEYS = ("text", "reasoning", "items", "calls", "status", "usage")
MESSAGES_KEYS = ("content", "stop_reason", "usage")
COMMON_KEYS = {"unchanged", "note"}
METADATA_KEY = "toolshim"
PATTERN_PREFIX = "re:"


def situation(path: Path) -> str:
    return path.name.removesuffix(".flow")


def expected_path(path: Path) -> Path:
    return path.with_name(situation(path) + ".expected.json")


@dataclass
class Replay:
    originals: dict[str, Any]  # situation -> the recorded flow
    first: dict[str, Any]  # situation -> after one offline rewrite
    second: dict[str, Any]  # situation -> the first output rewritten again, as it is
    unmarked: dict[str, Any]  # situation -> the first output, toolshim's mark removed, rewritten again
    runs: list[Any]  # the CompletedProcess of each mitmdump run


def write_flows(path: Path, flows: list[Any]) -> None:
    from mitmproxy import io as mio

    with open(path, "wb") as f:
        writer = mio.FlowWriter(f)
        for flow in flows:
            writer.add(flow)


def by_situation(flows: list[Any], ids: dict[str, str]) -> dict[str, Any]:
    found = {flow.id: flow for flow in flows}
    return {name: found.get(flow_id) for name, flow_id in ids.items()}


def offline(src: Path, dst: Path, runs: list[Any]) -> list[Any]:
    result = run_offline(src, dst)
    runs.append(result)
    assert result.returncode == 0, f"mitmdump -r {src.name} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return read_flows(dst)


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> Replay:
    tmp = tmp_path_factory.mktemp("flows")
    originals: dict[str, Any] = {}
    for path in FLOW_FILES:
        flows = read_flows(path)
        assert len(flows) == 1, f"{path.name} holds {len(flows)} HTTP flows, not one"
        originals[situation(path)] = flows[0]
    ids = {name: flow.id for name, flow in originals.items()}
    assert len(set(ids.values())) == len(ids), "two fixtures share a flow id: re-record them"

    combined = tmp / "in.flow"
    write_flows(combined, list(originals.values()))
    runs: list[Any] = []
    first = by_situation(offline(combined, tmp / "out.flow", runs), ids)

    # The second pass gets each rewritten flow twice: as written (toolshim's mark tells it the
    # flow was rewritten already) and as a copy without the mark, so that the rewrite itself
    # must find nothing left to change in its own output.
    copies = {}
    for name, flow in first.items():
        assert flow is not None, f"{name}: the flow is missing from mitmdump's output"
        copies[name] = flow.copy()  # a copy has a new id
        copies[name].metadata.pop(METADATA_KEY, None)
    again = tmp / "again.in.flow"
    write_flows(again, [*first.values(), *copies.values()])
    second = offline(again, tmp / "again.out.flow", runs)
    return Replay(
        originals,
        first,
        by_situation(second, ids),
        by_situation(second, {name: flow.id for name, flow in copies.items()}),
        runs,
    )


# -- comparisons -------------------------------------------------------------------------------------


def is_event_stream(response: Any) -> bool:
    return response.headers.get("content-type", "").lower().startswith("text/event-stream")


def stream_result(response: Any) -> dict[str, Any]:
    result = check_chat_stream(response.content)
    return {key: result[key] for key in RESULT_KEYS} | {"done": result["done"]}


def json_result(response: Any) -> dict[str, Any]:
    body = json.loads(response.content)
    choice = body["choices"][0]
    message = choice["message"]
    calls = message.get("tool_calls") or []
    for call in calls:
        assert call.get("type") == "function", call
    return {
        "content": message.get("content"),
        "reasoning": message.get("reasoning"),
        "reasoning_content": message.get("reasoning_content"),
        "tool_calls": [
            {"id": call["id"], "name": call["function"]["name"], "arguments": call["function"]["arguments"]} for call in calls
        ],
        "finish_reason": choice.get("finish_reason"),
        "usage": body.get("usage"),
    }


def ends_with_done(response: Any) -> bool:
    """Does the stream send `data: [DONE]`? Read without the wire checks: an upstream body may
    break them (its own broken `tool_calls` are what toolshim repairs)."""
    return any(data.startswith("[DONE]") for data in iter_sse_data(response.content))


def result_of(response: Any) -> dict[str, Any]:
    return stream_result(response) if is_event_stream(response) else json_result(response)


# -- the Responses API -------------------------------------------------------------------------------


def is_responses(flow: Any) -> bool:
    return flow.request.path.split("?")[0].rstrip("/").endswith("/responses")


def is_messages(flow: Any) -> bool:
    return flow.request.path.split("?")[0].rstrip("/").endswith("/v1/messages")


def result_keys(flow: Any) -> tuple[str, ...]:
    if is_messages(flow):
        return MESSAGES_KEYS
    return RESPONSES_KEYS if is_responses(flow) else RESULT_KEYS


CALL_KEYS = ("name", "arguments", "call_id", "id")


def responses_stream_result(response: Any) -> dict[str, Any]:
    result = check_responses_stream(response.content)
    return {key: result[key] for key in RESPONSES_KEYS}


def responses_json_result(response: Any) -> dict[str, Any]:
    """The same reading of a buffered Responses body, from its `output`."""
    from openai.types.responses import Response

    body = json.loads(response.content)
    assert body.get("object") == "response", body
    Response.model_validate(body)  # what openai-python builds from it
    text = reasoning = ""
    calls = []
    for item in body["output"]:
        if item["type"] == "message":
            text += "".join(part["text"] for part in item["content"] if part["type"] == "output_text")
        elif item["type"] == "reasoning":
            reasoning += "".join(part["text"] for part in item.get("content") or [])
        elif item["type"] == "function_call":
            calls.append({key: item[key] for key in CALL_KEYS})
    ids = [item["id"] for item in body["output"] if "id" in item]
    assert len(ids) == len(set(ids)), f"duplicate item ids: {ids}"
    call_ids = [call["call_id"] for call in calls]
    assert len(call_ids) == len(set(call_ids)), f"duplicate call_ids: {call_ids}"
    return {
        "text": text,
        "reasoning": reasoning,
        "items": [item["type"] for item in body["output"]],
        "calls": calls,
        "status": body.get("status"),
        "usage": body.get("usage"),
    }


def responses_result_of(response: Any) -> dict[str, Any]:
    return responses_stream_result(response) if is_event_stream(response) else responses_json_result(response)


# -- the Anthropic Messages API ----------------------------------------------------------------------

BLOCK_DELTAS = {"text": {"text_delta", "citations_delta"}, "thinking": {"thinking_delta", "signature_delta"}, "tool_use": {"input_json_delta"}}


def sse_events(body: bytes) -> list[tuple[str | None, str]]:
    """(the `event:` name, the data) of each event of an SSE body."""
    events = []
    for block in body.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
        if data:
            events.append((name, "\n".join(data)))
    return events


def check_messages_stream(body: bytes) -> dict[str, Any]:
    """The wire rules of a Messages stream a client relies on, then what the anthropic SDK
    accumulates from it: message_start first and message_stop last, each event's `event:` line
    naming its type, blocks opened one at a time with indexes 0, 1, 2, …, every delta of a type
    its block takes and to the open block, tool_use opened with `input: {}`, every
    `partial_json` non-empty, their sum a JSON object when the block stops, one message_delta
    after the last block."""
    from anthropic.lib.streaming._messages import accumulate_event

    events = sse_events(body)
    assert events, "no events"
    snapshot = None
    open_block: tuple[int, str] | None = None
    started = 0
    json_buffer = ""
    stopped = delta_seen = False
    for name, data in events:
        event = json.loads(data)
        kind = event["type"]
        assert name == kind, f"event: {name} carries a {kind}"
        assert not stopped, f"{kind} after message_stop"
        if snapshot is None:
            assert kind in ("message_start", "ping") and not started, f"{kind} before message_start"
        if kind == "content_block_start":
            assert open_block is None, f"block {event['index']} opened while {open_block} is open"
            assert event["index"] == started, f"block {event['index']} opened, {started} expected"
            block_type = event["content_block"]["type"]
            if block_type == "tool_use":
                assert event["content_block"]["input"] == {}, event
                json_buffer = ""
            open_block, started = (event["index"], block_type), started + 1
        elif kind == "content_block_delta":
            assert open_block is not None and event["index"] == open_block[0], f"a delta to {event['index']}, open: {open_block}"
            assert event["delta"]["type"] in BLOCK_DELTAS.get(open_block[1], {event["delta"]["type"]}), (open_block, event)
            if event["delta"]["type"] == "input_json_delta":
                assert event["delta"]["partial_json"], "an empty partial_json"
                json_buffer += event["delta"]["partial_json"]
        elif kind == "content_block_stop":
            assert open_block is not None and event["index"] == open_block[0], f"stop of {event['index']}, open: {open_block}"
            if open_block[1] == "tool_use":
                assert isinstance(json.loads(json_buffer or "{}"), dict), json_buffer
            open_block = None
        elif kind == "message_delta":
            assert open_block is None and not delta_seen, "message_delta with a block open, or twice"
            delta_seen = True
        elif kind == "message_stop":
            assert delta_seen, "message_stop without message_delta"
            stopped = True
        assert kind != "error", event
        if kind != "ping":  # the SDK skips pings
            snapshot = accumulate_event(event=event, current_snapshot=snapshot)  # raises on what the SDK refuses
    assert snapshot is not None
    message = snapshot.to_dict()
    return {"content": message["content"], "stop_reason": message["stop_reason"], "usage": message["usage"], "stopped": stopped}


def messages_json_result(response: Any) -> dict[str, Any]:
    from anthropic.types import Message

    body = json.loads(response.content)
    Message.model_validate(body)  # what the anthropic SDK builds from it
    return {"content": body["content"], "stop_reason": body.get("stop_reason"), "usage": body.get("usage")}


def messages_result_of(response: Any) -> dict[str, Any]:
    if is_event_stream(response):
        return {key: value for key, value in check_messages_stream(response.content).items() if key in MESSAGES_KEYS}
    return messages_json_result(response)


def ends_with_message_stop(response: Any) -> bool:
    return any(name == "message_stop" for name, _ in sse_events(response.content))


def comparable_blocks(blocks: list[dict[str, Any]], expected: list[Any]) -> list[dict[str, Any]]:
    """Content blocks with a tool_use id replaced by the expected pattern it matches."""
    out = []
    for n, block in enumerate(blocks):
        wanted = expected[n] if n < len(expected) and isinstance(expected[n], dict) else {}
        out.append({**block, "id": same_or_matching(wanted.get("id"), block["id"])} if "id" in block else block)
    return out


# -- expected ids as patterns ------------------------------------------------------------------------


def same_or_matching(expected: Any, actual: Any) -> Any:
    """`expected` when it is a "re:" pattern that `actual` matches whole, else `actual`.

    The actual result takes the pattern's place only where it matches, so a comparison of the
    whole result shows every other difference, and a failed match shows the actual id.
    """
    if isinstance(expected, str) and expected.startswith(PATTERN_PREFIX) and isinstance(actual, str):
        if re.fullmatch(expected[len(PATTERN_PREFIX) :], actual):
            return expected
    return actual


def with_patterns(calls: list[dict[str, Any]], expected: list[Any], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """`calls` with the ids in `keys` replaced by the expected pattern they match, by position."""
    out = []
    for n, call in enumerate(calls):
        wanted = expected[n] if n < len(expected) and isinstance(expected[n], dict) else {}
        out.append({key: same_or_matching(wanted.get(key), value) if key in keys else value for key, value in call.items()})
    return out


def response_state(flow: Any) -> tuple[Any, ...]:
    response = flow.response
    return (response.status_code, tuple(response.headers.fields), response.raw_content)


def comparable_calls(calls: list[dict[str, Any]], expected: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses calls cut down to the keys each expected call gives, ids matched to patterns."""
    for call in expected:
        assert {"name", "arguments"} <= set(call) <= set(CALL_KEYS), f"a call needs name and arguments, may have {CALL_KEYS}: {call}"
    shown = [
        {key: value for key, value in call.items() if key in (expected[n] if n < len(expected) else CALL_KEYS)}
        for n, call in enumerate(calls)
    ]
    return with_patterns(shown, expected, ("call_id", "id"))


# -- tests -------------------------------------------------------------------------------------------


def test_the_fixture_set_is_complete() -> None:
    assert len(FLOW_FILES) >= 8, f"only {len(FLOW_FILES)} flows in {FLOWS_DIR}: run tests/record_flows.py"
    missing = [situation(p) for p in FLOW_FILES if not expected_path(p).exists()]
    assert not missing, f"flows without an expected file: {missing}"
    orphans = [p.name for p in FLOWS_DIR.glob("*.expected.json") if not p.with_name(p.name.removesuffix(".expected.json") + ".flow").exists()]
    assert not orphans, f"expected files without a flow: {orphans}"


@pytest.mark.parametrize("path", FLOW_FILES, ids=situation)
def test_flow_is_rewritten_as_expected(path: Path, replay: Replay) -> None:
    name = situation(path)
    expected = json.loads(expected_path(path).read_text(encoding="utf-8"))
    original, out = replay.originals[name], replay.first[name]
    keys = result_keys(original)
    known = {*keys, *COMMON_KEYS}
    assert set(expected) <= known, f"unknown keys in {expected_path(path).name}: {set(expected) - known}"
    assert expected.get("unchanged", True) is True, '"unchanged" may only be true: give the result instead'
    assert "unchanged" in expected or set(keys) & set(expected), f"{expected_path(path).name} expects nothing"
    assert all(run.returncode == 0 for run in replay.runs)

    assert out is not None, f"{name}: the flow is missing from mitmdump's output"
    assert out.response is not None and original.response is not None
    assert out.request.content == original.request.content
    assert out.response.status_code == original.response.status_code

    if expected.get("unchanged"):
        assert out.response.raw_content == original.response.raw_content
        # Markup that stayed text (an undeclared tool, say) is noted; nothing else is.
        annotation = out.metadata.get(METADATA_KEY, {})
        assert annotation.get("calls", 0) == 0 and "upstream" not in annotation

    if any(key in expected for key in keys):
        missing = [key for key in keys if key not in expected]
        assert not missing, f"{expected_path(path).name} lacks {missing}"
        if is_messages(original):
            actual = messages_result_of(out.response)
            if is_event_stream(out.response):  # a stream keeps its message_stop exactly when upstream sent one
                assert ends_with_message_stop(out.response) == ends_with_message_stop(original.response)
            actual["content"] = comparable_blocks(actual["content"], expected["content"])
        elif is_responses(original):
            actual = responses_result_of(out.response)
            actual["calls"] = comparable_calls(actual["calls"], expected["calls"])
        else:
            actual = result_of(out.response)
            if "done" in actual:  # a stream keeps its [DONE] exactly when upstream sent one
                assert actual.pop("done") == ends_with_done(original.response)
            actual["tool_calls"] = with_patterns(actual["tool_calls"], expected["tool_calls"], ("id",))
        assert actual == {key: expected[key] for key in keys}
        if not expected.get("unchanged"):
            assert METADATA_KEY in out.metadata, "a rewritten flow is annotated"


@pytest.mark.parametrize("path", FLOW_FILES, ids=situation)
def test_second_offline_rewrite_changes_nothing(path: Path, replay: Replay) -> None:
    name = situation(path)
    first, second, unmarked = replay.first[name], replay.second[name], replay.unmarked[name]
    assert first is not None and second is not None and unmarked is not None
    assert response_state(second) == response_state(first)
    assert second.request.content == first.request.content
    assert second.metadata.get(METADATA_KEY) == first.metadata.get(METADATA_KEY)
    # Without the mark, the rewrite still leaves its own output as it is.
    assert response_state(unmarked) == response_state(first)
    assert "upstream" not in unmarked.metadata.get(METADATA_KEY, {}), "the second pass changed something"


# What mitmweb's flow list shows for a fixture: toolshim's comment and mark, written by hand from
# the fixture's situation (the calls of its .expected.json, and what stayed text).
ANNOTATIONS = {
    "kimi_seed_000_reasoning": ("toolshim: kimi → 2 calls (bash, read_file)", ":wrench:"),
    "kimi_undeclared_tool_stays_text": ("toolshim: no call from markup · left as text: unknown tool ×1", ":warning:"),
    "sentinel_chat_non_strict_trailing_comma_repaired": (
        "toolshim: hermes → 1 call (get_weather) · repaired: JSON repaired ×1", ":wrench:"),
    "sentinel_chat_parallel_false": ("toolshim: hermes → 1 call (get_weather) · left as text: not allowed ×1", ":warning:"),
    "sentinel_chat_strict_schema_violation_stays_text": (
        "toolshim: no call from markup · left as text: strict schema ×1", ":warning:"),
    "broken_native_snapshot_and_double_encoded": (
        "toolshim: no call from markup · repaired: upstream's own calls (snapshot, dropped, double_encoded)", ":wrench:"),
    "think_preopened_deepseek_r1": ("toolshim: no call from markup · repaired: reasoning split from content", ":wrench:"),
    "responses_sentinel_stream_text_call_text": ("toolshim: hermes → 1 call (get_weather)", ":wrench:"),
    "dialect_qwen3_coder_xml": ("toolshim: qwen_xml → 1 call (search_code)", ":wrench:"),
    "dialect_granite_tool_call": ("toolshim: granite → 2 calls (get_weather, get_forecast)", ":wrench:"),
    "dialect_nemotron_toolcall": ("toolshim: nemotron → 1 call (read_lines) · repaired: reasoning split from content", ":wrench:"),
    "dialect_command_action": ("toolshim: command → 1 call (grep) · repaired: reasoning split from content", ":wrench:"),
    "plain_stream_without_markup": ("", ""),
    "non_llm_get_models": ("", ""),
    "messages_kimi_in_thinking_stream": ("toolshim: kimi → 1 call (bash)", ":wrench:"),
    "messages_qwen_tool_call_in_text": ("toolshim: hermes → 2 calls (get_weather, get_time)", ":wrench:"),
    "messages_minimax_think_in_text": ("toolshim: no call from markup · repaired: reasoning split from content", ":wrench:"),
    "messages_undeclared_tool_stays_text": ("toolshim: no call from markup · left as text: unknown tool ×1", ":warning:"),
    "messages_broken_native_split_tool_use": (
        "toolshim: no call from markup · repaired: upstream's own calls "
        "(input_at_start, empty_partial_json, split_tool_use_blocks, stop_reason)", ":wrench:"),
    "messages_plain_stream_unchanged": ("", ""),
    "messages_error_response_529": ("", ""),
}


@pytest.mark.parametrize("name", sorted(ANNOTATIONS))
def test_rewritten_flows_carry_a_comment_and_a_mark(name: str, replay: Replay) -> None:
    out = replay.first[name]
    assert (out.comment, out.marked) == ANNOTATIONS[name]
    if out.comment:
        tally = out.metadata[METADATA_KEY]["tally"]
        assert sum(row.get("LeakedMarkup", 0) for row in tally.values()) == out.metadata[METADATA_KEY]["calls"]


def test_mitmdump_prints_a_summary_line_at_shutdown(tmp_path: Path, replay: Replay) -> None:
    """Not quiet this time: the one line toolshim logs when mitmdump exits."""
    combined = tmp_path / "in.flow"
    write_flows(combined, list(replay.originals.values()))
    result = run_offline(combined, tmp_path / "out.flow", extra_args=["--set", "termlog_verbosity=info"], quiet=False)
    assert result.returncode == 0
    calls = sum(flow.metadata.get(METADATA_KEY, {}).get("calls", 0) for flow in replay.first.values())
    rewritten = sum(METADATA_KEY in flow.metadata and "upstream" in flow.metadata[METADATA_KEY] for flow in replay.first.values())
    summary = [line for line in result.stdout.splitlines() if "LLM flows," in line]
    assert len(summary) == 1, result.stdout[-3000:]
    assert f" {rewritten} rewritten, {calls} calls from markup, 0 failed; LeakedMarkup {calls}, " in summary[0]
