"""The scripted thinking backend on its own (no proxy, no client): its checks refuse exactly what
Moonshot and DeepSeek refuse, and its answers are well-formed streams with the markup in the
channel each turn promises."""

from __future__ import annotations

import httpx
import pytest
from harness import ScriptedUpstream
from thinking_backend import (
    DEEPSEEK_MISSING,
    FINAL_ANSWER,
    REASONING,
    ThinkingBackend,
    check_chat,
    check_responses,
    flavour_of,
    pick_tool,
)
from wire import check_chat_stream, check_responses_stream

SHELL = {
    "type": "function",
    "function": {
        "name": "run_shell",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}
READ = {"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
USER = {"role": "user", "content": "Run the two checks."}


def call(call_id: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": "run_shell", "arguments": '{"command": "echo x"}'}}


def assistant(call_id: str | None, reasoning: str | None) -> dict:
    message: dict = {"role": "assistant", "content": None}
    if call_id is not None:
        message["tool_calls"] = [call(call_id)]
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def result(call_id: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": "x"}


def test_flavour_by_model_name():
    assert flavour_of("kimi-k2-thinking-turbo") == "moonshot"
    assert flavour_of("deepseek-v4-pro") == "deepseek"
    assert flavour_of("deepseek-reasoner-x") == "deepseek"
    with pytest.raises(ValueError):
        flavour_of("gpt-4o")


def test_moonshot_wants_reasoning_on_tool_call_turns_only():
    ok = [USER, assistant("functions.run_shell:0", "thinking"), result("functions.run_shell:0"), assistant(None, None)]
    assert check_chat(ok, "moonshot") is None
    missing = [{"role": "system", "content": "s"}, USER, assistant("functions.run_shell:0", ""), result("functions.run_shell:0")]
    assert check_chat(missing, "moonshot") == (
        "thinking is enabled but reasoning_content is missing in assistant tool call message at index 2"
    )


def test_moonshot_wants_kimi_ids_on_calls_and_results():
    minted = [USER, assistant("call_abc", "thinking"), result("call_abc")]
    assert check_chat(minted, "moonshot") == (
        "tool call id 'call_abc' at messages[1] is not of the form functions.NAME:IDX"
    )
    result_only = [USER, assistant("functions.run_shell:0", "thinking"), result("call_abc")]
    assert check_chat(result_only, "moonshot") == (
        "tool call id 'call_abc' at messages[2] is not of the form functions.NAME:IDX"
    )


def test_deepseek_wants_reasoning_on_every_assistant_turn_and_not_kimi_ids():
    ok = [USER, assistant("call_abc", "thinking"), result("call_abc"), assistant(None, "more")]
    assert check_chat(ok, "deepseek") is None
    assert check_chat([USER, assistant(None, None), USER], "deepseek") == DEEPSEEK_MISSING
    assert check_chat([USER, assistant("call_abc", None), result("call_abc")], "deepseek") == DEEPSEEK_MISSING


def responses_call(call_id: str) -> dict:
    return {"type": "function_call", "name": "exec_command", "arguments": "{}", "call_id": call_id}


def reasoning_item(text: str, where: str = "content") -> dict:
    item = {"type": "reasoning", "summary": [], "content": []}
    item[where] = [{"type": "reasoning_text" if where == "content" else "summary_text", "text": text}]
    return item


def output(call_id: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": "x"}


def test_responses_checks():
    kimi = "functions.exec_command:0"
    user = {"type": "message", "role": "user", "content": "go"}
    assert check_responses([user, reasoning_item("t"), responses_call(kimi), output(kimi)], "moonshot") is None
    assert check_responses([user, reasoning_item("t", "summary"), responses_call(kimi), output(kimi)], "moonshot") is None
    # Reasoning of an earlier step does not cover the next call.
    history = [user, reasoning_item("t"), responses_call(kimi), output(kimi), responses_call("functions.exec_command:1")]
    assert check_responses(history, "moonshot") == (
        "thinking is enabled but reasoning_content is missing in assistant tool call message at index 4"
    )
    assert check_responses([user, reasoning_item(""), responses_call(kimi)], "moonshot") is not None
    assert check_responses([user, reasoning_item("t"), responses_call("call_x"), output("call_x")], "moonshot") == (
        "tool call id 'call_x' at input[2] is not of the form functions.NAME:IDX"
    )
    assert check_responses("a plain string input", "moonshot") is None


def test_pick_tool_prefers_the_shell():
    choice = pick_tool([READ, SHELL])
    assert (choice.name, choice.arg, choice.array) == ("run_shell", "command", False)
    codex = [
        {"type": "web_search"},
        {"type": "function", "name": "view_image", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}},
        {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}, "workdir": {"type": "string"}}}},
    ]
    assert pick_tool(codex).name == "exec_command" and pick_tool(codex).arg == "cmd"
    argv = [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {"command": {"type": "array"}}}}]
    assert pick_tool(argv).arguments(1) == {"command": ["bash", "-lc", "echo toolshim-step-1"]}
    assert pick_tool([]) is None


