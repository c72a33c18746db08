"""A scripted thinking-mode upstream: Moonshot (Kimi K2 Thinking) and DeepSeek, as agents meet them.

`ThinkingBackend` is a responder for `ScriptedUpstream.add_responder`: it answers Chat Completions
(streamed SSE, or JSON when the client does not stream) and the Responses API (streamed events,
for Codex), and plays a three-turn tool loop. The turn is the number of tool results in the
request's history:

    turn 1  reasoning that ends in a LEAKED Kimi call (`<|tool_calls_section_begin|>…`, split
            over many events as real streams split it), finish_reason "stop"
    turn 2  some reasoning, then content holding a LEAKED Hermes/Qwen `<tool_call>{…}</tool_call>`
            block, finish_reason "stop"
    turn 3  reasoning and the final answer (`FINAL_ANSWER`)

toolshim turns the leaked markup into real tool calls: the Kimi one keeps its id
`functions.NAME:0`, the Hermes one gets a minted `call_…` id. NAME is the shell-like tool the
client declared (`pick_tool`); its argument runs `echo toolshim-step-N`.

Like the real backends, every request is checked first and refused with HTTP 400 and the real
error body `{"error": {"message": …, "type": "invalid_request_error"}}`:

- Moonshot (`kimi-k2-thinking-…`): every assistant message with tool calls carries a non-empty
  `reasoning_content` (Responses API: every `function_call` item is preceded, since the last user
  message or tool output, by a `reasoning` item with text), else Moonshot's own message.
- Moonshot: every tool-call id in the history is of Kimi's form `functions.NAME:IDX`. The real
  Kimi does not answer 400 here: its chat template renders the ids verbatim and other ids quietly
  degrade its next calls. The 400 is a stand-in that makes that degradation visible to a test.
- DeepSeek (`deepseek-v4-…`, `deepseek-reasoner-…`): every assistant message, with tool calls or
  not, carries `reasoning_content`, else DeepSeek's own message.

Every exchange is recorded (`exchanges`), so a test can assert what the upstream saw.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

_TESTS_DIR = str(Path(__file__).resolve().parents[1])
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from harness import RecordedRequest, ScriptedUpstream, Script, sse_body  # noqa: E402
from responses import number_events, response_json, responses_events, responses_sse  # noqa: E402

Flavour = Literal["moonshot", "deepseek"]
Api = Literal["chat", "responses"]

KIMI_ID = re.compile(r"^functions\.[A-Za-z0-9_\-\.]+:\d+$")
# Preferred tool names, most shell-like first; else the first tool with a string parameter.
SHELL_TOOLS = ("exec_command", "shell", "run_shell", "bash", "run_command", "execute_command", "terminal")
SHELL_ARGS = ("cmd", "command", "commands", "script", "input")

STEP_OUTPUTS = ("toolshim-step-1", "toolshim-step-2")
FINAL_ANSWER = "Both checks passed (toolshim-step-1, toolshim-step-2). THINKING-BACKEND-DONE"
# What the client is sent as reasoning, per turn, before any markup.
REASONING = (
    "The user wants two checks. I will run the first one with the shell tool.",
    "The first check printed its marker. Now the second check.",
    "Both checks printed their markers. Time to answer.",
)
TURN2_TEXT = "Running the second check now.\n"

MOONSHOT_MISSING = "thinking is enabled but reasoning_content is missing in assistant tool call message at index {index}"
DEEPSEEK_MISSING = "The reasoning_content in the thinking mode must be passed back to the API."
KIMI_ID_ERROR = "tool call id '{id}' at {where}[{index}] is not of the form functions.NAME:IDX"


def flavour_of(model: str) -> Flavour:
    name = model.lower()
    if name.startswith(("deepseek-v4", "deepseek-reasoner")):
        return "deepseek"
    if name.startswith("kimi-k2-thinking"):
        return "moonshot"
    raise ValueError(f"not a thinking model this backend plays: {model!r}")


@dataclass(frozen=True)
class ToolChoice:
    name: str
    arg: str
    array: bool  # the command parameter is an argv array (Codex's older `shell` tool)

    def arguments(self, step: int) -> dict[str, Any]:
        command = f"echo {STEP_OUTPUTS[step - 1]}"
        return {self.arg: ["bash", "-lc", command] if self.array else command}


def _tool_specs(tools: Any) -> list[tuple[str, Mapping[str, Any]]]:
    """(name, parameters) of the function tools of a Chat or Responses request."""
    specs = []
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            continue
        fn = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        if isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            specs.append((fn["name"], params if isinstance(params, dict) else {}))
    return specs


def pick_tool(tools: Any) -> ToolChoice | None:
    """The shell-like tool the client declared, and its command parameter."""
    specs = _tool_specs(tools)
    ranked = sorted(
        specs,
        key=lambda spec: SHELL_TOOLS.index(spec[0]) if spec[0] in SHELL_TOOLS else len(SHELL_TOOLS),
    )
    for name, params in ranked:
        props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
        names = sorted(props, key=lambda p: SHELL_ARGS.index(p) if p in SHELL_ARGS else len(SHELL_ARGS))
        for prop in names:
            kind = props[prop].get("type") if isinstance(props[prop], dict) else None
            if kind == "string" or kind == "array":
                return ToolChoice(name, prop, kind == "array")
    return None


# --------------------------------------------------------------------------
# The backend's checks
# --------------------------------------------------------------------------


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text(part.get("text")) if isinstance(part, dict) else "" for part in value)
    return ""


def check_chat(messages: Any, flavour: Flavour) -> str | None:
    """The error message the real backend answers this history with, or None."""
    if not isinstance(messages, list):
        return "messages must be a list"
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        has_reasoning = bool(_text(message.get("reasoning_content")).strip())
        if flavour == "moonshot" and message.get("tool_calls") and not has_reasoning:
            return MOONSHOT_MISSING.format(index=index)
        if flavour == "deepseek" and not has_reasoning:
            return DEEPSEEK_MISSING
    if flavour == "moonshot":
        for index, message in enumerate(messages):
            if not isinstance(message, dict):
                continue
            ids = [call.get("id") for call in message.get("tool_calls") or () if isinstance(call, dict)]
            if message.get("role") == "tool":
                ids.append(message.get("tool_call_id"))
            for call_id in ids:
                if not (isinstance(call_id, str) and KIMI_ID.match(call_id)):
                    return KIMI_ID_ERROR.format(id=call_id, where="messages", index=index)
    return None


def reasoning_item_text(item: Mapping[str, Any]) -> str:
    return _text(item.get("content")) + _text(item.get("summary"))


def check_responses(items: Any, flavour: Flavour) -> str | None:
    """Moonshot's rules on a Responses `input`: reasoning before every call, Kimi-form ids."""
    if not isinstance(items, list):
        return None  # a plain string input has no history
    reasoning_seen = False
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "function_call_output" or (kind == "message" and item.get("role") == "user"):
            reasoning_seen = False
        elif kind == "reasoning" and reasoning_item_text(item).strip():
            reasoning_seen = True
        elif kind == "function_call" and not reasoning_seen:
            if flavour == "moonshot":
                return MOONSHOT_MISSING.format(index=index)
            return DEEPSEEK_MISSING
    if flavour == "moonshot":
        for index, item in enumerate(items):
            if isinstance(item, dict) and item.get("type") in ("function_call", "function_call_output"):
                call_id = item.get("call_id")
                if not (isinstance(call_id, str) and KIMI_ID.match(call_id)):
                    return KIMI_ID_ERROR.format(id=call_id, where="input", index=index)
    return None


