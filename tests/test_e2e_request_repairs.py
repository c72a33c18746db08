"""Request repairs through a real mitmdump: the next turn gets what its backend needs.

The upstream here is a thinking backend's worst client: the OpenAI SDK used as LangChain and
opencode use it, keeping content and tool calls of an assistant turn and dropping its reasoning.
toolshim must put the reasoning back, exactly as the client was sent it, rewrite Kimi's ids and
leave requests to other models byte for byte.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from harness import Mitmdump, ScriptedUpstream, sse_body
from kimi import ARG_BEGIN, CALL_BEGIN, CALL_END, SECTION_BEGIN, SECTION_END, chunk, kimi_chunks
from responses import function_tool, responses_events, responses_sse

BASH = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}
KIMI_CALL = [SECTION_BEGIN, CALL_BEGIN, "functions.bash:0", ARG_BEGIN, '{"command": "ls"}', CALL_END, SECTION_END]


def first_turn(model: str, reasoning: str = "Let me look at the files.") -> list:
    """A Kimi thinking turn: reasoning with a call leaked at its end (mirrored fields)."""
    return kimi_chunks(model, [reasoning, *KIMI_CALL])


def final_turn(model: str) -> list:
    return [chunk(model, {"role": "assistant", "reasoning_content": "Done."}), chunk(model, {"content": "Two files."}, "stop")]


def stream_turn(client: openai.OpenAI, model: str, messages: list, **kwargs) -> dict:
    """One streamed turn, accumulated as a client that drops reasoning does: the assistant
    message it appends to the history has content and tool calls only."""
    text, calls = "", {}
    for event in client.chat.completions.create(model=model, messages=messages, tools=[BASH], stream=True, **kwargs):
        for choice in event.choices:
            text += choice.delta.content or ""
            for call in choice.delta.tool_calls or ():
                entry = calls.setdefault(call.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                entry["id"] += call.id or ""
                entry["function"]["name"] += call.function.name or ""
                entry["function"]["arguments"] += call.function.arguments or ""
    message = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def call_then_result(upstream, client, model: str) -> list:
    """Turn 1 (a Kimi call leaked in reasoning), streamed to a client that drops reasoning; the
    final turn scripted; the history the client sends next: its question, the call, a result."""
    upstream.add(model, chunks=[sse_body(first_turn(model))])
    history = [{"role": "user", "content": "List the files."}]
    assistant = stream_turn(client, model, history)
    upstream.add(model, chunks=[sse_body(final_turn(model))])
    return [*history, assistant, {"role": "tool", "tool_call_id": "functions.bash:0", "content": "a b"}]


def test_kimi_reasoning_comes_back_on_the_next_turn(upstream: ScriptedUpstream, openai_client, unique_model):
    model = f"kimi-k2-thinking-{unique_model}"
    history = call_then_result(upstream, openai_client, model)
    assistant = history[1]
    assert assistant["tool_calls"][0]["id"] == "functions.bash:0"
    assert "reasoning_content" not in assistant  # the client dropped it
    stream_turn(openai_client, model, history)

    sent = upstream.requests_for(model)[-1].json
    restored = sent["messages"][1]
    # Exactly what the client was sent: the reasoning without the markup, in both mirrored fields.
    assert restored["reasoning_content"] == "Let me look at the files."
    assert restored["reasoning"] == "Let me look at the files."
    assert restored["tool_calls"] == assistant["tool_calls"]
    assert sent["messages"][0] == history[0] and sent["messages"][2] == history[2]


@pytest.mark.parametrize("events_a_write", [1, 3, 8])
def test_a_turn_streamed_token_by_token_comes_back_whole(upstream: ScriptedUpstream, openai_client, unique_model, events_a_write):
    """Reasoning and a call's arguments in token-sized pieces, written one event at a time, three
    at a time (no burst: `stream.BURST_MIN_EVENTS`) and eight at a time (the reasoning's later
    reads pass by the quiet lane's burst, each noted as one piece with its bodies): the lanes
    send them and note what they sent, and remembering takes those notes instead of reading the
    events again (`NotedEvents`). The next turn gets the reasoning back whole, keyed by the
    arguments whole."""
    model = f"kimi-k2-thinking-{unique_model}"
    reasoning = "Let me look at the files in this directory before I change any of them."
    arguments = '{"command": "ls -la src tests docs"}'
    pieces = [reasoning[at : at + 3] for at in range(0, len(reasoning), 3)]
    pieces += [SECTION_BEGIN, CALL_BEGIN, "functions.bash:0", ARG_BEGIN, *(arguments[at : at + 2] for at in range(0, len(arguments), 2)), CALL_END, SECTION_END]
    events = [sse_body([event], done=False) for event in kimi_chunks(model, pieces)] + [b"data: [DONE]\n\n"]
    upstream.add(model, chunks=[b"".join(events[at : at + events_a_write]) for at in range(0, len(events), events_a_write)], delay=0.002)
    history = [{"role": "user", "content": "List the files."}]
    assistant = stream_turn(openai_client, model, history)
    assert assistant["tool_calls"][0]["function"]["arguments"] == arguments
    upstream.add(model, chunks=[sse_body(final_turn(model))])
    stream_turn(openai_client, model, [*history, assistant, {"role": "tool", "tool_call_id": "functions.bash:0", "content": "a b"}])

    restored = upstream.requests_for(model)[-1].json["messages"][1]
    assert restored["reasoning_content"] == restored["reasoning"] == reasoning
    assert restored["tool_calls"] == assistant["tool_calls"]


def test_reasoning_that_names_the_terminal_event_is_remembered_whole(upstream: ScriptedUpstream, openai_client, unique_model):
    """A model that writes `data: [DONE]` in its reasoning, before its call: remembering waits
    for the stream's own terminal event, so the call's reasoning is kept and comes back."""
    model = f"kimi-k2-thinking-{unique_model}"
    reasoning = "A stream ends with a line data: [DONE] and nothing after [DONE]. Let me look."
    # one event a read: the reasoning's read goes out before the call's
    upstream.add(model, chunks=[*(sse_body([event], done=False) for event in first_turn(model, reasoning)), b"data: [DONE]\n\n"], delay=0.02)
    history = [{"role": "user", "content": "List the files."}]
    assistant = stream_turn(openai_client, model, history)
    upstream.add(model, chunks=[sse_body(final_turn(model))])
    stream_turn(openai_client, model, [*history, assistant, {"role": "tool", "tool_call_id": "functions.bash:0", "content": "a b"}])
    restored = upstream.requests_for(model)[-1].json["messages"][1]
    assert restored["tool_calls"] == assistant["tool_calls"]
    assert restored["reasoning_content"] == reasoning


def test_a_second_pass_changes_nothing_and_a_complete_request_goes_byte_for_byte(upstream, proxy, openai_client, unique_model):
    model = f"kimi-k2-thinking-{unique_model}"
    history = call_then_result(upstream, openai_client, model)
    stream_turn(openai_client, model, history)
    repaired = upstream.requests_for(model)[-1].body

    # The repaired request, sent again by a client that kept everything: reaches upstream as it is.
    httpx.post(f"{proxy.base_url}/chat/completions", content=repaired, headers={"content-type": "application/json", "authorization": "Bearer test-key"}, timeout=30)
    assert upstream.requests_for(model)[-1].body == repaired


def test_unknown_models_are_passed_byte_for_byte(upstream, proxy, unique_model):
    """A model the backend table does not know: the history is odd on purpose (developer role,
    a call without a result, array tool content, a foreign id) and nothing is touched."""
    body = json.dumps(
        {
            "model": unique_model,
            "stream": True,
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "ok"}]},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_2", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
            ],
            "tools": [{**BASH, "function": {**BASH["function"], "strict": True}}],
            "parallel_tool_calls": False,
        },
        indent=1,  # odd spacing: a re-serialisation would show
    ).encode()
    upstream.add(unique_model, chunks=[sse_body(final_turn(unique_model))])
    httpx.post(f"{proxy.base_url}/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=30)
    assert upstream.requests_for(unique_model)[-1].body == body


def test_kimi_history_ids_and_hygiene(upstream, proxy, unique_model):
    """Foreign ids become functions.NAME:IDX in calls and results alike (numbered in order of
    appearance; a taken number is skipped), an orphan call gets a result, tool parts flatten."""
    model = f"Kimi-K2.5-{unique_model}"
    messages = [
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": None, "reasoning_content": "r1", "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "bash", "arguments": "{}"}},
            {"id": "functions.read:1", "type": "function", "function": {"name": "read", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "call_a", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]},
        {"role": "tool", "tool_call_id": "functions.read:1", "content": "z"},
        {"role": "assistant", "content": None, "reasoning_content": "r2", "tool_calls": [
            {"id": "toolu_01", "type": "function", "function": {"name": "grep", "arguments": "{}"}},
            {"id": "call_c", "type": "function", "function": {"name": "bash", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "toolu_01", "content": "found"},
        {"role": "user", "content": "And?"},
    ]
    upstream.add(model, chunks=[sse_body(final_turn(model))])
    httpx.post(f"{proxy.base_url}/chat/completions", json={"model": model, "messages": messages, "stream": True}, timeout=30)
    sent = upstream.requests_for(model)[-1].json["messages"]
    assert [c["id"] for c in sent[1]["tool_calls"]] == ["functions.bash:0", "functions.read:1"]
    assert sent[2] == {"role": "tool", "tool_call_id": "functions.bash:0", "content": "x\ny"}
    assert sent[3]["tool_call_id"] == "functions.read:1"
    assert [c["id"] for c in sent[4]["tool_calls"]] == ["functions.grep:2", "functions.bash:3"]
    assert sent[5]["tool_call_id"] == "functions.grep:2"
    assert sent[6] == {"role": "tool", "tool_call_id": "functions.bash:3", "content": "no result was returned"}
    assert sent[7] == {"role": "user", "content": "And?"}


def test_the_flow_says_what_was_repaired(upstream, unique_model, tmp_path):
    """metadata, comment, the original request and the counters of the shutdown line."""
    model = f"kimi-k2-{unique_model}"
    saved = tmp_path / "out.flow"
    with Mitmdump(upstream.url, extra_args=["-w", str(saved)]) as proxy:
        upstream.add(model, chunks=[sse_body(final_turn(model))])
        body = {"model": model, "stream": True, "messages": [
            {"role": "user", "content": "Go."},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_a", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": "ok"},
        ]}
        httpx.post(f"{proxy.base_url}/chat/completions", json=body, timeout=30)
    log = proxy.log_text()
    assert "requests: 1 repaired (kimi_ids 2)" in log and "reasoning not known 1" in log
    from mitmproxy import io

    with saved.open("rb") as f:
        [flow] = list(io.FlowReader(f).stream())
    info = flow.metadata["toolshim"]["request"]
    assert info["repairs"] == [
        {"repair": "kimi_ids", "at": "messages[1].tool_calls[0]", "id": "functions.bash:0"},
        {"repair": "kimi_ids", "at": "messages[2].tool_call_id", "id": "functions.bash:0"},
    ]
    assert info["reasoning_missing"] == ["messages[1]"]
    assert json.loads(info["original"]) == body
    assert "toolshim: request: Kimi ids ×2 · reasoning not known ×1" in flow.comment


@pytest.mark.parametrize("option", ["off", "auto,-reasoning"])
def test_the_option_turns_repairs_off(upstream, openai_client, unique_model, option):
    model = f"kimi-k2-thinking-{unique_model}"
    with Mitmdump(upstream.url, extra_args=["--set", f"toolshim_request_repairs={option}"]) as proxy:
        client = openai.OpenAI(base_url=proxy.base_url, api_key="test-key", max_retries=0)
        stream_turn(client, model, call_then_result(upstream, client, model))
    assert "reasoning_content" not in upstream.requests_for(model)[-1].json["messages"][1]


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("toolshim_request_repairs", "auto,kimi-ids", "toolshim_request_repairs: unknown term 'kimi-ids'"),
        ("toolshim_state", "memcached://127.0.0.1:1", "is not a redis:// or rediss:// URL"),
        ("toolshim_state", "redis://:hunter2@127.0.0.1:1/notanumber", "toolshim_state: 'redis://\\*\\*\\*@127.0.0.1:1/notanumber'"),
        ("toolshim_state_timeout", 0, "toolshim_state_timeout must be at least 1"),
    ],
)
def test_invalid_options_are_refused_with_a_clear_error(option, value, message):
    from mitmproxy import exceptions
    from mitmproxy.test import taddons
    from toolshim.addon import ToolShim

    addon = ToolShim()
    with taddons.context(addon) as tctx:
        with pytest.raises(exceptions.OptionsError, match=message) as raised:
            tctx.configure(addon, **{option: value})
    assert "hunter2" not in str(raised.value)


def test_another_credential_gets_nothing_of_this_conversation(upstream, proxy, openai_client, unique_model):
    """The same Kimi id, name, arguments and first message under another API key: no reasoning
    crosses over (a multi-user proxy must not hand one user's reasoning to another)."""
    model = f"kimi-k2-thinking-{unique_model}"
    history = call_then_result(upstream, openai_client, model)
    other = openai.OpenAI(base_url=proxy.base_url, api_key="another-key", max_retries=0)
    stream_turn(other, model, history)
    assert "reasoning_content" not in upstream.requests_for(model)[-1].json["messages"][1]
    stream_turn(openai_client, model, history)
    assert upstream.requests_for(model)[-1].json["messages"][1]["reasoning_content"] == "Let me look at the files."


def test_non_streamed_answers_are_remembered_too(upstream, openai_client, unique_model):
    model = f"deepseek-v4-{unique_model}"
    message = {"role": "assistant", "content": "Checking.", "reasoning_content": "I need ls.",
               "tool_calls": [{"id": "call_x1", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}]}
    upstream.add_json(model, {"id": "c1", "object": "chat.completion", "created": 1, "model": model,
                              "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]})
    history = [{"role": "user", "content": "Files?"}]
    answer = openai_client.chat.completions.create(model=model, messages=history, tools=[BASH])
    call = answer.choices[0].message.tool_calls[0]
    upstream.add(model, chunks=[sse_body(final_turn(model))])
    # LangChain re-serialises the arguments: other spacing, same JSON.
    history += [{"role": "assistant", "content": "Checking.", "tool_calls": [{"id": call.id, "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
                {"role": "tool", "tool_call_id": call.id, "content": "a"}]
    stream_turn(openai_client, model, history)
    sent = upstream.requests_for(model)[-1].json["messages"]
    assert sent[1]["reasoning_content"] == "I need ls."
    # DeepSeek takes other ids as they are, and wants reasoning on answers without calls too.
    assert sent[1]["tool_calls"][0]["id"] == "call_x1"


def test_deepseek_answers_without_calls_get_their_reasoning_back(upstream, openai_client, unique_model):
    model = f"deepseek-reasoner-{unique_model}"
    upstream.add(model, chunks=[sse_body(final_turn(model))])
    history = [{"role": "user", "content": "Hi"}]
    assistant = stream_turn(openai_client, model, history)
    assert assistant["content"] == "Two files."
    history += [assistant, {"role": "user", "content": "More?"}]
    stream_turn(openai_client, model, history)
    assert upstream.requests_for(model)[-1].json["messages"][1]["reasoning_content"] == "Done."


def test_responses_reasoning_items_come_back(upstream, openai_client, unique_model):
    """Responses API: the reasoning item the client was sent (markup removed) goes back before
    the function_call the client returned without it."""
    model = f"kimi-k2-thinking-{unique_model}"
    tools = [function_tool("bash", {"type": "object", "properties": {"command": {"type": "string"}}})]
    events = responses_events(model, [], reasoning_pieces=["Let me look.", *KIMI_CALL], tools=tools)
    upstream.add(model, chunks=[responses_sse(events)])
    with openai_client.responses.stream(model=model, input="List the files.", tools=tools) as stream:
        output = stream.get_final_response().output
    kinds = [item.type for item in output]
    assert kinds == ["reasoning", "function_call"]
    call = output[1]
    upstream.add(model, chunks=[responses_sse(responses_events(model, ["Two files."], tools=tools))])
    history = [
        {"role": "user", "content": "List the files."},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "a b"},
    ]
    with openai_client.responses.stream(model=model, input=history, tools=tools) as stream:
        stream.get_final_response()
    sent = upstream.requests_for(model)[-1].json["input"]
    assert [item.get("type", "message") for item in sent] == ["message", "reasoning", "function_call", "function_call_output"]
    assert sent[1] == output[0].model_dump(exclude_none=True) | {"content": [{"type": "reasoning_text", "text": "Let me look."}]}


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "kimi-k2", "messages": [',  # not JSON
        b'{"model": "kimi-k2", "messages": [{"role": "user", "content": "\xff\xfe"}]}',  # not UTF-8
        b'["kimi-k2"]',  # JSON, not an object
        b'{"model": "kimi-k2", "messages": "not a list", "input": 7}',
    ],
)
def test_unreadable_requests_pass_untouched_without_an_addon_error(upstream, proxy, unique_model, body):
    upstream.add("/v1/chat/completions", chunks=[sse_body(final_turn("kimi-k2"))])
    seen_lines = len(proxy.log_lines())
    httpx.post(f"{proxy.base_url}/chat/completions", content=body, headers={"content-type": "application/json", "x-test": unique_model}, timeout=30)
    [seen] = [r for r in upstream.requests if r.headers.get("x-test") == unique_model]
    assert seen.body == body
    new_lines = "\n".join(proxy.log_lines()[seen_lines:])
    assert "Traceback" not in new_lines and "failed" not in new_lines and "Error" not in new_lines


def test_ten_megabytes_of_history_with_odd_roles_and_colliding_ids(upstream, proxy, unique_model):
    """Every 50th turn has a foreign id, some ids collide with Kimi numbers already taken, roles
    the API does not know pass as they are; nothing is lost."""
    model = f"kimi-k2-{unique_model}"
    filler = "x" * 5000
    messages = [{"role": "user", "content": "Go."}]
    for n in range(2000):
        call_id = f"call_{n}" if n % 50 == 0 else f"functions.bash:{n + 1}"
        messages += [
            {"role": "assistant", "content": None, "reasoning_content": filler[:100], "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call_id, "content": filler},
        ]
    messages.append({"role": "narrator", "content": "an unknown role"})
    body = json.dumps({"model": model, "messages": messages, "stream": True}).encode()
    assert len(body) > 10_000_000
    upstream.add(model, chunks=[sse_body(final_turn(model))])
    httpx.post(f"{proxy.base_url}/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=60)
    sent = upstream.requests_for(model)[-1].json["messages"]
    assert len(sent) == len(messages) and sent[-1] == messages[-1]
    ids = [m["tool_calls"][0]["id"] for m in sent if m["role"] == "assistant"]
    assert len(set(ids)) == len(ids) and all(i.startswith("functions.bash:") for i in ids)
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == ids
    assert ids[0] == "functions.bash:0" and ids[50] == "functions.bash:2001"  # 50 is taken by an original id
    assert all(m.get("content") == filler for m in sent if m["role"] == "tool")


def test_captured_requests_read_offline_are_never_changed():
    """`mitmdump -nr`: the flow's request is history; a Kimi request with foreign ids and a
    developer message stays as it was captured, while a live one is repaired."""
    from mitmproxy.test import taddons, tflow, tutils
    from toolshim.addon import ToolShim

    body = json.dumps({"model": "kimi-k2", "messages": [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    ]}).encode()
    addon = ToolShim()
    with taddons.context(addon):
        for live in (False, True):
            flow = tflow.tflow(req=tutils.treq(method=b"POST", path=b"/v1/chat/completions", content=body), live=live)
            addon.requestheaders(flow)
            addon.request(flow)
            assert (flow.request.content == body) is (not live)
