"""The sans-IO Responses rewrite: one test per rule of the issue, then every byte boundary, then
the same calls across both APIs, streamed or not."""

from __future__ import annotations

import json

import pytest

from harness import sse_body, split_bytes
from kimi import ARG_BEGIN, CALL_BEGIN, CALL_END, SECTION_BEGIN, SECTION_END
from responses import response_json, responses_events, responses_sse
from toolshim.chat import ChatStreamRewriter, rewrite_chat_completion
from toolshim.responses import ResponsesStreamRewriter, rewrite_response_body
from toolshim.tools import RequestContext
from wire import check_chat_stream, check_responses_stream

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}
TOOLS = [WEATHER, TIME]
CALL_PARIS = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
CALL_UTC = '<tool_call>\n{"name": "get_time", "arguments": "{\\"tz\\": \\"UTC\\"}"}\n</tool_call>'


def context(tools=TOOLS, **request) -> RequestContext:
    return RequestContext.from_body(json.dumps({"model": "m", "input": "hi", "tools": tools, **request}).encode())


def rewrite(body: bytes, pieces: list[bytes] | None = None, ctx: RequestContext | None = None, **options) -> bytes:
    rewriter = ResponsesStreamRewriter(ctx or context(), **options)
    out: list[bytes] = []
    for piece in pieces or [body]:
        out += rewriter.feed(piece)
    out += rewriter.close()
    assert b"" not in out
    assert rewriter.failure is None, rewriter.failure
    return b"".join(out)


def stream(text_pieces, reasoning_pieces=None) -> bytes:
    return responses_sse(responses_events("m", text_pieces, reasoning_pieces=reasoning_pieces, tools=TOOLS))


def calls_of(result: dict) -> list[tuple[str, dict]]:
    return [(c["name"], json.loads(c["arguments"])) for c in result["calls"]]


# -- the rules ----------------------------------------------------------------------------------


def test_a_stream_without_markup_passes_byte_for_byte():
    body = stream(["Hello", " there", ", 2 < 3 and <b>bold</b>."], reasoning_pieces=["Think", "ing."])
    assert rewrite(body) == body


def test_a_sentinel_block_becomes_a_function_call_item_after_the_text():
    result = check_responses_stream(rewrite(stream(["Let me check.", CALL_PARIS])))
    assert result["items"] == ["message", "function_call"]
    assert result["text"] == "Let me check."
    assert calls_of(result) == [("get_weather", {"city": "Paris"})]
    assert result["calls"][0]["call_id"].startswith("call_") and result["calls"][0]["id"].startswith("fc_")


def test_a_message_holding_only_a_call_leaves_no_message_item():
    result = check_responses_stream(rewrite(stream([CALL_PARIS[:20], CALL_PARIS[20:]])))
    assert result["items"] == ["function_call"]
    assert result["text"] == ""


def test_text_after_a_call_goes_into_a_message_of_its_own():
    result = check_responses_stream(rewrite(stream(["Checking.", CALL_PARIS, "\n", CALL_UTC, " Done."])))
    assert result["items"] == ["message", "function_call", "function_call", "message"]
    assert result["text"] == "Checking. Done."
    assert calls_of(result) == [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "UTC"})]


def test_string_arguments_are_passed_verbatim():
    result = check_responses_stream(rewrite(stream([CALL_UTC])))
    assert result["calls"][0]["arguments"] == '{"tz": "UTC"}'


def test_kimi_markup_in_output_text_goes_the_same_way():
    kimi = f"{SECTION_BEGIN}{CALL_BEGIN}functions.get_weather:0{ARG_BEGIN}" + '{"city": "Oslo"}' + f"{CALL_END}{SECTION_END}"
    result = check_responses_stream(rewrite(stream(["On it.", kimi[:30], kimi[30:]])))
    assert result["items"] == ["message", "function_call"]
    assert calls_of(result) == [("get_weather", {"city": "Oslo"})]
    assert result["calls"][0]["call_id"] == "functions.get_weather:0"


