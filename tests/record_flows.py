"""Regenerate the `flows/` regression fixtures.

    python tests/record_flows.py                    record every situation (rewrites every .flow)
    python tests/record_flows.py --only NAME ...    record only the named situations
    python tests/record_flows.py --missing          record the situations that have no .flow yet
    python tests/record_flows.py --list             list the situations, marking the unrecorded

A scripted upstream answers one request per situation through a real mitmdump that runs
WITHOUT the toolshim addon and writes every flow with `-w`. Without a streaming addon mitmdump
buffers SSE bodies whole, so each recorded flow holds the upstream's body exactly as it was
sent. The recording is then split into one `flows/<situation>.flow` per situation; the .flow
files of situations not selected are left as they are (their flow ids and bytes unchanged).

Chat Completions situations post to /v1/chat/completions (streams end with `data: [DONE]`);
Responses API situations post to /v1/responses (streams are `event:`/`data:` pairs, one event
per HTTP chunk, ending on `response.completed` without `[DONE]`); Anthropic Messages situations
post to /v1/messages or /anthropic/v1/messages with `x-api-key` and `anthropic-version` headers
(streams are `event:`/`data:` pairs, one event per HTTP chunk, from `message_start` to
`message_stop`). Buffered answers are JSON with a content-length.

The `flows/<situation>.expected.json` files beside them are written by hand and are not touched
here: they say what toolshim should make of each recorded response (see tests/test_flows.py).
Re-recording changes timestamps, ports and flow ids, never the request or response bodies.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_TESTS_DIR = Path(__file__).resolve().parent
if str(_TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(_TESTS_DIR))

import httpx  # noqa: E402

import anthropic_stream  # noqa: E402
from harness import PROJECT_ROOT, Mitmdump, ScriptedUpstream, read_flows, sse_body  # noqa: E402
from kimi import (  # noqa: E402
    ARG_BEGIN,
    CALL_BEGIN,
    CALL_END,
    SECTION_BEGIN,
    SECTION_END,
    SEED_000,
    USAGE,
    chunk,
    kimi_chunks,
)
from responses import (  # noqa: E402
    function_tool,
    number_events,
    response_json,
    responses_events,
    responses_sse,
    usage_object,
)

FLOWS_DIR = PROJECT_ROOT / "flows"

K2_5 = "moonshotai/Kimi-K2.5"
K2_INSTRUCT = "moonshotai/Kimi-K2-Instruct-0905"
K2_THINKING = "moonshotai/Kimi-K2-Thinking"

SSE_TYPE = "text/event-stream; charset=utf-8"
JSON_TYPE = "application/json"
BEARER = (("authorization", "Bearer sk-toolshim-fixture"),)


# -- request pieces, shaped like a real Chat Completions client's ---------------------------------


def tool(name: str, description: str, **properties: str) -> dict[str, Any]:
    """A Chat Completions tool declaration with string parameters."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {key: {"type": "string", "description": text} for key, text in properties.items()},
                "required": list(properties),
            },
        },
    }


BASH = tool("bash", "Run a shell command.", command="The command line to run.")
READ_FILE = tool("read_file", "Read a text file.", path="Path of the file.")
WRITE_FILE = tool("write_file", "Write a text file.", path="Path of the file.", content="The new file content.")
GET_WEATHER = tool("get_weather", "Current weather for a city.", city="City name.")
GREP = tool("grep", "Search files for a pattern.", pattern="Regular expression.", path="Folder to search.")
EXEC = tool("exec", "Execute a program.", cmd="The command line.")

SYSTEM = {"role": "system", "content": "You are a helpful coding assistant."}


def chat_request(
    model: str,
    user: str,
    *,
    stream: bool = True,
    tools: list[dict[str, Any]] | None = None,
    history: list[dict[str, Any]] | None = None,
    tool_choice: str = "auto",
    parallel_tool_calls: bool | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [SYSTEM, *(history or []), {"role": "user", "content": user}],
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if tools:
        body["tools"] = tools
        body["tool_choice"] = tool_choice
        if parallel_tool_calls is not None:
            body["parallel_tool_calls"] = parallel_tool_calls
    body["temperature"] = 0.6
    return body


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


# -- the `<tool_call>` (Hermes / Qwen) dialect ------------------------------------------------------

QWEN25 = "Qwen/Qwen2.5-72B-Instruct"
QWEN3 = "Qwen/Qwen3-32B"

GET_TIME = tool("get_time", "Current local time in a timezone.", timezone="IANA timezone name, e.g. Europe/Paris.")
SET_THERMOSTAT = {  # a strict tool, shaped as OpenAI's structured outputs require
    "type": "function",
    "function": {
        "name": "set_thermostat",
        "description": "Set the target temperature of a room.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {
                "room": {"type": "string", "description": "Room name."},
                "celsius": {"type": "number", "description": "Target temperature in degrees Celsius."},
            },
            "required": ["room", "celsius"],
            "additionalProperties": False,
        },
    },
}


def tool_call_block(call: Any) -> str:
    """A call as Qwen's chat template has the model write it."""
    return "<tool_call>\n" + json.dumps(call, ensure_ascii=False) + "\n</tool_call>"


# Roughly how a BPE tokenizer cuts such text: the tags are single (special) tokens, a run of
# newlines is one token, words and punctuation runs carry their leading space.
_TOKEN = re.compile(r"</?tool_call>|\n+|[ ]?[A-Za-z]+|[ ]?[0-9]+|[ ]?<|[ ]?[^\sA-Za-z0-9<]+|\s")


def tokens(text: str) -> list[str]:
    """`text` in token-sized pieces, one per stream event."""
    pieces = _TOKEN.findall(text)
    assert "".join(pieces) == text, "the token pattern lost characters"
    return pieces


def content_chunks(model: str, text: str, *, usage: dict[str, int], finish_reason: str = "stop") -> list[dict[str, Any]]:
    """A vLLM-style Chat stream of `text` in `content`, one token per chunk."""
    return kimi_chunks(model, tokens(text), fields=("content",), finish_reason=finish_reason, usage=usage)


# -- Responses API requests, shaped like a real client's (openai-python, Codex) --------------------


def flat_tool(name: str, description: str, **properties: str) -> dict[str, Any]:
    """A Responses function tool with string parameters: flat, unlike Chat's."""
    parameters = tool(name, description, **properties)["function"]["parameters"]
    return function_tool(name, parameters, description=description, strict=False)


R_GET_WEATHER = flat_tool("get_weather", "Current weather for a city.", city="City name.")
R_GET_TIME = flat_tool("get_time", "Current local time in a timezone.", timezone="IANA timezone name, e.g. Europe/Paris.")
R_TOOLS = [R_GET_WEATHER, R_GET_TIME]
INSTRUCTIONS = "You are a helpful assistant."


