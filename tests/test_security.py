"""Security: what the addon writes never holds the client's credentials, and markup that is no
call stays text.

1. Secrets. Requests carry `Authorization: Bearer …`, `api-key` and `x-api-key` headers, a key in
   the query string, and the same secrets in body fields the addon has no use for (`user`,
   `metadata`, an `api_key` field, a message). Through a real mitmdump at debug verbosity with
   `-w`, covering every path that writes something: a rewrite (the original upstream body kept in
   the metadata), notes about markup that stayed text, a failing rewrite (fail-open warning with
   its traceback), an unreadable request body, a buffered JSON answer, the Responses API, and
   tool emulation (its log lines and `emulated` telemetry). What the addon wrote is read three
   ways: the records of its `toolshim` loggers (captured by tests/log_capture.py, tracebacks
   included), mitmdump's output lines that come from it (they start with `toolshim`), and the
   saved flows' `flow.metadata["toolshim"]` and `flow.comment`. mitmproxy's own output is not the
   addon's: it is kept apart (at flow_detail=0 it prints no headers, but that is mitmproxy's
   business, not asserted here).

2. False-positive guards (core, all dialects on): markup quoted in JSON strings in prose,
   look-alike tags, and examples in code fences that are incomplete or name no declared tool
   stay text, exactly. Already covered elsewhere: prose explaining the syntax with an example in
   a fence (flows/look_alike_prose_stays_text), undeclared tools (flows/
   kimi_undeclared_tool_stays_text, flows/sentinel_chat_undeclared_tool_stays_text, the peer
   samples). The documented limit (README, "Known limits of the dialects": a complete example
   naming a declared tool becomes a call, only structure is checked) is asserted as it is, so a
   change is noticed.
"""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import Mitmdump, Script, ScriptedUpstream, chat_completion, read_flows, sse_body
from kimi import chunk
from responses import responses_events, responses_sse
from toolshim.chat import ChatStreamRewriter, rewrite_chat_completion
from toolshim.tools import RequestContext
from wire import check_chat_stream

LOG_CAPTURE = Path(__file__).with_name("log_capture.py")

SECRETS = {
    "authorization": "sk-SECRET-authorization-4f1d9c",
    "api-key": "SECRET-api-key-header-77a02e",
    "x-api-key": "SECRET-x-api-key-header-19bd33",
    "query": "SECRET-query-key-5e6a10",
    "body": "sk-SECRET-body-field-c3b8e2",
}
HEADERS = {
    "Authorization": f"Bearer {SECRETS['authorization']}",
    "api-key": SECRETS["api-key"],
    "x-api-key": SECRETS["x-api-key"],
    "content-type": "application/json",
}
# Fields the addon has no use for, each holding a secret.
IRRELEVANT = {"user": SECRETS["body"], "metadata": {"api_key": SECRETS["body"]}, "api_key": SECRETS["body"]}
TOOL = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}
RESPONSES_TOOL = {"type": "function", "name": "bash", "parameters": TOOL["function"]["parameters"], "strict": False}
KIMI_CALL = "<|tool_calls_section_begin|><|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>{\"command\": \"ls\"}<|tool_call_end|><|tool_calls_section_end|>"
UNDECLARED = '<tool_call>{"name": "exfiltrate", "arguments": {"token": "x"}}</tool_call>'
HERMES_CALL = 'Listing.<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
SSE = (("content-type", "text/event-stream"),)


def chat_stream_script(model: str, text: str, **script: Any) -> Script:
    body = sse_body([chunk(model, {"role": "assistant", "content": ""}), *(chunk(model, {"content": text[i : i + 11]}) for i in range(0, len(text), 11)), chunk(model, {}, "stop")])
    return Script(headers=SSE, chunks=(body,), **script)