def test_kimi_markup_in_reasoning_text_cuts_the_reasoning_item():
    kimi = f"{SECTION_BEGIN}{CALL_BEGIN}functions.get_weather:0{ARG_BEGIN}" + '{"city": "Oslo"}' + f"{CALL_END}{SECTION_END}"
    result = check_responses_stream(rewrite(stream(["It is sunny."], reasoning_pieces=["I need the weather.", kimi])))
    assert result["items"] == ["reasoning", "function_call", "message"]
    assert result["reasoning"] == "I need the weather."
    assert calls_of(result) == [("get_weather", {"city": "Oslo"})]


def test_undeclared_tools_stay_text():
    body = stream(["Use ", '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', " like this."])
    result = check_responses_stream(rewrite(body))
    assert result["calls"] == []
    assert result["text"] == 'Use <tool_call>{"name": "rm_rf", "arguments": {}}</tool_call> like this.'


def test_tool_choice_none_makes_no_call():
    result = check_responses_stream(rewrite(stream([CALL_PARIS]), ctx=context(tool_choice="none")))
    assert result["calls"] == [] and result["text"] == CALL_PARIS


def test_parallel_tool_calls_false_keeps_only_the_first_call():
    result = check_responses_stream(rewrite(stream([CALL_PARIS, CALL_UTC]), ctx=context(parallel_tool_calls=False)))
    assert calls_of(result) == [("get_weather", {"city": "Paris"})]
    assert result["text"] == CALL_UTC  # the rest stays visible text: nothing is lost


def test_sequence_numbers_and_output_indices_are_renumbered():
    body = rewrite(stream(["A", CALL_PARIS, "B"], reasoning_pieces=["r"]))
    events = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: ")]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    assert added == [0, 1, 2, 3]
    check_responses_stream(body)


def test_required_action_is_sent_only_when_asked_for():
    plain = rewrite(stream([CALL_PARIS]))
    assert b"response.required_action" not in plain
    with_action = rewrite(stream([CALL_PARIS]), required_action=True)
    check_responses_stream(with_action, allow_extra_types={"response.required_action"})
    events = [json.loads(line[6:]) for line in with_action.decode().splitlines() if line.startswith("data: ")]
    action = next(e for e in events if e["type"] == "response.required_action")
    assert events[-1]["type"] == "response.completed" and events[-2] is action
    (tool_call,) = action["required_action"]["submit_tool_outputs"]["tool_calls"]
    assert tool_call["function"] == {"name": "get_weather", "arguments": '{"city":"Paris"}'}


def test_a_stream_cut_before_its_terminal_event_releases_what_was_held():
    events = responses_events("m", ["Look: <tool_call>{\"name\": \"get_weather\""], tools=TOOLS)
    body = responses_sse(events[:-4])  # cut before output_text.done
    out = rewrite(body)
    assert b"<tool_call>" in out  # the unfinished block is released as text, not lost


def test_non_streaming_body_is_rewritten_the_same_way():
    body = response_json("m", "Checking." + CALL_PARIS + " Done.", tools=TOOLS)
    stats = rewrite_response_body(body, context())
    assert stats is not None and stats.calls == 1
    types = [item["type"] for item in body["output"]]
    assert types == ["message", "function_call", "message"]
    assert body["output"][1]["name"] == "get_weather" and json.loads(body["output"][1]["arguments"]) == {"city": "Paris"}
    assert body["output"][0]["content"][0]["text"] == "Checking."
    assert body["output"][2]["content"][0]["text"] == " Done."


def test_non_streaming_body_without_markup_is_untouched():
    body = response_json("m", "Hello <b>there</b>.", tools=TOOLS)
    assert rewrite_response_body(body, context()) is None


# -- chunking -----------------------------------------------------------------------------------


def final_output(body: bytes) -> list:
    """The completed response's items, ids left out (they are minted at random)."""
    events = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: ")]
    (completed,) = [e for e in events if e["type"] == "response.completed"]
    drop = ("id", "call_id")
    return [{k: v for k, v in item.items() if k not in drop} for item in completed["response"]["output"]]