def responses_request(model: str, input: str | list[dict[str, Any]], *, stream: bool = True, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    if isinstance(input, str):
        input = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": input}]}]
    body: dict[str, Any] = {"model": model, "instructions": INSTRUCTIONS, "input": input, "stream": stream}
    if tools:
        body["tools"] = tools
        body["tool_choice"] = "auto"
        body["parallel_tool_calls"] = True
    body["store"] = False
    return body


# -- situations ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Situation:
    """One request and the upstream's scripted reply to it."""

    name: str
    method: str
    path: str
    request: dict[str, Any] | None
    status: int = 200
    content_type: str = SSE_TYPE
    writes: tuple[bytes, ...] = ()  # the reply body, one socket write (HTTP chunk) each
    framing: str = "chunked"
    headers: tuple[tuple[str, str], ...] = ()  # the request's credentials; default: a Bearer token

    @property
    def key(self) -> str:
        """The scripted upstream's routing key: the model, else the path."""
        if self.request is not None and "model" in self.request:
            return self.request["model"]
        return self.path

    @property
    def request_bytes(self) -> bytes:
        return b"" if self.request is None else json.dumps(self.request, separators=(",", ":")).encode()


def stream_writes(chunks: list[dict[str, Any]]) -> tuple[bytes, ...]:
    """An SSE body written one event per HTTP chunk, ending with `[DONE]`."""
    return (*(sse_body([c], done=False) for c in chunks), b"data: [DONE]\n\n")


def stream(name: str, request: dict[str, Any], chunks: list[dict[str, Any]]) -> Situation:
    return Situation(name, "POST", "/v1/chat/completions", request, writes=stream_writes(chunks))


def json_reply(name: str, method: str, path: str, request: dict[str, Any] | None, obj: Any, status: int = 200) -> Situation:
    return Situation(
        name,
        method,
        path,
        request,
        status=status,
        content_type=JSON_TYPE,
        writes=(json.dumps(obj).encode(),),
        framing="content-length",
    )


RESPONSES_PATH = "/v1/responses"


def responses_stream(name: str, request: dict[str, Any], events: list[dict[str, Any]]) -> Situation:
    """A Responses SSE body, one `event:`/`data:` pair per HTTP chunk, numbered 0..n-1, no [DONE]."""
    writes = tuple(responses_sse([event]) for event in number_events(events))
    return Situation(name, "POST", RESPONSES_PATH, request, writes=writes)


def situations() -> list[Situation]:
    out: list[Situation] = []

    # The seed: Kimi-K2.5 puts two calls into mirrored `reasoning` + `reasoning_content`.
    out.append(
        stream(
            "kimi_seed_000_reasoning",
            chat_request(K2_5, "Which syscall headers are in /usr/include/asm?", tools=[BASH, READ_FILE]),
            kimi_chunks(K2_5, SEED_000, usage=USAGE),
        )
    )

    # Markup in `content`, prose before the section.
    out.append(
        stream(
            "kimi_calls_in_content",
            chat_request(K2_INSTRUCT, "What's the weather in Paris?", tools=[GET_WEATHER]),
            kimi_chunks(
                K2_INSTRUCT,
                [
                    "Let me check",
                    " the weather in Paris.",
                    " " + SECTION_BEGIN,
                    CALL_BEGIN,
                    "functions.get_weather:0",
                    ARG_BEGIN,
                    '{"city": ',
                    '"Paris"}',
                    CALL_END,
                    SECTION_END,
                ],
                fields=("content",),
                usage=usage(231, 27),
            ),
        )
    )

    # K2-Thinking: the section leaks into `reasoning_content`, then `</think>` and the answer.
    out.append(
        stream(
            "kimi_calls_in_reasoning_thinking",
            chat_request(K2_THINKING, "List the files here.", tools=[BASH]),
            kimi_chunks(
                K2_THINKING,
                [
                    "The user wants",
                    " the files in the current directory.",
                    " I should run ls.",
                    SECTION_BEGIN,
                    CALL_BEGIN,
                    "functions.bash:0",
                    ARG_BEGIN,
                    '{"command": "ls -la"}',
                    CALL_END,
                    SECTION_END,
                    "</think>",
                    "\n\nI'll list the files for you.",
                ],
                fields=("reasoning_content",),
                usage=usage(402, 58),
            ),
        )
    )

    # Two calls in one section, several markers per event, a blank line as its own event.
    out.append(
        stream(
            "kimi_two_calls_one_section",
            chat_request(K2_5, "Summarise README.md and pyproject.toml.", tools=[BASH, READ_FILE]),
            kimi_chunks(
                K2_5,
                [
                    "I'll read both files.",
                    "\n\n",
                    SECTION_BEGIN + CALL_BEGIN + "functions.read_file:0",
                    ARG_BEGIN + '{"path": "README.md"}',
                    CALL_END + CALL_BEGIN + "functions.read_file:1" + ARG_BEGIN,
                    '{"path": "pyproject.toml"}' + CALL_END,
                    SECTION_END,
                ],
                fields=("content",),
                usage=usage(517, 64),
            ),
        )
    )

    # Tokens decoded with a space on each side (special tokens kept), prose after the section.
    history = [
        {"role": "user", "content": "Set up the project."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "functions.bash:2", "type": "function", "function": {"name": "bash", "arguments": '{"command": "pip install -e ."}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "functions.bash:2", "content": "Successfully installed project-0.1.0"},
    ]
    out.append(
        stream(
            "kimi_text_before_and_after_section",
            chat_request(K2_INSTRUCT, "Now run the tests.", tools=[BASH], history=history),
            kimi_chunks(
                K2_INSTRUCT,
                [
                    "Running the tests now.",
                    " " + SECTION_BEGIN,
                    " " + CALL_BEGIN,
                    " functions.bash:3",
                    " " + ARG_BEGIN,
                    ' {"command": "pytest -q"}',
                    " " + CALL_END,
                    " " + SECTION_END,
                    " I will report",
                    " the results next.",
                ],
                fields=("content",),
                usage=usage(1290, 41),
            ),
        )
    )

    # max_tokens reached inside a call header: nothing says which tool was meant.
    out.append(
        stream(
            "kimi_cut_off_length_in_header",
            chat_request(K2_INSTRUCT, "Why did the build fail?", tools=[BASH, READ_FILE]),
            kimi_chunks(
                K2_INSTRUCT,
                ["Let me look at the log.", " " + SECTION_BEGIN, " " + CALL_BEGIN, " functions.read", "_file"],
                fields=("content",),
                finish_reason="length",
                usage=usage(388, 16),
            ),
        )
    )

    # max_tokens reached inside the arguments: the call is announced, its JSON incomplete.
    out.append(
        stream(
            "kimi_cut_off_length_in_arguments",
            chat_request(K2_INSTRUCT, "Start a notes file.", tools=[READ_FILE, WRITE_FILE]),
            kimi_chunks(
                K2_INSTRUCT,
                [
                    "I'll write the file.",
                    SECTION_BEGIN,
                    CALL_BEGIN,
                    "functions.write_file:0",
                    ARG_BEGIN,
                    '{"path": "notes.md", ',
                    '"content": "# Notes\\n\\nFirst',
                ],
                fields=("content",),
                finish_reason="length",
                usage=usage(290, 32),
            ),
        )
    )

    # A call with no section around it.
    out.append(
        stream(
            "kimi_bare_call_without_section",
            chat_request(K2_INSTRUCT, "Where am I?", tools=[BASH]),
            kimi_chunks(
                K2_INSTRUCT,
                ["Let me look.", " " + CALL_BEGIN, "functions.bash:2", ARG_BEGIN, '{"command": "pwd"}', CALL_END],
                fields=("content",),
                usage=usage(150, 19),
            ),
        )
    )

    # The singular section spellings, with spaces around every token.
    out.append(
        stream(
            "kimi_singular_section_tokens",
            chat_request(K2_INSTRUCT, "Find the TODOs in src.", tools=[GREP]),
            kimi_chunks(
                K2_INSTRUCT,
                [
                    "Searching.",
                    " <|tool_call_section_begin|>",
                    " " + CALL_BEGIN,
                    " functions.grep:0",
                    " " + ARG_BEGIN,
                    ' {"pattern": "TODO", "path": "src"}',
                    " " + CALL_END,
                    " <|tool_call_section_end|>",
                ],
                fields=("content",),
                usage=usage(176, 30),
            ),
        )
    )

    # A header that lost its dot and colon (`functionsexec5`), resolved against declared tools.
    out.append(
        stream(
            "kimi_odd_header_functionsexec5",
            chat_request(K2_5, "Which kernel is this?", tools=[BASH, READ_FILE, EXEC]),
            kimi_chunks(
                K2_5,
                [SECTION_BEGIN, CALL_BEGIN, "functionsexec5", ARG_BEGIN, '{"cmd": "uname -a"}', CALL_END, SECTION_END],
                fields=("content",),
                usage=usage(344, 22),
            ),
        )
    )

    # A call to a tool the client never declared stays visible text; no tool call, `stop` stays.
    out.append(
        stream(
            "kimi_undeclared_tool_stays_text",
            chat_request(K2_INSTRUCT, "Clean up the build output.", tools=[BASH]),
            kimi_chunks(
                K2_INSTRUCT,
                ["Cleaning up.", SECTION_BEGIN, CALL_BEGIN, "functions.rm_rf:0", ARG_BEGIN, '{"path": "build"}', CALL_END, SECTION_END],
                fields=("content",),
                usage=usage(203, 25),
            ),
        )
    )

    # A plain answer with a "<" in it: passes byte for byte.
    out.append(
        stream(
            "plain_stream_without_markup",
            chat_request(K2_INSTRUCT, "How do I compare two numbers in Python?"),
            kimi_chunks(
                K2_INSTRUCT,
                ["Hello!", " In Python, `a < b`", " compares two values."],
                fields=("content",),
                usage=usage(58, 14),
            ),
        )
    )

    # `stream: false`: one chat.completion whose message.content holds the markup.
    content = (
        "I'll check the disk usage. "
        f"{SECTION_BEGIN} {CALL_BEGIN} functions.bash:0 {ARG_BEGIN} "
        '{"command": "df -h"}'
        f" {CALL_END} {SECTION_END}"
    )
    out.append(
        json_reply(
            "kimi_non_streaming",
            "POST",
            "/v1/chat/completions",
            chat_request(K2_INSTRUCT, "How full is the disk?", stream=False, tools=[BASH]),
            {
                "id": "chatcmpl-5f0c9e2a41b37d86",
                "object": "chat.completion",
                "created": 1772234901,
                "model": K2_INSTRUCT,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": content,
                            "reasoning_content": "The user asked how full the disk is.",
                            "tool_calls": [],
                        },
                        "logprobs": None,
                        "finish_reason": "stop",
                        "stop_reason": None,
                    }
                ],
                "usage": usage(812, 61),
            },
        )
    )

    # An error answer on the Chat Completions path: passes untouched.
    out.append(
        json_reply(
            "error_response_500",
            "POST",
            "/v1/chat/completions",
            chat_request("moonshotai/Kimi-K2.5-overloaded", "Hello?", tools=[BASH]),
            {
                "object": "error",
                "message": "The engine is overloaded. <|tool_calls_section_begin|> was not expected here.",
                "type": "InternalServerError",
                "param": None,
                "code": 500,
            },
            status=500,
        )
    )

    # Not an LLM call at all.
    out.append(
        json_reply(
            "non_llm_get_models",
            "GET",
            "/v1/models",
            None,
            {
                "object": "list",
                "data": [
                    {"id": K2_5, "object": "model", "created": 1772230000, "owned_by": "vllm", "max_model_len": 262144},
                    {"id": K2_THINKING, "object": "model", "created": 1772230000, "owned_by": "vllm", "max_model_len": 262144},
                ],
            },
        )
    )

    out += sentinel_chat_situations()
    out += responses_situations()
    out += dialect_situations()
    out += native_situations()
    out += messages_situations()

    names = [s.name for s in out]
    assert len(names) == len(set(names)), "situation names must be unique"
    return out