# --------------------------------------------------------------------------
# The answers
# --------------------------------------------------------------------------


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def kimi_markup_pieces(name: str, arguments: Mapping[str, Any], index: int = 0) -> list[str]:
    """A leaked Kimi call, split the way vLLM streams it (a special token per event, the header
    and the arguments in small pieces)."""
    args = json.dumps(arguments)
    return [
        " <|tool_calls_section_begin|>",
        " <|tool_call_begin|>",
        " functions",
        f".{name[:2]}",
        name[2:],
        ":",
        str(index),
        " <|tool_call_argument_begin|>",
        *_pieces(args, 5),
        " <|tool_call_end|>",
        " <|tool_calls_section_end|>",
    ]


def hermes_markup_pieces(name: str, arguments: Mapping[str, Any]) -> list[str]:
    """A leaked Hermes/Qwen `<tool_call>` block, in small content pieces."""
    block = json.dumps({"name": name, "arguments": arguments})
    return ["<tool_", "call>", "\n", *_pieces(block, 7), "\n</tool", "_call>"]


@dataclass(frozen=True)
class TurnPlan:
    reasoning: list[str]
    content: list[str]

    @property
    def reasoning_text(self) -> str:
        return "".join(self.reasoning)

    @property
    def content_text(self) -> str:
        return "".join(self.content)


def plan_turn(turn: int, tool: ToolChoice | None) -> TurnPlan:
    reasoning = _pieces(REASONING[turn - 1], 9)
    if tool is None or turn == 3:
        return TurnPlan(reasoning, _pieces(FINAL_ANSWER, 11))
    if turn == 1:
        return TurnPlan(reasoning + kimi_markup_pieces(tool.name, tool.arguments(1)), [])
    return TurnPlan(reasoning, [TURN2_TEXT, *hermes_markup_pieces(tool.name, tool.arguments(2))])


def _usage() -> dict[str, Any]:
    return {"prompt_tokens": 120, "completion_tokens": 40, "total_tokens": 160}


def chat_stream(model: str, plan: TurnPlan, turn: int, *, include_usage: bool) -> bytes:
    base = {"id": f"chatcmpl-thinking-{turn}", "object": "chat.completion.chunk", "created": 1_700_000_000, "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"reasoning_content": piece}) for piece in plan.reasoning]
    chunks += [chunk({"content": piece}) for piece in plan.content]
    chunks.append(chunk({"content": ""}, "stop"))
    if include_usage:
        chunks.append({**base, "choices": [], "usage": _usage()})
    return sse_body(chunks)


def chat_json(model: str, plan: TurnPlan, turn: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-thinking-{turn}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": plan.content_text, "reasoning_content": plan.reasoning_text},
                "finish_reason": "stop",
            }
        ],
        "usage": _usage(),
    }