def test_every_byte_boundary_gives_the_same_result():
    body = stream(["Sure.", CALL_PARIS[:17], CALL_PARIS[17:], " Then ", CALL_UTC, "ok"])
    whole = rewrite(body)
    check_responses_stream(whole)
    expected = final_output(whole)
    assert [item["type"] for item in expected] == ["message", "function_call", "message", "function_call", "message"]
    for cut in range(1, len(body)):
        out = rewrite(body, split_bytes(body, [cut]))
        assert final_output(out) == expected, cut
        if cut % 97 == 0:  # the full wire check is slow (pydantic): a sample of the cuts
            check_responses_stream(out)


def test_one_byte_at_a_time_gives_the_same_result():
    body = stream(["Sure.", CALL_PARIS, " ünïcode ✓"])
    whole = check_responses_stream(rewrite(body))
    result = check_responses_stream(rewrite(body, [body[i : i + 1] for i in range(len(body))]))
    assert (result["text"], calls_of(result)) == (whole["text"], calls_of(whole))


# -- both APIs agree ----------------------------------------------------------------------------

PARITY_TEXTS = [
    "Checking." + CALL_PARIS,
    CALL_PARIS + "\n" + CALL_UTC,
    "Before " + CALL_UTC + " after",
    f"{SECTION_BEGIN}{CALL_BEGIN}functions.get_time:3{ARG_BEGIN}" + '{"tz": "CET"}' + f"{CALL_END}{SECTION_END}",
    'Explaining: <tool_call>{"name": "nope", "arguments": {}}</tool_call> is the syntax.',
]


