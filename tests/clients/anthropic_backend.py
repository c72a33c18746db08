"""A scripted Anthropic-style upstream (`POST /v1/messages`) that leaks its tool call as markup.

`AnthropicBackend` is a responder for `ScriptedUpstream.add_responder`, for one model name. It
streams Messages events (`event:` + `data:` lines, one write per event; a JSON body when the
client does not stream) and plays a two-turn tool loop; the turn is read from the history (the
number of `tool_result` blocks):

    turn 1  a LEAKED call of the client's shell tool, running `echo MARKER`, stop_reason
            "end_turn" (the upstream does not know it made a call):
              kimi     a thinking block that ends in Kimi's special tokens
                       (`<|tool_calls_section_begin|> … functions.Bash:0 …`), as Kimi K2 leaks
              minimax  a thinking block, then a text block holding MiniMax's
                       `<minimax:tool_call><invoke name="Bash"><parameter name="command">…`
                       between two sentences, as MiniMax M2's /anthropic leaks
    turn 2  the final answer: FINAL_PREFIX, what the tool printed, then DONE

The markup is split over many deltas, as real streams split it. toolshim turns it into a
`tool_use` block (the Kimi one keeps the id `functions.NAME:0`, the MiniMax one gets a `toolu_`
id); without toolshim the client only ever sees text and thinking.

Requests that are not the agent's turn are answered too, so that a real agent (Claude Code)
goes on: `…/v1/messages/count_tokens` gets a token count, and a Messages request that declares no
shell tool (a title, a summary, a quota probe with a small model) gets a short text. Every
request is recorded (`exchanges`), so a test can assert what the upstream saw.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

_TESTS_DIR = str(Path(__file__).resolve().parents[1])
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from anthropic_stream import block_events, message_body, message_end, message_start, sse  # noqa: E402
from harness import RecordedRequest, Script  # noqa: E402
from thinking_backend import RecordingResponder, kimi_markup_pieces  # noqa: E402

Leak = Literal["kimi", "minimax"]
Kind = Literal["agent", "side", "count_tokens", "other"]

# Preferred tool names, most shell-like first (compared without case); else the first tool with
# a string `command`-like parameter.
SHELL_TOOLS = ("bash", "run_shell", "shell", "exec_command", "run_command", "execute_command", "terminal")
SHELL_ARGS = ("command", "cmd", "script", "input")

REASONING = "The user wants the check run. I will run it with the shell tool."
TEXT_BEFORE = "Let me run the check. "
TEXT_AFTER = " Waiting for its output."
FINAL_PREFIX = "The check printed: "
DONE = "ANTHROPIC-BACKEND-DONE"
SIDE_TEXT = "Toolshim check"
SIGNATURE = "c2lnbmVkLWJ5LXRoZS1zY3JpcHRlZC1iYWNrZW5k"  # what a thinking block of the final turn carries

SSE_HEADERS = (("content-type", "text/event-stream"), ("cache-control", "no-cache"))
JSON_HEADERS = (("content-type", "application/json"),)


def leak_of(model: str) -> Leak:
    name = model.lower()
    if "kimi" in name:
        return "kimi"
    if "minimax" in name:
        return "minimax"
    raise ValueError(f"not a model this backend plays (its name must say kimi or minimax): {model!r}")


@dataclass(frozen=True)
class ToolChoice:
    name: str
    arg: str


def pick_tool(tools: Any) -> ToolChoice | None:
    """The shell-like tool among a Messages request's `tools`, and its command parameter."""
    specs = [
        (t["name"], t.get("input_schema") if isinstance(t.get("input_schema"), dict) else {})
        for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)
    ] if isinstance(tools, list) else []
    rank = {name: i for i, name in enumerate(SHELL_TOOLS)}
    for name, schema in sorted(specs, key=lambda s: rank.get(s[0].lower(), len(SHELL_TOOLS))):
        if name.lower() not in rank:
            continue
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        for arg in SHELL_ARGS:
            if isinstance(props.get(arg), dict) and props[arg].get("type") == "string":
                return ToolChoice(name, arg)
    return None


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def minimax_markup_pieces(name: str, arguments: Mapping[str, str]) -> list[str]:
    """A leaked MiniMax M2 call, in small text pieces (tags cut in the middle too)."""
    params = "".join(f'<parameter name="{key}">{value}</parameter>\n' for key, value in arguments.items())
    markup = f'<minimax:tool_call>\n<invoke name="{name}">\n{params}</invoke>\n</minimax:tool_call>'
    return _pieces(markup, 6)


def block_text(block: Any) -> str:
    """The text of a content block or of a tool_result's content (a string or text blocks)."""
    if isinstance(block, str):
        return block
    if isinstance(block, list):
        return "".join(block_text(part) for part in block)
    if isinstance(block, dict):
        if block.get("type") == "text":
            return str(block.get("text", ""))
        if block.get("type") == "tool_result":
            return block_text(block.get("content"))
    return ""