def sentinel_chat_situations() -> list[Situation]:
    """Chat Completions with Qwen / Hermes `<tool_call>` blocks leaked into `content`."""
    out: list[Situation] = []
    paris = {"name": "get_weather", "arguments": {"city": "Paris"}}

    # Prose, a blank line, two blocks one after the other; every token its own event.
    out.append(
        stream(
            "sentinel_chat_stream_text_then_two_calls",
            chat_request(QWEN25, "What's the weather and the time in Paris?", tools=[GET_WEATHER, GET_TIME]),
            content_chunks(
                QWEN25,
                "I'll check both.\n\n"
                + tool_call_block(paris)
                + "\n"
                + tool_call_block({"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}),
                usage=usage(312, 58),
            ),
        )
    )

    # Seed 001's form: "arguments" is JSON text, not an object.
    out.append(
        stream(
            "sentinel_chat_string_arguments",
            chat_request(QWEN25, "Show me src/app/main.py.", tools=[READ_FILE, WRITE_FILE]),
            content_chunks(
                QWEN25,
                "Let me open the file.\n"
                + tool_call_block({"name": "read_file", "arguments": json.dumps({"path": "src/app/main.py"})}),
                usage=usage(275, 37),
            ),
        )
    )

    # Writing an XML file whose text holds both tags: only the end tag outside strings counts.
    xml = "<calls>\n  <tool_call>ls -la</tool_call>\n</calls>\n"
    out.append(
        stream(
            "sentinel_chat_end_tag_inside_string",
            chat_request(QWEN25, "Create templates/calls.xml with one sample call.", tools=[READ_FILE, WRITE_FILE]),
            content_chunks(
                QWEN25,
                "I'll write the template.\n"
                + tool_call_block({"name": "write_file", "arguments": {"path": "templates/calls.xml", "content": xml}}),
                usage=usage(301, 52),
            ),
        )
    )

    # A tool the client never declared.
    out.append(
        stream(
            "sentinel_chat_undeclared_tool_stays_text",
            chat_request(QWEN25, "Remove the old feature branch.", tools=[BASH]),
            content_chunks(
                QWEN25,
                "Cleaning up the old branch.\n"
                + tool_call_block({"name": "delete_branch", "arguments": {"branch": "old-feature"}}),
                usage=usage(198, 33),
            ),
        )
    )

    # No tools declared at all: nothing can be a call.
    out.append(
        stream(
            "sentinel_chat_no_tools_declared",
            chat_request(QWEN25, "How do you call a tool?"),
            content_chunks(QWEN25, "A call looks like this:\n" + tool_call_block(paris), usage=usage(64, 35)),
        )
    )

    # A strict tool whose arguments break its schema (celsius must be a number).
    out.append(
        stream(
            "sentinel_chat_strict_schema_violation_stays_text",
            chat_request(QWEN25, "Make the living room a bit warmer, 21 degrees.", tools=[SET_THERMOSTAT]),
            content_chunks(
                QWEN25,
                "Setting it now.\n"
                + tool_call_block({"name": "set_thermostat", "arguments": {"room": "living room", "celsius": "twenty-one"}}),
                usage=usage(240, 36),
            ),
        )
    )

    # A non-strict tool, JSON with a trailing comma: repaired once.
    out.append(
        stream(
            "sentinel_chat_non_strict_trailing_comma_repaired",
            chat_request(QWEN25, "Weather in Rome?", tools=[GET_WEATHER]),
            content_chunks(
                QWEN25,
                'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome",}}\n</tool_call>',
                usage=usage(188, 27),
            ),
        )
    )

    # Two blocks, the request allows one call.
    out.append(
        stream(
            "sentinel_chat_parallel_false",
            chat_request(QWEN25, "Weather in Lyon and Nice?", tools=[GET_WEATHER], parallel_tool_calls=False),
            content_chunks(
                QWEN25,
                "Checking both cities.\n"
                + tool_call_block({"name": "get_weather", "arguments": {"city": "Lyon"}})
                + "\n"
                + tool_call_block({"name": "get_weather", "arguments": {"city": "Nice"}}),
                usage=usage(205, 61),
            ),
        )
    )

    # The request forbids calls.
    out.append(
        stream(
            "sentinel_chat_tool_choice_none",
            chat_request(QWEN25, "What would you call to get the weather in Paris?", tools=[GET_WEATHER], tool_choice="none"),
            content_chunks(QWEN25, "I would call:\n" + tool_call_block(paris), usage=usage(180, 31)),
        )
    )

    # `stream: false`: Qwen3 behind vLLM's reasoning parser, the block in message.content.
    out.append(
        json_reply(
            "sentinel_chat_non_streaming",
            "POST",
            "/v1/chat/completions",
            chat_request(QWEN3, "Weather in Tokyo?", stream=False, tools=[GET_WEATHER, GET_TIME]),
            {
                "id": "chatcmpl-b41e07c2d95a4f3e",
                "object": "chat.completion",
                "created": 1772236120,
                "model": QWEN3,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": "I'll look up the weather in Tokyo.\n"
                            + tool_call_block({"name": "get_weather", "arguments": {"city": "Tokyo"}}),
                            "reasoning_content": "The user wants the current weather in Tokyo. I should call get_weather.",
                            "tool_calls": [],
                        },
                        "logprobs": None,
                        "finish_reason": "stop",
                        "stop_reason": None,
                    }
                ],
                "usage": usage(356, 74),
            },
        )
    )
    return out