def post(upstream: ScriptedUpstream, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{upstream.url}{path}", json=body, headers={"authorization": "Bearer test-key"}, timeout=10)


@pytest.fixture
def backend(upstream: ScriptedUpstream, unique_model: str):
    model = f"kimi-k2-thinking-{unique_model}"
    yield ThinkingBackend(model).register(upstream)
    upstream.remove(model)


def test_chat_turns_leak_kimi_then_hermes_then_answer(upstream, backend):
    messages = [USER]
    body = {"model": backend.model, "messages": messages, "tools": [READ, SHELL], "stream": True,
            "stream_options": {"include_usage": True}}
    first = check_chat_stream(post(upstream, "/v1/chat/completions", body).content)
    assert first["reasoning_content"].startswith(REASONING[0])
    assert first["reasoning_content"].endswith(
        '<|tool_calls_section_begin|> <|tool_call_begin|> functions.run_shell:0 <|tool_call_argument_begin|>'
        '{"command": "echo toolshim-step-1"} <|tool_call_end|> <|tool_calls_section_end|>'
    )
    assert first["content"] == "" and first["finish_reason"] == "stop" and first["usage"] is not None

    messages += [assistant("functions.run_shell:0", REASONING[0]), result("functions.run_shell:0")]
    second = check_chat_stream(post(upstream, "/v1/chat/completions", body).content)
    assert second["reasoning_content"] == REASONING[1]
    assert second["content"].endswith(
        '<tool_call>\n{"name": "run_shell", "arguments": {"command": "echo toolshim-step-2"}}\n</tool_call>'
    )

    messages += [assistant("functions.run_shell:1", REASONING[1]), result("functions.run_shell:1")]
    third = post(upstream, "/v1/chat/completions", {**body, "stream": False}).json()
    message = third["choices"][0]["message"]
    assert message["content"] == FINAL_ANSWER and message["reasoning_content"] == REASONING[2]
    assert [(e.turn, e.status, e.stream) for e in backend.exchanges] == [(1, 200, True), (2, 200, True), (3, 200, False)]


def test_chat_refusal_is_the_real_error_body(upstream, backend):
    body = {"model": backend.model, "messages": [USER, assistant("functions.run_shell:0", None), result("functions.run_shell:0")]}
    response = post(upstream, "/v1/chat/completions", body)
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "message": "thinking is enabled but reasoning_content is missing in assistant tool call message at index 1",
            "type": "invalid_request_error",
        }
    }
    assert backend.errors == [response.json()["error"]["message"]]


def test_responses_turns(upstream, backend):
    tools = [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}
    body = {"model": backend.model, "input": [user], "tools": tools, "stream": True}
    first = check_responses_stream(post(upstream, "/v1/responses", body).content)
    assert first["items"] == ["reasoning"] and first["status"] == "completed"
    assert "functions.exec_command:0 <|tool_call_argument_begin|>" in first["reasoning"]

    kimi = "functions.exec_command:0"
    body["input"] = [user, reasoning_item(REASONING[0]), responses_call(kimi), output(kimi)]
    second = check_responses_stream(post(upstream, "/v1/responses", body).content)
    assert second["items"] == ["reasoning", "message"] and "<tool_call>" in second["text"]

    body["input"] += [reasoning_item(REASONING[1]), responses_call("functions.exec_command:1"), output("functions.exec_command:1")]
    third = check_responses_stream(post(upstream, "/v1/responses", body).content)
    assert third["text"] == FINAL_ANSWER and third["reasoning"] == REASONING[2]
    assert [e.turn for e in backend.exchanges] == [1, 2, 3]