def content_blocks(messages: Any, role: str | None = None) -> list[dict[str, Any]]:
    """Every content block of a Messages history (of one role), in order."""
    blocks: list[dict[str, Any]] = []
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, dict) or (role is not None and message.get("role") != role):
            continue
        content = message.get("content")
        if isinstance(content, list):
            blocks += [b for b in content if isinstance(b, dict)]
    return blocks


@dataclass(frozen=True)
class Exchange:
    """One request the backend answered, with what it made of it."""

    request: RecordedRequest
    kind: Kind
    turn: int  # 1 + the tool results in the history (agent turns only)
    stream: bool

    @property
    def body(self) -> dict[str, Any]:
        return self.request.json if isinstance(self.request.json, dict) else {}

    @property
    def tool_results(self) -> list[dict[str, Any]]:
        return [b for b in content_blocks(self.body.get("messages"), "user") if b.get("type") == "tool_result"]

    @property
    def tool_uses(self) -> list[dict[str, Any]]:
        return [b for b in content_blocks(self.body.get("messages"), "assistant") if b.get("type") == "tool_use"]

    def describe(self) -> str:
        path = self.request.path
        tools = len(self.body.get("tools") or ())
        return f"{self.request.method} {path} {self.kind} turn={self.turn} stream={self.stream} tools={tools}"


class AnthropicBackend(RecordingResponder):
    """Responder for one model name: `AnthropicBackend(model, marker).register(upstream)`."""

    def __init__(self, model: str, marker: str) -> None:
        super().__init__(model)
        self.leak = leak_of(model)
        self.marker = marker

    @property
    def agent_turns(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.kind == "agent"]

    @property
    def command(self) -> str:
        return f"echo {self.marker}"

    def final_text(self, output: str) -> str:
        return f"{FINAL_PREFIX}{output.strip()}. {DONE}"

    def __call__(self, request: RecordedRequest) -> Script:
        body = request.json if isinstance(request.json, dict) else {}
        path = request.path.split("?", 1)[0]
        stream = bool(body.get("stream"))
        tool = pick_tool(body.get("tools"))
        if request.method != "POST" or not path.endswith(("/v1/messages", "/v1/messages/count_tokens")):
            kind: Kind = "other"
        elif path.endswith("/count_tokens"):
            kind = "count_tokens"
        else:
            kind = "agent" if tool is not None else "side"
        results = [b for b in content_blocks(body.get("messages"), "user") if b.get("type") == "tool_result"]
        self._record(Exchange(request, kind, 1 + len(results), stream))

        if kind == "other":
            error = {"type": "error", "error": {"type": "not_found_error", "message": f"no route {request.method} {path}"}}
            return Script(status=404, headers=JSON_HEADERS, chunks=(json.dumps(error).encode(),), framing="content-length")
        if kind == "count_tokens":
            return Script(headers=JSON_HEADERS, chunks=(b'{"input_tokens": 321}',), framing="content-length")
        if kind == "side":
            return self._answer([("text", [SIDE_TEXT], None)], stream)
        assert tool is not None
        if results:
            # The final answer says what the (last) tool run printed.
            return self._answer(
                [("thinking", _pieces("The check ran. Now the answer.", 8), SIGNATURE),
                 ("text", _pieces(self.final_text(block_text(results[-1])), 9), None)],
                stream,
            )
        arguments = {tool.arg: self.command}
        reasoning = _pieces(REASONING, 9)
        if self.leak == "kimi":
            return self._answer([("thinking", reasoning + kimi_markup_pieces(tool.name, arguments), None)], stream)
        text = _pieces(TEXT_BEFORE, 7) + minimax_markup_pieces(tool.name, arguments) + [TEXT_AFTER]
        return self._answer([("thinking", reasoning, None), ("text", text, None)], stream)

    def _answer(self, blocks: list[tuple[str, list[str], str | None]], stream: bool) -> Script:
        """`blocks`: (kind, pieces, signature) each; stop_reason is always end_turn (the upstream
        never made a call of its own)."""
        if not stream:
            content = [
                {"type": "text", "text": "".join(pieces)} if kind == "text"
                else {"type": "thinking", "thinking": "".join(pieces), "signature": signature or ""}
                for kind, pieces, signature in blocks
            ]
            payload = json.dumps(message_body(self.model, content)).encode()
            return Script(headers=JSON_HEADERS, chunks=(payload,), framing="content-length")
        events = [message_start(self.model), {"type": "ping"}]
        for index, (kind, pieces, signature) in enumerate(blocks):
            events += block_events(index, kind, pieces, signature)
        events += message_end("end_turn")
        # One write per SSE event, as a streaming server sends them.
        return Script(headers=SSE_HEADERS, chunks=tuple(sse([event]) for event in events))