def responses_situations() -> list[Situation]:
    """The Responses API (`/v1/responses`): markup in message text and in reasoning text."""
    out: list[Situation] = []
    common = {"tools": R_TOOLS, "created_at": 1772237000}

    # Message text, a block, more text.
    text = (
        "Let me check the weather in Berlin.\n"
        + tool_call_block({"name": "get_weather", "arguments": {"city": "Berlin"}})
        + "\nI will answer once I have it."
    )
    out.append(
        responses_stream(
            "responses_sentinel_stream_text_call_text",
            responses_request(QWEN3, "What's the weather in Berlin?", tools=R_TOOLS),
            responses_events(
                QWEN3,
                tokens(text),
                msg_id="msg_8d0b5e3f1a2c4e6b",
                resp_id="resp_3f9a2c7e41d84b60",
                usage=usage_object(291, 64),
                **common,
            ),
        )
    )

    # Reasoning, then a message holding nothing but a block (string arguments).
    block = tool_call_block({"name": "get_time", "arguments": json.dumps({"timezone": "Asia/Tokyo"})})
    out.append(
        responses_stream(
            "responses_sentinel_stream_call_only",
            responses_request(QWEN3, "What time is it in Tokyo?", tools=R_TOOLS),
            responses_events(
                QWEN3,
                tokens(block),
                reasoning_pieces=["The user wants", " the local time", " in Tokyo."],
                msg_id="msg_1c7e9a0b2d4f4a81",
                rs_id="rs_6e2d8b0a9c1f4d37",
                resp_id="resp_a07c5e91b3d24f68",
                usage=usage_object(265, 48, reasoning_tokens=9),
                **common,
            ),
        )
    )

    # Kimi-K2-Thinking: the section leaks into reasoning_text, then the message.
    out.append(
        responses_stream(
            "responses_kimi_in_reasoning_stream",
            responses_request(K2_THINKING, "What's the weather in Oslo?", tools=R_TOOLS),
            responses_events(
                K2_THINKING,
                ["Let me check", " the weather in Oslo."],
                reasoning_pieces=[
                    "The user wants",
                    " the weather in Oslo.",
                    " I should call get_weather.",
                    SECTION_BEGIN,
                    CALL_BEGIN,
                    "functions.get_weather:0",
                    ARG_BEGIN,
                    '{"city": ',
                    '"Oslo"}',
                    CALL_END,
                    SECTION_END,
                ],
                msg_id="msg_5b3e1d9f7a0c4c22",
                rs_id="rs_0f4a6c8e2b1d4e95",
                resp_id="resp_7e1b3d5f9a2c4b08",
                usage=usage_object(418, 71, reasoning_tokens=40),
                **common,
            ),
        )
    )

    # No markup (a bare `<` in the text), tools declared: nothing to change.
    out.append(
        responses_stream(
            "responses_plain_stream_unchanged",
            responses_request(QWEN3, "How do I compare two numbers in Python?", tools=R_TOOLS),
            responses_events(
                QWEN3,
                ["In Python,", " `a < b`", " is True when", " a is smaller."],
                reasoning_pieces=["A simple", " comparison question."],
                msg_id="msg_9a4c2e6b0d8f4f13",
                rs_id="rs_2b8d0f4a6c1e4a59",
                resp_id="resp_c52e9a1d7b3f4e86",
                usage=usage_object(143, 29, reasoning_tokens=6),
                **common,
            ),
        )
    )

    # `stream: false`: one Response whose message text holds a block.
    out.append(
        json_reply(
            "responses_non_streaming",
            "POST",
            RESPONSES_PATH,
            responses_request(QWEN3, "Weather in Madrid?", stream=False, tools=R_TOOLS),
            response_json(
                QWEN3,
                "I'll check the weather in Madrid.\n"
                + tool_call_block({"name": "get_weather", "arguments": {"city": "Madrid"}}),
                reasoning="The user asks for the weather in Madrid.",
                msg_id="msg_e3a1c5b7d9f04b2a",
                rs_id="rs_4d6f8a0c2e1b4c73",
                resp_id="resp_18b4d6f0a2c34e5d",
                usage=usage_object(248, 57, reasoning_tokens=10),
                **common,
            ),
        )
    )

    # The next turn: the request echoes the call and its output, the answer is plain text.
    history = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What's the weather in Paris?"}]},
        {
            "type": "function_call",
            "id": "fc_4b7d2e9a0c1f4e38",
            "call_id": "call_Xq3vT8mK2pLw9RzN5bYc7HdF",
            "name": "get_weather",
            "arguments": '{"city":"Paris"}',
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "call_Xq3vT8mK2pLw9RzN5bYc7HdF", "output": '{"temp_c": 18, "sky": "cloudy"}'},
    ]
    out.append(
        responses_stream(
            "responses_follow_up_with_function_call_output",
            responses_request(QWEN3, history, tools=R_TOOLS),
            responses_events(
                QWEN3,
                ["It is", " 18 °C", " and cloudy", " in Paris."],
                msg_id="msg_7f0d2b4e6a8c4d91",
                resp_id="resp_9c2e4a6f8b0d4a17",
                usage=usage_object(334, 14),
                **common,
            ),
        )
    )
    return out


# -- the other dialects: Qwen3-Coder XML, GLM, MiniMax, Mistral, Llama, DeepSeek, Harmony ------------

QWEN3_CODER = "Qwen/Qwen3-Coder-30B-A3B-Instruct"
GLM46 = "zai-org/GLM-4.6"
MINIMAX_M2 = "MiniMaxAI/MiniMax-M2"
MAGISTRAL = "mistralai/Magistral-Small-2509"
LLAMA4 = "meta-llama/Llama-4-Scout-17B-16E-Instruct"
DEEPSEEK_V31 = "deepseek-ai/DeepSeek-V3.1"
DEEPSEEK_R1 = "deepseek-ai/DeepSeek-R1-0528"
GPT_OSS = "openai/gpt-oss-120b"
GEMMA3 = "google/gemma-3-27b-it"  # in no dialect's model table: every dialect runs
GRANITE33 = "ibm-granite/granite-3.3-8b-instruct"
NEMOTRON_NANO_V2 = "nvidia/NVIDIA-Nemotron-Nano-9B-v2"
COMMAND_A = "CohereLabs/c4ai-command-a-03-2025"
LLAMA33 = "meta-llama/Llama-3.3-70B-Instruct"


