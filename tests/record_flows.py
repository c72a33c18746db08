"""Regenerate the `flows/` regression fixtures: `python tests/record_flows.py`.

A scripted upstream answers one request per situation through a real mitmdump that runs
WITHOUT the toolshim addon and writes every flow with `-w`. Without a streaming addon mitmdump
buffers SSE bodies whole, so each recorded flow holds the upstream's body exactly as it was
sent. The recording is then split into one `flows/<situation>.flow` per situation.

The `flows/<situation>.expected.json` files beside them are written by hand and are not touched
here: they say what toolshim should make of each recorded response (see tests/test_flows.py).
Re-recording changes timestamps, ports and flow ids, never the request or response bodies.
"""

from __future__ import annotations

import json
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

from harness import PROJECT_ROOT, Mitmdump, ScriptedUpstream, read_flows, sse_body  # noqa: E402
from kimi import (  # noqa: E402
    ARG_BEGIN,
    CALL_BEGIN,
    CALL_END,
    SECTION_BEGIN,
    SECTION_END,
    SEED_000,
    USAGE,
    kimi_chunks,
)

FLOWS_DIR = PROJECT_ROOT / "flows"

K2_5 = "moonshotai/Kimi-K2.5"
K2_INSTRUCT = "moonshotai/Kimi-K2-Instruct-0905"
K2_THINKING = "moonshotai/Kimi-K2-Thinking"

SSE_TYPE = "text/event-stream; charset=utf-8"
JSON_TYPE = "application/json"


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
        body["tool_choice"] = "auto"
    body["temperature"] = 0.6
    return body


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


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

    names = [s.name for s in out]
    assert len(names) == len(set(names)), "situation names must be unique"
    return out


# -- recording -----------------------------------------------------------------------------------


def record(situations: list[Situation], flows_dir: Path, log: Callable[[str], None] = print) -> list[Path]:
    """Record every situation through a plain mitmdump; write one flow file per situation."""
    from mitmproxy import io as mio

    flows_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        capture = Path(tmp) / "capture.flow"
        with ScriptedUpstream() as upstream:
            proxy = Mitmdump(upstream.url, script=None, extra_args=["-w", str(capture)])
            with proxy:
                headers = {"authorization": "Bearer sk-toolshim-fixture", "user-agent": "toolshim-record-flows/1"}
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
                        request_headers = {"content-type": "application/json"} if situation.request is not None else {}
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

    for stale in sorted(set(flows_dir.glob("*.flow")) - set(written)):
        log(f"note: {stale.relative_to(PROJECT_ROOT)} belongs to no situation here")
    for path in written:
        expected = path.with_name(path.name.removesuffix(".flow") + ".expected.json")
        if not expected.exists():
            log(f"note: {expected.relative_to(PROJECT_ROOT)} is missing: write it by hand")
    return written


def main() -> int:
    record(situations(), FLOWS_DIR)
    return 0


if __name__ == "__main__":
    sys.exit(main())