def responses_stream(model: str, plan: TurnPlan, turn: int) -> bytes:
    ids = {"resp_id": f"resp_thinking_{turn}", "rs_id": f"rs_thinking_{turn}", "msg_id": f"msg_thinking_{turn}"}
    events = responses_events(model, plan.content, reasoning_pieces=plan.reasoning, **ids)
    return responses_sse(number_events(events))


# --------------------------------------------------------------------------
# The responder
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Exchange:
    """One request the backend answered, with what it made of it."""

    request: RecordedRequest
    api: Api
    turn: int
    status: int
    error: str | None
    stream: bool

    @property
    def body(self) -> dict[str, Any]:
        return self.request.json if isinstance(self.request.json, dict) else {}

    @property
    def history(self) -> list[dict[str, Any]]:
        """Chat `messages` or Responses `input` items (a string input is one user message)."""
        items = self.body.get("messages" if self.api == "chat" else "input")
        if isinstance(items, str):
            return [{"type": "message", "role": "user", "content": items}]
        return [item for item in items or () if isinstance(item, dict)]


def error_script(status: int, message: str) -> Script:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error"}}).encode()
    return Script(status=status, headers=(("content-type", "application/json"),), chunks=(body,), framing="content-length")


class RecordingResponder:
    """A responder for `ScriptedUpstream.add_responder` serving one model name, keeping every
    exchange (a thread-safe list: the upstream answers on a thread per connection)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._lock = threading.Lock()
        self._exchanges: list[Any] = []

    def register(self, upstream: ScriptedUpstream) -> RecordingResponder:
        upstream.add_responder(self.model, self)
        return self

    @property
    def exchanges(self) -> list[Any]:
        with self._lock:
            return list(self._exchanges)

    def _record(self, exchange: Any) -> None:
        with self._lock:
            self._exchanges.append(exchange)


class ThinkingBackend(RecordingResponder):
    """Responder for one model name: `ThinkingBackend(model).register(upstream)`."""

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self.flavour = flavour_of(model)

    @property
    def errors(self) -> list[str]:
        return [e.error for e in self.exchanges if e.error is not None]

    def __call__(self, request: RecordedRequest) -> Script:
        body = request.json if isinstance(request.json, dict) else {}
        path = request.path.split("?", 1)[0]
        api: Api = "responses" if path.endswith("/responses") else "chat"
        stream = bool(body.get("stream"))
        if api == "chat":
            history = body.get("messages")
            results = sum(1 for m in history or () if isinstance(m, dict) and m.get("role") == "tool")
            error = check_chat(history, self.flavour)
        else:
            history = body.get("input")
            items = history if isinstance(history, list) else ()
            results = sum(1 for i in items if isinstance(i, dict) and i.get("type") == "function_call_output")
            error = check_responses(history, self.flavour)
        turn = min(results, 2) + 1
        if not path.endswith(("/chat/completions", "/responses")):
            error = f"no route for {request.method} {path}"
        status = 200 if error is None else (404 if error.startswith("no route") else 400)
        self._record(Exchange(request, api, turn, status, error, stream))
        if error is not None:
            return error_script(status, error)

        plan = plan_turn(turn, pick_tool(body.get("tools")))
        sse = (("content-type", "text/event-stream"), ("cache-control", "no-cache"))
        if api == "responses":
            if stream:
                return Script(headers=sse, chunks=(responses_stream(self.model, plan, turn),))
            payload = response_json(self.model, plan.content_text or None, reasoning=plan.reasoning_text)
            return Script(headers=(("content-type", "application/json"),), chunks=(json.dumps(payload).encode(),), framing="content-length")
        if stream:
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
            data = chat_stream(self.model, plan, turn, include_usage=include_usage)
            # One write per SSE event, as a streaming server sends them.
            events = [part + b"\n\n" for part in data.split(b"\n\n") if part]
            return Script(headers=sse, chunks=tuple(events))
        payload = chat_json(self.model, plan, turn)
        return Script(headers=(("content-type", "application/json"),), chunks=(json.dumps(payload).encode(),), framing="content-length")


def assistant_turns(exchange: Exchange) -> list[tuple[int, dict[str, Any]]]:
    """(index, message) of the assistant messages of a Chat request's history."""
    return [(i, m) for i, m in enumerate(exchange.history) if m.get("role") == "assistant"]


def history_call_ids(exchange: Exchange) -> list[str]:
    """Every tool-call id in a request's history: assistant calls and tool results, Chat or
    Responses."""
    ids: list[str] = []
    for item in exchange.history:
        for call in item.get("tool_calls") or ():
            ids.append(call.get("id"))
        if item.get("role") == "tool":
            ids.append(item.get("tool_call_id"))
        if item.get("type") in ("function_call", "function_call_output"):
            ids.append(item.get("call_id"))
    return ids