def typed_tool(name: str, description: str, properties: dict[str, dict[str, Any]], required: list[str] | None = None) -> dict[str, Any]:
    """A Chat Completions tool declaration with the parameter schemas given as they are."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(properties) if required is None else required},
        },
    }


SEARCH_CODE = typed_tool(
    "search_code",
    "Search the repository's source code.",
    {
        "query": {"type": "string", "description": "What to look for."},
        "max_results": {"type": "integer", "description": "How many hits to return at most."},
        "filters": {
            "type": "object",
            "description": "Restrict the search.",
            "properties": {"language": {"type": "string"}, "path": {"type": "string"}},
        },
    },
    required=["query"],
)
GET_FORECAST = typed_tool(
    "get_forecast",
    "Weather forecast for a city.",
    {"city": {"type": "string", "description": "City name."}, "days": {"type": "integer", "description": "Number of days, 1 to 7."}},
)
READ_LINES = typed_tool(
    "read_lines",
    "Read a range of lines of a text file.",
    {
        "path": {"type": "string", "description": "Path of the file."},
        "lines": {"type": "array", "items": {"type": "integer"}, "description": "First and last line, 1-based."},
    },
)

# Like `_TOKEN`, without any tag of its own: each dialect names its special tokens.
_PIECE = re.compile(r"\n+|[ ]?[A-Za-z]+|[ ]?[0-9]+|[ ]?<|[ ]?[^\sA-Za-z0-9<]+|\s")


def dialect_tokens(text: str, specials: tuple[str, ...] = ()) -> list[str]:
    """`text` in token-sized pieces; each of `specials` (the dialect's special tokens) is one piece."""
    parts = re.split("(" + "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")", text) if specials else [text]
    pieces: list[str] = []
    for n, part in enumerate(parts):
        if n % 2:
            pieces.append(part)
        else:
            pieces += _PIECE.findall(part)
    assert "".join(pieces) == text, "the token pattern lost characters"
    return pieces


def dialect_chunks(
    model: str, text: str, specials: tuple[str, ...], *, usage: dict[str, int], finish_reason: str = "stop"
) -> list[dict[str, Any]]:
    """A vLLM-style Chat stream of `text` in `content`, one token per chunk."""
    return kimi_chunks(model, dialect_tokens(text, specials), fields=("content",), finish_reason=finish_reason, usage=usage)


QWEN_SPECIALS = ("<tool_call>", "</tool_call>")
GLM_SPECIALS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
MINIMAX_SPECIALS = ("<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>")
MISTRAL_SPECIALS = ("[TOOL_CALLS]", "[ARGS]", "[THINK]", "[/THINK]")
LLAMA4_SPECIALS = ("<|python_start|>", "<|python_end|>")
LLAMA3_SPECIALS = ("<|python_tag|>", "<|eom_id|>")
DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
DS_CALLS_END = "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
DS_CALL_END = "<｜tool▁call▁end｜>"
DS_SEP = "<｜tool▁sep｜>"
DEEPSEEK_SPECIALS = (DS_CALLS_BEGIN, DS_CALLS_END, DS_CALL_BEGIN, DS_CALL_END, DS_SEP, "</think>")
HARMONY_SPECIALS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>", "<|call|>", "<|return|>")
GRANITE_SPECIALS = ("<|tool_call|>",)
NEMOTRON_SPECIALS = ("<think>", "</think>", "<TOOLCALL>", "</TOOLCALL>")
COMMAND_SPECIALS = ("<|START_THINKING|>", "<|END_THINKING|>", "<|START_ACTION|>", "<|END_ACTION|>")


def dialect_situations() -> list[Situation]:
    """Chat Completions streams with each dialect's markup leaked into `content`."""
    out: list[Situation] = []

    # Qwen3-Coder: a `<tool_call><function=…>` block, string, integer and object parameters.
    out.append(
        stream(
            "dialect_qwen3_coder_xml",
            chat_request(QWEN3_CODER, "Where is the retry helper defined?", tools=[SEARCH_CODE, READ_FILE]),
            dialect_chunks(
                QWEN3_CODER,
                "I'll search the repository for the retry helper.\n"
                "<tool_call>\n<function=search_code>\n"
                "<parameter=query>\nretry_with_backoff\n</parameter>\n"
                "<parameter=max_results>\n5\n</parameter>\n"
                '<parameter=filters>\n{"language": "python", "path": "src/"}\n</parameter>\n'
                "</function>\n</tool_call>",
                QWEN_SPECIALS,
                usage=usage(402, 71),
            ),
        )
    )

    # GLM-4.6: reasoning in `<think>` in content, prose, then an `<arg_key>/<arg_value>` call.
    out.append(
        stream(
            "dialect_glm_arg_key_value",
            chat_request(GLM46, "Will it rain in Oslo in the next three days?", tools=[GET_WEATHER, GET_FORECAST]),
            dialect_chunks(
                GLM46,
                "<think>The user asks about rain in Oslo over three days. I need the forecast, not the current weather.</think>\n"
                "I'll get the three-day forecast for Oslo.\n"
                "<tool_call>get_forecast\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n"
                "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
                GLM_SPECIALS,
                usage=usage(366, 64),
            ),
        )
    )

    # MiniMax-M2: two `<invoke>` in one `<minimax:tool_call>` block.
    out.append(
        stream(
            "dialect_minimax_invoke",
            chat_request(MINIMAX_M2, "Weather now in Paris, and the forecast for Tokyo this weekend?", tools=[GET_WEATHER, GET_FORECAST]),
            dialect_chunks(
                MINIMAX_M2,
                "I'll look up both.\n"
                "<minimax:tool_call>\n"
                '<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n</invoke>\n'
                '<invoke name="get_forecast">\n<parameter name="city">Tokyo</parameter>\n<parameter name="days">2</parameter>\n</invoke>\n'
                "</minimax:tool_call>",
                MINIMAX_SPECIALS,
                usage=usage(512, 88),
            ),
        )
    )

    # Magistral (tokenizer v13): `[TOOL_CALLS]NAME[ARGS]{…}` twice, back to back.
    out.append(
        stream(
            "dialect_mistral_v13",
            chat_request(MAGISTRAL, "What's the weather and the time in Paris?", tools=[GET_WEATHER, GET_TIME]),
            dialect_chunks(
                MAGISTRAL,
                "I'll check the weather and the local time in Paris.\n\n"
                '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
                '[TOOL_CALLS]get_time[ARGS]{"timezone": "Europe/Paris"}',
                MISTRAL_SPECIALS,
                usage=usage(288, 45),
            ),
        )
    )

    # Llama 4: a pythonic call list after prose.
    out.append(
        stream(
            "dialect_llama_pythonic",
            chat_request(LLAMA4, "Show me lines 10 to 20 of src/app.py.", tools=[READ_FILE, READ_LINES]),
            dialect_chunks(
                LLAMA4,
                "Let me read those lines."
                "<|python_start|>[read_lines(path='src/app.py', lines=[10, 20])]<|python_end|>",
                LLAMA4_SPECIALS,
                usage=usage(341, 29),
            ),
        )
    )

    # DeepSeek-V3.1: the name before the separator, bare JSON after it.
    out.append(
        stream(
            "dialect_deepseek_v31",
            chat_request(DEEPSEEK_V31, "What's the weather in Berlin?", tools=[GET_WEATHER, GET_TIME]),
            dialect_chunks(
                DEEPSEEK_V31,
                "I'll check the current weather in Berlin."
                f'{DS_CALLS_BEGIN}{DS_CALL_BEGIN}get_weather{DS_SEP}{{"city": "Berlin"}}{DS_CALL_END}{DS_CALLS_END}',
                DEEPSEEK_SPECIALS,
                usage=usage(254, 31),
            ),
        )
    )

    # gpt-oss without a Harmony parser: the analysis channel, then a commentary call.
    out.append(
        stream(
            "dialect_gpt_oss_harmony",
            chat_request(GPT_OSS, "What's the weather in Madrid?", tools=[GET_WEATHER, GET_TIME]),
            dialect_chunks(
                GPT_OSS,
                "<|channel|>analysis<|message|>The user asks for the weather in Madrid. I should call get_weather.<|end|>"
                "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
                '<|message|>{"city": "Madrid"}<|call|>',
                HARMONY_SPECIALS,
                usage=usage(198, 52),
            ),
        )
    )

    # DeepSeek-R1-0528 opens `<think>` in its prompt: the content starts inside reasoning.
    out.append(
        stream(
            "think_preopened_deepseek_r1",
            chat_request(DEEPSEEK_R1, "What is 17 × 23?", tools=[GET_WEATHER]),
            dialect_chunks(
                DEEPSEEK_R1,
                "The user wants 17 × 23. 17 × 20 = 340 and 17 × 3 = 51, so 340 + 51 = 391. No tool is needed.</think>\n\n"
                "17 × 23 = 391.",
                DEEPSEEK_SPECIALS,
                usage=usage(162, 58),
            ),
        )
    )

    # A model explaining the syntax: markers in prose and in a code fence, no declared tool named.
    out.append(
        stream(
            "look_alike_prose_stays_text",
            chat_request(GEMMA3, "How do Mistral and Qwen3-Coder write tool calls?", tools=[GET_WEATHER, READ_FILE]),
            dialect_chunks(
                GEMMA3,
                "Mistral models write `[TOOL_CALLS]` followed by the tool name, `[ARGS]` and a JSON object; "
                "Qwen3-Coder writes `<function=name>` with one `<parameter=key>` element per argument. For example:\n\n"
                "```\n"
                '[TOOL_CALLS]tool_name[ARGS]{"key": "value"}\n'
                "<function=tool_name>\n<parameter=key>\nvalue\n</parameter>\n</function>\n"
                "```\n\n"
                "The server turns such markup into tool calls only for tools the request declares.",
                (),
                usage=usage(96, 118),
            ),
        )
    )

    # IBM Granite 3.3: prose, then `<|tool_call|>` and a JSON list of two calls (no closer).
    out.append(
        stream(
            "dialect_granite_tool_call",
            chat_request(GRANITE33, "What's the weather in Oslo, and the forecast for Rome?", tools=[GET_WEATHER, GET_FORECAST]),
            dialect_chunks(
                GRANITE33,
                "I'll check both cities."
                '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Oslo"}}, '
                '{"name": "get_forecast", "arguments": {"city": "Rome", "days": 2}}]',
                GRANITE_SPECIALS,
                usage=usage(298, 47),
            ),
        )
    )

    # NVIDIA Nemotron Nano 9B v2: its reasoning in `<think>`, prose, then `<TOOLCALL>[…]</TOOLCALL>`.
    out.append(
        stream(
            "dialect_nemotron_toolcall",
            chat_request(NEMOTRON_NANO_V2, "Show me the first lines of setup.py.", tools=[READ_FILE, READ_LINES]),
            dialect_chunks(
                NEMOTRON_NANO_V2,
                "<think>The user wants the start of setup.py; read_lines takes the range.</think>\n"
                "Reading the file.\n\n"
                '<TOOLCALL>[{"name": "read_lines", "arguments": {"path": "setup.py", "lines": [1, 20]}}]</TOOLCALL>',
                NEMOTRON_SPECIALS,
                usage=usage(455, 58),
            ),
        )
    )

    # gpt-oss whose chat template wrote `<|start|>assistant` itself: the output begins with the
    # recipient, ` to=functions.NAME<|channel|>…` (the Harmony format guide's role-header form).
    out.append(
        stream(
            "dialect_gpt_oss_recipient_at_start",
            chat_request(GPT_OSS, "What's the weather in Madrid?", tools=[GET_WEATHER, GET_TIME]),
            dialect_chunks(
                GPT_OSS,
                ' to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city": "Madrid"}<|call|>',
                HARMONY_SPECIALS,
                usage=usage(201, 21),
            ),
        )
    )

    # gpt-oss calling a function from the analysis channel (the recipient names `functions.`).
    out.append(
        stream(
            "dialect_gpt_oss_call_on_analysis",
            chat_request(GPT_OSS, "What time is it in Madrid?", tools=[GET_WEATHER, GET_TIME]),
            dialect_chunks(
                GPT_OSS,
                "<|channel|>analysis<|message|>The user wants the local time in Madrid.<|end|>"
                "<|start|>assistant<|channel|>analysis to=functions.get_time <|constrain|>json"
                '<|message|>{"timezone": "Europe/Madrid"}<|call|>',
                HARMONY_SPECIALS,
                usage=usage(203, 40),
            ),
        )
    )

    # Magistral (v13) writing `[TOOL_CALLS]` inside its thought: the thought keeps it; the call
    # after `[/THINK]` is the call (vLLM's Mistral reasoning parser hands the tool parser only
    # what follows `[/THINK]`).
    out.append(
        stream(
            "dialect_mistral_tool_calls_in_think",
            chat_request(MAGISTRAL, "What's the weather in Paris?", tools=[GET_WEATHER, GET_TIME]),
            dialect_chunks(
                MAGISTRAL,
                '[THINK]I could write [TOOL_CALLS]get_time[ARGS]{"timezone": "Europe/Paris"} too, but only the weather was asked.[/THINK]'
                '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
                MISTRAL_SPECIALS,
                usage=usage(290, 48),
            ),
        )
    )

    # Llama 3.3 after `<|python_tag|>`: two JSON calls on separate lines (no `;`), then
    # `<|eom_id|>` (vLLM's llama3_json skips any run of `; \t\n` between the objects).
    out.append(
        stream(
            "dialect_llama_json_lines",
            chat_request(LLAMA33, "Weather and local time in Oslo?", tools=[GET_WEATHER, GET_TIME]),
            dialect_chunks(
                LLAMA33,
                '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}\n'
                '{"name": "get_time", "parameters": {"timezone": "Europe/Oslo"}}<|eom_id|>',
                LLAMA3_SPECIALS,
                usage=usage(310, 38),
            ),
        )
    )

    # Cohere Command A: the plan in `<|START_THINKING|>`, then one action with a call.
    out.append(
        stream(
            "dialect_command_action",
            chat_request(COMMAND_A, "Find where the config is loaded.", tools=[GREP, READ_FILE]),
            dialect_chunks(
                COMMAND_A,
                "<|START_THINKING|>I will search the source for the config loader.<|END_THINKING|>"
                "<|START_ACTION|>[\n"
                '    {"tool_call_id": "0", "tool_name": "grep", "parameters": {"pattern": "load_config", "path": "src/"}}\n'
                "]<|END_ACTION|>",
                COMMAND_SPECIALS,
                usage=usage(612, 64),
            ),
        )
    )
    return out


# -- upstream's own `tool_calls`, broken in the known ways ------------------------------------------

GLM45_AIR = "zai-org/GLM-4.5-Air"


def native_entry(arguments: str, *, index: int | None = None, call_id: str | None = None, name: str | None = None) -> dict[str, Any]:
    """One `tool_calls` delta entry, with only the keys given (`type` goes with the id)."""
    entry: dict[str, Any] = {}
    if index is not None:
        entry["index"] = index
    if call_id is not None:
        entry["id"] = call_id
        entry["type"] = "function"
    function: dict[str, Any] = {} if name is None else {"name": name}
    function["arguments"] = arguments
    entry["function"] = function
    return entry


def native_chunks(model: str, text: list[str], entries: list[dict[str, Any]], *, usage: dict[str, int]) -> list[dict[str, Any]]:
    """Role, prose in `content`, one `tool_calls` entry per chunk, `stop`, usage."""
    chunks = [chunk(model, {"role": "assistant", "content": ""})]
    chunks += [chunk(model, {"content": piece}) for piece in text]
    chunks += [chunk(model, {"tool_calls": [entry]}) for entry in entries]
    chunks.append(chunk(model, {}, "stop"))
    chunks.append({**chunk(model, {}), "choices": [], "usage": usage})
    return chunks


def native_situations() -> list[Situation]:
    """Chat Completions streams whose own `tool_calls` deltas break the wire rules."""
    out: list[Situation] = []

    # No `index`, `id`/`type`/`name` on every delta (vLLM #44098, GLM), two calls, `stop`.
    weather, time = "chatcmpl-tool-6b1e9f3c27d84a05b9e2c4d7a18f0c3e", "chatcmpl-tool-0d4a7c2e91f54b38a6c0e5f2b7d9a146"
    out.append(
        stream(
            "broken_native_no_index_repeated_ids",
            chat_request(GLM45_AIR, "What's the weather and the time in Paris?", tools=[GET_WEATHER, GET_TIME]),
            native_chunks(
                GLM45_AIR,
                ["I'll check", " both."],
                [
                    native_entry('{"city": ', call_id=weather, name="get_weather"),
                    native_entry('"Paris"', call_id=weather, name="get_weather"),
                    native_entry("}", call_id=weather, name="get_weather"),
                    native_entry('{"timezone": ', call_id=time, name="get_time"),
                    native_entry('"Europe/Paris"', call_id=time, name="get_time"),
                    native_entry("}", call_id=time, name="get_time"),
                ],
                usage=usage(296, 47),
            ),
        )
    )

    # A call whose deltas are followed by the whole arguments again (GLM), and a call whose
    # arguments come as a JSON string of the JSON text (Kimi-K2#26), cut inside an escape.
    weather, time = "chatcmpl-tool-3c8e1a5f70b24d96a2f4e6c8b0d1a357", "chatcmpl-tool-9f2b4d6a8c0e4f13b5d7e9a1c3f5b780"
    double = json.dumps(json.dumps({"timezone": "Europe/Paris"}))  # "{\"timezone\": \"Europe/Paris\"}"
    cuts = [double[:7], double[7:13], double[13:26], double[26:]]
    assert "".join(cuts) == double and cuts[1].endswith("\\")
    out.append(
        stream(
            "broken_native_snapshot_and_double_encoded",
            chat_request(GLM46, "What's the weather and the time in Paris?", tools=[GET_WEATHER, GET_TIME]),
            native_chunks(
                GLM46,
                ["Let me", " look both up."],
                [
                    native_entry("", index=0, call_id=weather, name="get_weather"),
                    native_entry('{"city": ', index=0),
                    native_entry('"Paris"}', index=0),
                    native_entry('{"city": "Paris"}', index=0),  # the snapshot
                    native_entry("", index=1, call_id=time, name="get_time"),
                    *(native_entry(cut, index=1) for cut in cuts),
                ],
                usage=usage(301, 52),
            ),
        )
    )
    return out


# -- Anthropic Messages API (`/v1/messages`): markup in text and thinking blocks ----------------------

MESSAGES_PATH = "/v1/messages"
MOONSHOT_PATH = "/anthropic/v1/messages"  # Moonshot's Anthropic-compatible base URL ends in /anthropic
ANTHROPIC_HEADERS = (("x-api-key", "sk-ant-toolshim-fixture"), ("anthropic-version", "2023-06-01"))
KIMI_K2_THINKING = "kimi-k2-thinking"  # Moonshot's own model names on its Anthropic endpoint
KIMI_K2_0905 = "kimi-k2-0905-preview"
QWEN3_2507 = "Qwen/Qwen3-235B-A22B-Instruct-2507"
MINIMAX_M2_1 = "MiniMaxAI/MiniMax-M2.1"


def anthropic_tool(chat_tool: dict[str, Any]) -> dict[str, Any]:
    """A Chat Completions tool declaration in the Messages API's shape."""
    function = chat_tool["function"]
    return {"name": function["name"], "description": function["description"], "input_schema": function["parameters"]}


A_BASH, A_READ_FILE = anthropic_tool(BASH), anthropic_tool(READ_FILE)
A_GET_WEATHER, A_GET_TIME, A_GET_FORECAST = anthropic_tool(GET_WEATHER), anthropic_tool(GET_TIME), anthropic_tool(GET_FORECAST)
A_SEARCH_CODE = anthropic_tool(SEARCH_CODE)


def messages_request(
    model: str, user: str, *, stream: bool = True, tools: list[dict[str, Any]] | None = None, thinking: bool = False
) -> dict[str, Any]:
    """A Messages request as the Anthropic SDK and Claude Code send one."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": 8192,
        "system": "You are a helpful coding assistant.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": user}]}],
    }
    if thinking:
        body["thinking"] = {"type": "enabled", "budget_tokens": 4096}
    if tools:
        body["tools"] = tools
        body["tool_choice"] = {"type": "auto"}
    body["stream"] = stream
    return body


def message_usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": input_tokens, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": output_tokens}


def messages_events(
    model: str, msg_id: str, blocks: list[list[dict[str, Any]]], *, usage: tuple[int, int], stop_reason: str = "end_turn"
) -> list[dict[str, Any]]:
    """message_start (output_tokens 1), a ping, the blocks' events, message_delta (the usage's
    output tokens) and message_stop, as Anthropic streams them."""
    start = anthropic_stream.message_start(model)
    start["message"] = {**start["message"], "id": msg_id, "usage": message_usage(usage[0], 1)}
    events = [start, {"type": "ping"}]
    for block in blocks:
        events += block
    end = anthropic_stream.message_end(stop_reason, output_tokens=usage[1])
    return events + end


def messages_stream(name: str, request: dict[str, Any], events: list[dict[str, Any]], path: str = MESSAGES_PATH) -> Situation:
    """A Messages SSE body, one `event:`/`data:` pair per HTTP chunk."""
    writes = tuple(anthropic_stream.sse([event]) for event in events)
    return Situation(name, "POST", path, request, writes=writes, headers=ANTHROPIC_HEADERS)


def messages_json(name: str, request: dict[str, Any], obj: Any, *, status: int = 200, path: str = MESSAGES_PATH) -> Situation:
    situation = json_reply(name, "POST", path, request, obj, status=status)
    return Situation(**{**situation.__dict__, "headers": ANTHROPIC_HEADERS})


def messages_situations() -> list[Situation]:
    """Anthropic Messages API answers of open models behind Anthropic-compatible servers (vLLM,
    SGLang, llama.cpp, Moonshot's and MiniMax's /anthropic): markup leaked into text and
    thinking blocks, upstream's own broken tool_use, and what must pass untouched."""
    block, tool_use = anthropic_stream.block_events, anthropic_stream.tool_use_events
    out: list[Situation] = []

    # Kimi-K2-Thinking: the section leaks into the thinking block (no signature), a text block follows.
    out.append(
        messages_stream(
            "messages_kimi_in_thinking_stream",
            messages_request(KIMI_K2_THINKING, "List the files in src.", tools=[A_BASH, A_READ_FILE], thinking=True),
            messages_events(
                KIMI_K2_THINKING,
                "msg_01Kq7tWzV3bN8mYc2xR5pLdA",
                [
                    block(
                        0,
                        "thinking",
                        [
                            "The user wants",
                            " the files in src.",
                            " I should run ls.",
                            SECTION_BEGIN,
                            CALL_BEGIN,
                            "functions.bash:0",
                            ARG_BEGIN,
                            '{"command": ',
                            '"ls -la src"}',
                            CALL_END,
                            SECTION_END,
                        ],
                    ),
                    block(1, "text", ["I'll list", " the files in src."]),
                ],
                usage=(402, 58),
            ),
            path=MOONSHOT_PATH,
        )
    )

    # MiniMax-M2.1 without a tool parser: an `<invoke>` block between two sentences of a text block.
    out.append(
        messages_stream(
            "messages_minimax_invoke_in_text",
            messages_request(MINIMAX_M2_1, "Will it rain in Tokyo this weekend?", tools=[A_GET_WEATHER, A_GET_FORECAST]),
            messages_events(
                MINIMAX_M2_1,
                "msg_0a5e2c7b9d1f4e63b8c0a2d4",
                [
                    block(
                        0,
                        "text",
                        dialect_tokens(
                            "I'll get the weekend forecast for Tokyo.\n"
                            "<minimax:tool_call>\n"
                            '<invoke name="get_forecast">\n<parameter name="city">Tokyo</parameter>\n<parameter name="days">2</parameter>\n</invoke>\n'
                            "</minimax:tool_call>\n"
                            "Then I will tell you whether to take an umbrella.",
                            MINIMAX_SPECIALS,
                        ),
                    ),
                ],
                usage=(512, 77),
            ),
        )
    )

    # Qwen3 (Hermes markup) without a tool parser: prose, then two `<tool_call>` blocks in the text.
    out.append(
        messages_stream(
            "messages_qwen_tool_call_in_text",
            messages_request(QWEN3_2507, "What's the weather and the time in Paris?", tools=[A_GET_WEATHER, A_GET_TIME]),
            messages_events(
                QWEN3_2507,
                "msg_7c1d9e3f5a2b4c80a6e8f0b2",
                [
                    block(
                        0,
                        "text",
                        tokens(
                            "I'll check both.\n\n"
                            + tool_call_block({"name": "get_weather", "arguments": {"city": "Paris"}})
                            + "\n"
                            + tool_call_block({"name": "get_time", "arguments": {"timezone": "Europe/Paris"}})
                        ),
                    ),
                ],
                usage=(318, 58),
            ),
        )
    )

    # MiniMax-M2.1 without a reasoning parser: its `<think>` block opens the text block.
    out.append(
        messages_stream(
            "messages_minimax_think_in_text",
            messages_request(MINIMAX_M2_1, "Is 391 a prime number?", tools=[A_BASH]),
            messages_events(
                MINIMAX_M2_1,
                "msg_3e8a0c2d4f6b4a19c7e9b1d3",
                [
                    block(
                        0,
                        "text",
                        dialect_tokens(
                            "<think>391 = 17 × 23, so it is not prime. No tool is needed.</think>\n\n"
                            "No: 391 = 17 × 23.",
                            MINIMAX_SPECIALS,
                        ),
                    ),
                ],
                usage=(156, 41),
            ),
        )
    )

    # gpt-oss behind llama.cpp's /v1/messages without Harmony parsing: analysis, then a call.
    out.append(
        messages_stream(
            "messages_gpt_oss_harmony_in_text",
            messages_request(GPT_OSS, "What's the weather in Madrid?", tools=[A_GET_WEATHER, A_GET_TIME]),
            messages_events(
                GPT_OSS,
                "msg_5f2b8d0e6a4c4e71b3d5f7a9",
                [
                    block(
                        0,
                        "text",
                        dialect_tokens(
                            "<|channel|>analysis<|message|>The user asks for the weather in Madrid. I should call get_weather.<|end|>"
                            "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
                            '<|message|>{"city": "Madrid"}<|call|>',
                            HARMONY_SPECIALS,
                        ),
                    ),
                ],
                usage=(203, 52),
            ),
        )
    )

    # vLLM's Chat-to-Messages converter: one call opened as two tool_use blocks with one id, the
    # first with a preview `input` at its start and an empty piece; stop_reason end_turn.
    call_id = "toolu_vllm_3b9d7f1a5c2e4d86"
    out.append(
        messages_stream(
            "messages_broken_native_split_tool_use",
            messages_request(QWEN3_CODER, "Where is the retry helper defined?", tools=[A_SEARCH_CODE, A_READ_FILE]),
            messages_events(
                QWEN3_CODER,
                "msg_9b4d6f8a0c2e4b57d1f3a5c7",
                [
                    block(0, "text", ["I'll search", " the repository."]),
                    tool_use(1, call_id, "search_code", ['{"query": "retry_with', ""], start_input={"query": "retry_with"}),
                    tool_use(2, call_id, "search_code", ['_backoff", ', '"max_results": 5}']),
                ],
                usage=(420, 39),
            ),
        )
    )

    # No markup (a `<` in the text), a signed thinking block, tools declared: byte for byte.
    out.append(
        messages_stream(
            "messages_plain_stream_unchanged",
            messages_request(KIMI_K2_THINKING, "How do I compare two numbers in Python?", tools=[A_BASH], thinking=True),
            messages_events(
                KIMI_K2_THINKING,
                "msg_01Pz4nB8vR2kX6tW9cY3mQeS",
                [
                    block(0, "thinking", ["A simple", " comparison question."], signature="EpYBCkgIBxABGAIiQ3n0dGxzaGltLWZpeHR1cmU="),
                    block(1, "text", ["In Python,", " `a < b`", " is True when", " a is smaller."]),
                ],
                usage=(143, 29),
            ),
            path=MOONSHOT_PATH,
        )
    )

    # `stream: false`: one message whose text block holds a Kimi section.
    out.append(
        messages_json(
            "messages_kimi_non_streaming",
            messages_request(KIMI_K2_0905, "How full is the disk?", stream=False, tools=[A_BASH]),
            {
                "id": "msg_01Hn5rT2wQ8xK4vB7mZ9cJpF",
                "type": "message",
                "role": "assistant",
                "model": KIMI_K2_0905,
                "content": [
                    {
                        "type": "text",
                        "text": "I'll check the disk usage. "
                        f"{SECTION_BEGIN} {CALL_BEGIN} functions.bash:0 {ARG_BEGIN} "
                        '{"command": "df -h"}'
                        f" {CALL_END} {SECTION_END}",
                    }
                ],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": message_usage(812, 61),
            },
            path=MOONSHOT_PATH,
        )
    )

    # A Kimi call to a tool the client never declared: the text stays as it came.
    out.append(
        messages_stream(
            "messages_undeclared_tool_stays_text",
            messages_request(KIMI_K2_0905, "Clean up the build output.", tools=[A_BASH]),
            messages_events(
                KIMI_K2_0905,
                "msg_01Ld3sG7yT1vN5bX8kR2wHcM",
                [
                    block(
                        0,
                        "text",
                        ["Cleaning up.", SECTION_BEGIN, CALL_BEGIN, "functions.rm_rf:0", ARG_BEGIN, '{"path": "build"}', CALL_END, SECTION_END],
                    ),
                ],
                usage=(203, 25),
            ),
            path=MOONSHOT_PATH,
        )
    )

    # An overload answer (Anthropic's 529), with markup in its message: passes untouched.
    out.append(
        messages_json(
            "messages_error_response_529",
            messages_request(KIMI_K2_0905, "Hello?", tools=[A_BASH]),
            {
                "type": "error",
                "error": {"type": "overloaded_error", "message": "Overloaded: <|tool_calls_section_begin|> was not expected here."},
                "request_id": "req_011CTz4pW8nY2kV6bR3xQ9mL",
            },
            status=529,
            path=MOONSHOT_PATH,
        )
    )
    return out