def post(proxy: Mitmdump, path: str, body: bytes) -> bytes:
    request = urllib.request.Request(proxy.url + path, data=body, headers=HEADERS, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.read()
    except urllib.error.HTTPError as err:
        return err.read()


def chat_request(model: str, **extra: Any) -> bytes:
    messages = [{"role": "user", "content": f"list the files; my key is {SECRETS['body']}"}]
    return json.dumps({"model": model, "messages": messages, "tools": [TOOL], "stream": True, **IRRELEVANT, **extra}).encode()


@pytest.fixture(scope="module")
def written(upstream: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Every request below through one mitmdump; what the addon wrote, and what it forwarded."""
    tmp = tmp_path_factory.mktemp("security")
    capture, flow_file = tmp / "records.jsonl", tmp / "flows.flow"
    models = {
        "rewritten": "sec-kimi-rewritten",
        "undeclared": "sec-undeclared-tool",
        "broken_gzip": "sec-broken-gzip",
        "buffered": "sec-buffered-json",
        "responses": "sec-responses",
        "emulated_chat": "textonly-sec-chat",
        "emulated_responses": "textonly-sec-responses",
    }
    upstream.add_responder(models["rewritten"], lambda r: chat_stream_script(models["rewritten"], "Let me look. " + KIMI_CALL))
    upstream.add_responder(models["undeclared"], lambda r: chat_stream_script(models["undeclared"], "Sending. " + UNDECLARED))
    # claims gzip, sends plain text: decoding fails mid-stream, the rewrite fails open
    upstream.add(models["broken_gzip"], headers={"content-type": "text/event-stream", "content-encoding": "gzip"},
                 chunks=[gzip.compress(b"data: {}\n\n")[:12], b"this is not gzip at all\n\n"], delay=0.05)
    upstream.add_json(models["buffered"], chat_completion(models["buffered"], content=HERMES_CALL))
    upstream.add(models["responses"], headers=dict(SSE), chunks=[responses_sse(responses_events(models["responses"], [HERMES_CALL[:9], HERMES_CALL[9:]], tools=[RESPONSES_TOOL]))])
    upstream.add_responder(models["emulated_chat"], lambda r: chat_stream_script(models["emulated_chat"], HERMES_CALL))
    upstream.add(models["emulated_responses"], headers=dict(SSE), chunks=[responses_sse(responses_events(models["emulated_responses"], [HERMES_CALL], tools=[RESPONSES_TOOL]))])
    unreadable_path = "/security/v1/chat/completions"
    upstream.add(unreadable_path, headers=dict(SSE), chunks=[sse_body([chunk("x", {"content": "hi"}, "stop")])])

    history = [
        {"role": "user", "content": f"run it with {SECRETS['body']}"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": SECRETS["body"]})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": f"<tool_call>token={SECRETS['body']}</tool_call>"},
    ]
    args = ["-s", str(LOG_CAPTURE), "--set", "termlog_verbosity=debug", "--set", "toolshim_emulate=^textonly-", "-w", str(flow_file)]
    with Mitmdump(upstream.url, extra_args=args, env={"TOOLSHIM_LOG_CAPTURE": str(capture)}) as proxy:
        query = f"?api-key={SECRETS['query']}&key={SECRETS['query']}"
        answers = {
            "rewritten": post(proxy, "/v1/chat/completions" + query, chat_request(models["rewritten"])),
            "undeclared": post(proxy, "/v1/chat/completions" + query, chat_request(models["undeclared"])),
            "broken_gzip": post(proxy, "/v1/chat/completions" + query, chat_request(models["broken_gzip"])),
            "buffered": post(proxy, "/v1/chat/completions" + query, chat_request(models["buffered"], stream=False)),
            "responses": post(proxy, "/v1/responses" + query, json.dumps({"model": models["responses"], "input": SECRETS["body"], "tools": [RESPONSES_TOOL], "stream": True, **IRRELEVANT}).encode()),
            "unreadable": post(proxy, unreadable_path + query, b'{"model": "x", "api_key": "' + SECRETS["body"].encode() + b'", broken'),
            "emulated_chat": post(proxy, "/v1/chat/completions" + query, json.dumps({"model": models["emulated_chat"], "messages": history, "tools": [TOOL], "stream": True, **IRRELEVANT}).encode()),
            "emulated_responses": post(proxy, "/v1/responses" + query, json.dumps({
                "model": models["emulated_responses"], "tools": [RESPONSES_TOOL], "stream": True, **IRRELEVANT,
                "input": [{"role": "user", "content": SECRETS["body"]}, {"type": "function_call", "call_id": "call_2", "name": "bash", "arguments": json.dumps({"command": SECRETS["body"]})},
                          {"type": "function_call_output", "call_id": "call_2", "output": SECRETS["body"]}],
            }).encode()),
        }
        proxy.stop()  # flushes the flow file, and logs the session's summary
        output = proxy.log_lines()
    records = [json.loads(line) for line in capture.read_text(encoding="utf-8").splitlines()]
    flows = {_model_of(fl): fl for fl in read_flows(flow_file)}
    yield {"models": models, "answers": answers, "records": records, "output": output, "flows": flows, "upstream": upstream}


def _model_of(flow) -> str:
    try:
        return flow.request.json()["model"]
    except ValueError:
        return "unreadable"


def leaked(text: str) -> list[str]:
    return [name for name, secret in SECRETS.items() if secret in text]


def as_text(value: Any) -> str:
    """Everything in a metadata value, bytes decoded, as one string to search."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return " ".join(as_text(k) + " " + as_text(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return " ".join(as_text(v) for v in value)
    return str(value)


def test_the_secrets_reached_the_proxy_and_went_upstream(written):
    """The premise: the proxy saw every secret (else the assertions below prove nothing)."""
    sent = written["upstream"].requests_for(written["models"]["rewritten"])[-1]
    assert sent.headers["authorization"] == f"Bearer {SECRETS['authorization']}"
    assert sent.headers["api-key"] == SECRETS["api-key"] and sent.headers["x-api-key"] == SECRETS["x-api-key"]
    assert SECRETS["query"] in sent.path and SECRETS["body"] in sent.body.decode()


def test_every_path_that_writes_something_was_taken(written):
    records, flows, models = written["records"], written["flows"], written["models"]
    messages = "\n".join(r["message"] for r in records)
    assert "names no declared tool" in messages or "exfiltrate" in messages  # a note on markup left as text
    assert any(r["level"] == "WARNING" and "failed" in r["message"] and r["traceback"] for r in records)  # fail-open, with traceback
    assert "could not read the request body" in messages
    assert "emulating tools for" in messages and "emulated tools for" in messages
    meta = {name: flows[model].metadata.get("toolshim", {}) for name, model in models.items()}
    assert meta["rewritten"]["calls"] == 1 and meta["rewritten"]["upstream"]  # the original body kept
    assert meta["undeclared"]["problems"] and meta["broken_gzip"]["failed"] is True
    assert meta["buffered"]["upstream"] and meta["responses"]["calls"] == 1
    assert meta["emulated_chat"]["emulated"]["neutralised"] >= 1 and meta["emulated_responses"]["emulated"]
    assert all(flows[model].comment for model in models.values())
    assert json.loads(check_chat_stream(written["answers"]["rewritten"])["tool_calls"][0]["arguments"]) == {"command": "ls"}


def test_the_addon_log_holds_no_secret(written):
    for record in written["records"]:
        assert record["logger"].startswith("toolshim")
        assert not leaked(record["message"] + record["traceback"]), record
    # the same lines as mitmdump printed them (and traceback lines, which follow a warning)
    addon_lines = [line for line in written["output"] if line.partition("] ")[2].startswith("toolshim") or line.startswith(("Traceback", "  ", "toolshim"))]
    assert addon_lines
    for line in addon_lines:
        assert not leaked(line), line


def test_flow_metadata_and_comments_hold_no_secret(written):
    for name, flow in written["flows"].items():
        meta = flow.metadata.get("toolshim")
        assert meta is not None or name == "unreadable", name
        assert not leaked(as_text(meta)), (name, leaked(as_text(meta)))
        assert not leaked(flow.comment or ""), name


# -- false-positive guards -------------------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {"command": {"type": "string"}, "path": {"type": "string"}}}}}
    for name in ("bash", "read_file")
]
MODELS = (
    "some-unknown-model", "qwen3-coder-30b", "kimi-k2.5", "deepseek-v3.1", "mistral-large", "Llama-3.3-70B-Instruct", "glm-4.6", "MiniMax-M2",
    "gpt-oss-120b", "granite-3.3-8b-instruct", "NVIDIA-Nemotron-Nano-9B-v2", "command-a-03-2025",
)


def through_chat(text: str, model: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """`text` as a streamed answer (in 7-character events) and as a buffered one."""
    context = lambda: RequestContext.from_body(json.dumps({"model": model, "messages": [], "tools": TOOLS}).encode())  # noqa: E731
    pieces = [text[i : i + 7] for i in range(0, len(text), 7)]
    body = sse_body([chunk(model, {"role": "assistant", "content": ""}), *(chunk(model, {"content": p}) for p in pieces), chunk(model, {}, "stop")])
    rewriter = ChatStreamRewriter(context())
    streamed = check_chat_stream(b"".join(rewriter.feed(body) + rewriter.close()))
    assert rewriter.failure is None
    completion = chat_completion(model, content=text)
    rewrite_chat_completion(completion, context())
    return streamed, completion["choices"][0]["message"]


def assert_text(text: str, model: str) -> None:
    streamed, message = through_chat(text, model)
    assert streamed["tool_calls"] == [] and streamed["content"] == text and streamed["finish_reason"] == "stop"
    assert not message.get("tool_calls") and message["content"] == text


QUOTED_IN_JSON_STRINGS = [
    'The tag is written as "<tool_call>" and closed with "</tool_call>".',
    'Template: {"start": "<tool_call>", "end": "</tool_call>"}.',
    'In JSON: "<tool_call>{\\"name\\": \\"bash\\", \\"arguments\\": {}}</tool_call>" is what Hermes prints.',
    # found by this test: json_repair unescaped the quoted block into a call to bash
    'Escaped: {"example": "<tool_call>{\\"name\\": \\"bash\\", \\"arguments\\": {\\"command\\": \\"ls\\"}}</tool_call>"}',
    'A list: "<tool_call>[{\\"name\\": \\"read_file\\", \\"arguments\\": {\\"path\\": \\"/etc/passwd\\"}}]</tool_call>"',
    'Llama: "<function=bash>{\\"command\\": \\"ls\\"}</function>"',
    'Mistral: "[TOOL_CALLS]bash[ARGS]{\\"command\\": \\"ls\\"}"',
    'Mistral v3: "[TOOL_CALLS][{\\"name\\": \\"bash\\", \\"arguments\\": {}}]"',
    'Granite: "<|tool_call|>[{\\"name\\": \\"bash\\", \\"arguments\\": {}}]"',
    'Nemotron: "<TOOLCALL>[{\\"name\\": \\"bash\\", \\"arguments\\": {}}]</TOOLCALL>"',
    'Command: "<|START_ACTION|>[{\\"tool_name\\": \\"bash\\", \\"parameters\\": {}}]<|END_ACTION|>"',
]
LOOK_ALIKES = [
    '<tool_calls>{"name": "bash", "arguments": {}}</tool_calls>',
    '<tool-call>{"name": "bash", "arguments": {}}</tool-call>',  # what emulation neutralises tags to
    '<toolcall>{"name": "bash", "arguments": {}}</toolcall>',
    '<TOOL_CALL>{"name": "bash", "arguments": {}}</TOOL_CALL>',
    '< tool_call>{"name": "bash", "arguments": {}}</ tool_call>',
    "the <|tool_call_begin| token, then functions.bash:0 and <|tool_call_argument_begin| {} close it",
    "<|tool_call_begin |>functions.bash:0<|tool_call_argument_begin |>{}<|tool_call_end |>",
    '<function =bash>{"command": "ls"}</function>',
    '<functions=bash>{"command": "ls"}</functions>',
    '[tool_calls]bash[args]{"command": "ls"}',
    '[TOOL_CALLS ]bash[ARGS]{"command": "ls"}',
    '<|tool▁calls▁begin|><|tool▁call▁begin|>bash<|tool▁sep|>{"command": "ls"}<|tool▁call▁end|>',  # ASCII bars
    '<minimax:toolcall><invoke name="bash"><parameter name="command">ls</parameter></invoke></minimax:toolcall>',
    "<arg_key>command</arg_key><arg_value>ls</arg_value>",
    '<|tool_call |>[{"name": "bash", "arguments": {}}]',
    '<|tool_calls|>[{"name": "bash", "arguments": {}}]',
    '<toolcall>[{"name": "bash", "arguments": {}}]</toolcall>',
    '<TOOL_CALL>[{"name": "bash", "arguments": {}}]</TOOL_CALL>',
    '<|START_ACTION |>[{"tool_name": "bash", "parameters": {}}]<|END_ACTION|>',
    '<|start_action|>[{"tool_name": "bash", "parameters": {}}]<|end_action|>',
]
FENCED_THAT_STAY_TEXT = [
    # incomplete: the JSON never closes
    '```\n<tool_call>\n{"name": "bash", "arguments": {"command": \n```\nThat is how a call starts.',
    '```\n<function=bash>\n<parameter=command>\n```\nand so on.',
    # no declared tool named
    '```\n<tool_call>{"name": "my_tool", "arguments": {}}</tool_call>\n```',
    '```\n<tool_call>{"name": "<tool name>", "arguments": {"<key>": "<value>"}}</tool_call>\n```',
    '```\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n```',
    '```\n<tool_call>my_tool\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n</tool_call>\n```',
    '```\n[TOOL_CALLS]my_tool[ARGS]{"key": "value"}\n```',
    "`<|python_start|>[my_tool(a=1)]<|python_end|>`",
    '```\n<|tool_call|>[{"name": "bash", "arguments": {"command": \n```\nThat is how a call starts.',
    '```\n<|tool_call|>[{"name": "my_tool", "arguments": {}}]\n```',
    '```\n<TOOLCALL>[{"name": "my_tool", "arguments": {}}]</TOOLCALL>\n```',
    '```\n<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "my_tool", "parameters": {}}]<|END_ACTION|>\n```',
]


@pytest.mark.parametrize("model", MODELS)
def test_markup_quoted_in_json_strings_in_prose_stays_text(model):
    for text in QUOTED_IN_JSON_STRINGS:
        assert_text(text, model)


@pytest.mark.parametrize("model", MODELS)
def test_look_alike_tags_stay_text(model):
    for text in LOOK_ALIKES:
        assert_text(text, model)


@pytest.mark.parametrize("model", MODELS)
def test_incomplete_or_undeclared_examples_in_code_fences_stay_text(model):
    for text in FENCED_THAT_STAY_TEXT:
        assert_text(text, model)


def test_a_kimi_example_in_a_fence_naming_no_declared_tool_makes_no_call():
    # stays text as the undeclared-tool fixture does: the call's markup visible, the section
    # markers around it dropped (flows/kimi_undeclared_tool_stays_text.expected.json)
    call = "<|tool_call_begin|>functions.my_tool:0<|tool_call_argument_begin|>{}<|tool_call_end|>"
    streamed, message = through_chat(f"```\n<|tool_calls_section_begin|>{call}<|tool_calls_section_end|>\n```", "kimi-k2.5")
    assert streamed["tool_calls"] == [] and call in streamed["content"] and not message.get("tool_calls")


# The documented limit, asserted as it is: only structure is checked, so a complete example that
# names a declared tool becomes a call, in a fence, in backticks or in a quoted string.
KNOWN_LIMIT = [
    ("some-unknown-model", '```\n<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>\n```', "```\n```", '{"command":"ls"}'),
    ("some-unknown-model", '`<function=bash>{"command": "ls"}</function>`', "``", '{"command": "ls"}'),
    ("qwen3-coder-30b", 'Qwen: "<function=bash><parameter=command>ls</parameter></function>"', 'Qwen: ""', '{"command":"ls"}'),
    ("kimi-k2.5", 'Kimi: {"begin": "<|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>{}<|tool_call_end|>"}', 'Kimi: {"begin": ""}', "{}"),
    # Kimi arguments stream live and are not validated: escaped JSON arrives as it was written
    ("kimi-k2.5", 'K: "<|tool_call_begin|>functions.bash:0<|tool_call_argument_begin|>{\\"command\\": \\"ls\\"}<|tool_call_end|>"', 'K: ""', '{\\"command\\": \\"ls\\"}'),
]


@pytest.mark.parametrize(("model", "text", "content", "arguments"), KNOWN_LIMIT)
def test_known_limit_a_complete_example_naming_a_declared_tool_becomes_a_call(model, text, content, arguments):
    streamed, message = through_chat(text, model)
    assert [(c["name"], c["arguments"]) for c in streamed["tool_calls"]] == [("bash", arguments)]
    assert streamed["content"] == content and streamed["finish_reason"] == "tool_calls"
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["bash"]