@pytest.mark.parametrize("text", PARITY_TEXTS)
def test_the_same_text_gives_the_same_calls_on_both_apis_streamed_or_not(text):
    chat_tools = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in TOOLS]
    chat_ctx = RequestContext.from_body(json.dumps({"model": "m", "messages": [], "tools": chat_tools}).encode())
    pieces = [text[i : i + 7] for i in range(0, len(text), 7)]

    chat_body = sse_body([
        {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces
    ] + [{"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
          "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}])
    rewriter = ChatStreamRewriter(chat_ctx)
    chat_stream = check_chat_stream(b"".join(rewriter.feed(chat_body) + rewriter.close()))
    chat_stream_calls = [(c["name"], json.loads(c["arguments"])) for c in chat_stream["tool_calls"]]

    completion = {"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}
    rewrite_chat_completion(completion, chat_ctx)
    message = completion["choices"][0]["message"]
    chat_json_calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]

    responses_stream = calls_of(check_responses_stream(rewrite(stream(pieces))))
    body = response_json("m", text, tools=TOOLS)
    rewrite_response_body(body, context())
    responses_json = [(i["name"], json.loads(i["arguments"])) for i in body["output"] if i["type"] == "function_call"]

    assert chat_stream_calls == chat_json_calls == responses_stream == responses_json
    assert (len(chat_stream_calls) > 0) == ("nope" not in text)


# -- upstream shapes ----------------------------------------------------------------------------


def events_of(body: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: ")]


def test_upstream_without_event_lines_gets_none_from_us_either():
    body = b"".join(
        b"data: " + json.dumps(e).encode() + b"\n\n" for e in responses_events("m", ["Hi.", CALL_PARIS], tools=TOOLS)
    )
    out = rewrite(body)
    assert b"event:" not in out
    assert calls_of(check_responses_stream(out)) == [("get_weather", {"city": "Paris"})]


def test_upstream_without_sequence_numbers_gets_them():
    body = b"".join(
        b"data: " + json.dumps(e).encode() + b"\n\n" for e in responses_events("m", ["plain text"], tools=TOOLS)
    )
    out = events_of(rewrite(body))
    assert [e["sequence_number"] for e in out] == list(range(len(out)))


def test_a_native_function_call_item_keeps_its_place_after_ours():
    events = responses_events("m", [CALL_PARIS], tools=TOOLS)
    native = {"id": "fc_native", "type": "function_call", "call_id": "call_native", "name": "get_time", "arguments": "", "status": "in_progress"}
    done = {**native, "arguments": "{}", "status": "completed"}
    completed = events.pop()
    events += [
        {"type": "response.output_item.added", "output_index": 1, "item": native},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_native", "output_index": 1, "delta": "{}"},
        {"type": "response.function_call_arguments.done", "item_id": "fc_native", "output_index": 1, "name": "get_time", "arguments": "{}"},
        {"type": "response.output_item.done", "output_index": 1, "item": done},
    ]
    completed["response"]["output"].append(done)
    events.append(completed)
    result = check_responses_stream(rewrite(responses_sse(events)))
    assert result["items"] == ["function_call", "function_call"]
    assert [c["call_id"] for c in result["calls"]][1] == "call_native"


def test_a_refusal_part_passes_through():
    events = responses_events("m", ["x"], tools=TOOLS)
    # turn the message's only part into a refusal
    refusal = {"type": "refusal", "refusal": ""}
    shaped = []
    for e in events:
        if e["type"] == "response.content_part.added":
            e = {**e, "part": refusal}
        elif e["type"] == "response.output_text.delta":
            e = {"type": "response.refusal.delta", "item_id": e["item_id"], "output_index": 0, "content_index": 0, "delta": "No."}
        elif e["type"] == "response.output_text.done":
            e = {"type": "response.refusal.done", "item_id": e["item_id"], "output_index": 0, "content_index": 0, "refusal": "No."}
        elif e["type"] == "response.content_part.done":
            e = {**e, "part": {"type": "refusal", "refusal": "No."}}
        elif e["type"] == "response.output_item.done":
            e = {**e, "item": {**e["item"], "content": [{"type": "refusal", "refusal": "No."}]}}
        elif e["type"] == "response.completed":
            e["response"]["output"][0]["content"] = [{"type": "refusal", "refusal": "No."}]
        shaped.append(e)
    body = responses_sse(shaped)
    assert rewrite(body) == body


def test_output_text_deltas_into_a_part_of_another_type_are_read_all_the_same():
    """A server announcing its part as `{"type": "text", "text": ""}` (not `output_text`) and
    then sending `output_text.delta` events into it: the markup in them is still a call."""
    events = responses_events("m", ["Hi. ", CALL_PARIS], tools=TOOLS)
    for e in events:
        if e["type"] == "response.content_part.added":
            e["part"] = {"type": "text", "text": ""}
    sent = events_of(rewrite(responses_sse(events)))  # the part's type is upstream's: no SDK model takes it
    done = [e["item"] for e in sent if e["type"] == "response.output_item.done"]
    assert [(i["type"], i.get("name"), i.get("arguments")) for i in done] == [
        ("message", None, None), ("function_call", "get_weather", '{"city":"Paris"}')
    ]
    assert "".join(e["delta"] for e in sent if e["type"] == "response.output_text.delta") == "Hi. "
    assert done[0]["content"] == [{"type": "text", "text": "Hi. "}]


def test_items_only_listed_in_the_terminal_event_are_rewritten_there():
    events = responses_events("m", ["Hi." + CALL_PARIS], tools=TOOLS)
    body = responses_sse([events[0], events[-1]])  # created, completed: nothing streamed item by item
    completed = events_of(rewrite(body))[-1]
    assert [i["type"] for i in completed["response"]["output"]] == ["message", "function_call"]


def test_content_after_a_leaked_think_end_in_reasoning_becomes_a_message():
    kimi = f"{SECTION_BEGIN}{CALL_BEGIN}functions.get_time:0{ARG_BEGIN}" + '{"tz": "UTC"}' + f"{CALL_END}{SECTION_END}"
    events = responses_events("m", [], reasoning_pieces=["Need the time.", kimi, "</think>", "It is noon."], tools=TOOLS)
    result = check_responses_stream(rewrite(responses_sse(events)))
    assert result["items"] == ["reasoning", "function_call", "message"]
    assert result["reasoning"] == "Need the time."
    assert result["text"] == "It is noon."


# -- liveness and the JSON-aware end ------------------------------------------------------------


def test_text_streams_live_and_a_block_is_held_until_it_closes():
    block = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    events = responses_events("m", ["Let me check.", block[:30], block[30:], " ok"], tools=TOOLS)
    rewriter = ResponsesStreamRewriter(context())
    sent: list[list[dict]] = []
    for raw in responses_sse(events).split(b"\n\n")[:-1]:
        sent.append(events_of(b"".join(rewriter.feed(raw + b"\n\n"))))
    types = [[e["type"] for e in batch] for batch in sent]
    first_text = next(i for i, batch in enumerate(sent) if any(e.get("delta") == "Let me check." for e in batch))
    assert types[first_text][-1] == "response.output_text.delta"  # sent with the event that brought it
    assert types[first_text + 1] == []  # the first half of the block: held
    assert "response.function_call_arguments.done" in types[first_text + 2]  # the whole call at its end tag


def test_an_end_tag_inside_a_json_string_does_not_close_the_block_at_any_split():
    html = '<tool_call>{"name": "get_weather", "arguments": {"city": "a</tool_call>b"}}</tool_call> after'
    chat_tools = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in TOOLS]
    ctx = RequestContext.from_body(json.dumps({"model": "m", "messages": [], "tools": chat_tools}).encode())
    body = sse_body([
        {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {"content": html}, "finish_reason": None}]},
        {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ])
    for cut in range(1, len(body)):
        rewriter = ChatStreamRewriter(ctx)
        result = check_chat_stream(b"".join(rewriter.feed(body[:cut]) + rewriter.feed(body[cut:]) + rewriter.close()))
        assert [(c["name"], json.loads(c["arguments"])) for c in result["tool_calls"]] == [("get_weather", {"city": "a</tool_call>b"})], cut
        assert result["content"] == " after" and result["finish_reason"] == "tool_calls"


# -- upstream's own calls -----------------------------------------------------------------------


def chat_stream_with_upstream_call_then(text: str) -> bytes:
    native = {"index": 0, "id": "call_up", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return sse_body([
        {**base, "choices": [{"index": 0, "delta": {"tool_calls": [native]}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ])


def chat_context(**request) -> RequestContext:
    chat_tools = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in TOOLS]
    return RequestContext.from_body(json.dumps({"model": "m", "messages": [], "tools": chat_tools, **request}).encode())


def test_a_call_after_an_upstream_call_takes_the_next_index():
    rewriter = ChatStreamRewriter(chat_context())
    result = check_chat_stream(b"".join(rewriter.feed(chat_stream_with_upstream_call_then(CALL_PARIS)) + rewriter.close()))
    assert [(c["id"], c["name"]) for c in result["tool_calls"]][0] == ("call_up", "get_time")
    assert [c["name"] for c in result["tool_calls"]] == ["get_time", "get_weather"]


def test_parallel_false_counts_upstream_calls_too():
    rewriter = ChatStreamRewriter(chat_context(parallel_tool_calls=False))
    result = check_chat_stream(b"".join(rewriter.feed(chat_stream_with_upstream_call_then(CALL_PARIS)) + rewriter.close()))
    assert [c["name"] for c in result["tool_calls"]] == ["get_time"]
    assert result["content"] == CALL_PARIS

    events = responses_events("m", [CALL_PARIS], tools=TOOLS)
    native = {"id": "fc_up", "type": "function_call", "call_id": "call_up", "name": "get_time", "arguments": "{}", "status": "completed"}
    completed = events.pop()
    first_item = next(i for i, e in enumerate(events) if e["type"] == "response.output_item.added")
    events[first_item:first_item] = [
        {"type": "response.output_item.added", "output_index": 0, "item": {**native, "arguments": "", "status": "in_progress"}},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_up", "output_index": 0, "delta": "{}"},
        {"type": "response.function_call_arguments.done", "item_id": "fc_up", "output_index": 0, "name": "get_time", "arguments": "{}"},
        {"type": "response.output_item.done", "output_index": 0, "item": native},
    ]
    for e in events[first_item + 4 :]:
        if "output_index" in e:
            e["output_index"] = 1
    completed["response"]["output"].insert(0, native)
    result = check_responses_stream(rewrite(responses_sse([*events, completed]), ctx=context(parallel_tool_calls=False)))
    assert [c["call_id"] for c in result["calls"]] == ["call_up"]
    assert result["text"] == CALL_PARIS


def test_a_reasoning_item_announced_without_content_passes_byte_for_byte():
    events = responses_events("m", ["Hi."], reasoning_pieces=["Hmm."], tools=TOOLS)
    for e in events:
        if e["type"] == "response.output_item.added" and e["item"]["type"] == "reasoning":
            e["item"].pop("content", None)
    body = responses_sse(events)
    assert rewrite(body) == body


# -- shapes real upstreams send (found in review) -----------------------------------------------


def test_completed_output_with_fresh_ids_lists_the_streamed_items_once():
    """vLLM rebuilds response.completed with new msg_/rs_ ids."""
    for pieces in (["Hello", " there"], ["Let me check.", CALL_PARIS]):
        events = responses_events("m", pieces, tools=TOOLS)
        events[-1]["response"]["output"][0]["id"] = "msg_fresh"
        body = responses_sse(events)
        out = rewrite(body)
        if "<" not in "".join(pieces):
            assert out == body  # nothing to repair: the terminal event too stays as it came
        else:
            result = check_responses_stream(out)
            completed = events_of(out)[-1]["response"]["output"]
            assert [i["type"] for i in completed] == result["items"] == ["message", "function_call"]
            assert completed[1]["call_id"] == result["calls"][0]["call_id"]


def test_vllm_reasoning_part_events_pass_byte_for_byte_and_work_with_markup():
    for reasoning in (["think ", "more"], ["think ", CALL_UTC, " more"]):
        events = responses_events("m", ["Hi"], reasoning_pieces=reasoning, tools=TOOLS)
        for e in events:
            if e["type"].startswith("response.content_part") and e["item_id"] == "rs_test":
                e["type"] = e["type"].replace("content_part", "reasoning_part")
        body = responses_sse(events)
        out = rewrite(body)
        if "<" not in "".join(reasoning):
            assert out == body
        else:
            types = [e["type"] for e in events_of(out)]
            assert types.count("response.reasoning_part.added") == types.count("response.reasoning_part.done") == 2
            assert [e["item"]["type"] for e in events_of(out) if e["type"] == "response.output_item.done"] == [
                "reasoning", "function_call", "reasoning", "message"]


def test_empty_deltas_pass_as_they_came():
    body = stream(["Hel", "", "lo"], reasoning_pieces=["a", "", "b"])
    assert rewrite(body) == body


def test_a_call_cut_off_by_an_incomplete_response_is_not_completed():
    kimi = f"{SECTION_BEGIN}{CALL_BEGIN}functions.get_weather:0{ARG_BEGIN}" + '{"city": "Pa'
    events = responses_events("m", ["Hi ", kimi], tools=TOOLS)
    for e in events:
        if e["type"] == "response.output_item.done":
            e["item"]["status"] = "incomplete"
        if e["type"] == "response.completed":
            e["type"] = "response.incomplete"
            e["response"]["status"] = "incomplete"
    out = events_of(rewrite(responses_sse(events)))
    (call,) = [e["item"] for e in out if e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call"]
    assert call["status"] == "incomplete" and call["arguments"] == '{"city": "Pa'
    assert out[-1]["response"]["output"][-1]["status"] == "incomplete"


def test_tool_choice_none_leaves_kimi_markup_exactly_as_sent():
    kimi = f"A {SECTION_BEGIN}{CALL_BEGIN}functions.get_weather:0{ARG_BEGIN}" + '{"city": "Oslo"}' + f"{CALL_END}{SECTION_END} Z"
    body = stream([kimi[:20], kimi[20:]])
    assert rewrite(body, ctx=context(tool_choice="none")) == body