# -- recording -----------------------------------------------------------------------------------


def record(
    situations: list[Situation],
    flows_dir: Path,
    log: Callable[[str], None] = print,
    known: set[str] | None = None,
) -> list[Path]:
    """Record `situations` through a plain mitmdump; write one flow file per situation.

    Only their .flow files are (re)written. `known`: the names of every situation there is,
    when `situations` are a selection of them (flows of the others are not stale).
    """
    from mitmproxy import io as mio

    flows_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        capture = Path(tmp) / "capture.flow"
        with ScriptedUpstream() as upstream:
            proxy = Mitmdump(upstream.url, script=None, extra_args=["-w", str(capture)])
            with proxy:
                headers = {"user-agent": "toolshim-record-flows/1"}
                with httpx.Client(base_url=proxy.url, headers=headers, timeout=30) as client:
                    for situation in situations:
                        # One request at a time, so a routing key can be reused with a new reply.
                        upstream.add(
                            situation.key,
                            status=situation.status,
                            headers={"content-type": situation.content_type},
                            chunks=situation.writes,
                            framing=situation.framing,  # type: ignore[arg-type]
                        )
                        request_headers = dict(situation.headers or BEARER)
                        if situation.request is not None:
                            request_headers["content-type"] = "application/json"
                        response = client.request(
                            situation.method,
                            situation.path,
                            content=situation.request_bytes or None,
                            headers=request_headers,
                        )
                        body = b"".join(situation.writes)
                        if response.status_code != situation.status or response.content != body:
                            raise RuntimeError(f"{situation.name}: unexpected answer through the proxy: {response.status_code}")
            code = proxy.returncode
            if code != 0:
                raise RuntimeError(f"mitmdump exited with {code}:\n{proxy.log_text()}")

        flows = read_flows(capture)
        if len(flows) != len(situations):
            raise RuntimeError(f"recorded {len(flows)} flows for {len(situations)} situations")
        written = []
        for situation, flow in zip(situations, flows):
            if (
                flow.request.method != situation.method
                or flow.request.path != situation.path
                or flow.request.content != situation.request_bytes
                or flow.response is None
                or flow.response.content != b"".join(situation.writes)
            ):
                raise RuntimeError(f"{situation.name}: the recorded flow does not match its situation")
            path = flows_dir / f"{situation.name}.flow"
            with open(path, "wb") as f:
                mio.FlowWriter(f).add(flow)
            written.append(path)
            log(f"wrote {path.relative_to(PROJECT_ROOT)}")

    names = {s.name for s in situations} | (known or set())
    for stale in sorted(p for p in flows_dir.glob("*.flow") if p.name.removesuffix(".flow") not in names):
        log(f"note: {stale.relative_to(PROJECT_ROOT)} belongs to no situation here")
    for path in written:
        expected = path.with_name(path.name.removesuffix(".flow") + ".expected.json")
        if not expected.exists():
            log(f"note: {expected.relative_to(PROJECT_ROOT)} is missing: write it by hand")
    return written


def select(every: list[Situation], only: list[str] | None, missing: bool, flows_dir: Path) -> list[Situation]:
    """The situations to record: the named ones, those without a .flow, or all of them."""
    if only:
        by_name = {s.name: s for s in every}
        unknown = [name for name in only if name not in by_name]
        if unknown:
            raise SystemExit(f"unknown situations: {', '.join(unknown)} (see --list)")
        wanted = set(only)
        return [s for s in every if s.name in wanted]  # in definition order
    if missing:
        return [s for s in every if not (flows_dir / f"{s.name}.flow").exists()]
    return every


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Record the flows/ fixtures through a plain mitmdump.")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--only", nargs="+", metavar="NAME", help="record only these situations")
    group.add_argument("--missing", action="store_true", help="record the situations without a .flow file")
    group.add_argument("--list", action="store_true", help="list the situations (* = no .flow yet) and exit")
    args = parser.parse_args(argv)

    every = situations()
    if args.list:
        for s in every:
            mark = " " if (FLOWS_DIR / f"{s.name}.flow").exists() else "*"
            print(f"{mark} {s.name}  ({s.method} {s.path})")
        return 0
    chosen = select(every, args.only, args.missing, FLOWS_DIR)
    if not chosen:
        print("nothing to record")
        return 0
    record(chosen, FLOWS_DIR, known={s.name for s in every})
    return 0


if __name__ == "__main__":
    sys.exit(main())
