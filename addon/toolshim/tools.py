"""What the request told us: the declared tools and the conversation's tool-call history.

Both API shapes of a tool declaration are normalised into one registry:
Chat Completions `{"type": "function", "function": {"name", "parameters", "strict", ...}}` and
Responses `{"type": "function", "name", "parameters", "strict", ...}`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from .backends import reasoning_preopened

# OpenAI's rule for function names; dots never occur, hyphens do (MCP tools).
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_KIMI_COUNTER = re.compile(r":(\d+)\s*$")


@dataclass(slots=True, frozen=True)
class ToolSpec:
    name: str
    parameters: dict[str, Any] | None = None
    strict: bool = False


@dataclass(slots=True)
class RequestContext:
    """Everything the rewrite of one response needs to know about its request."""

    tools: dict[str, ToolSpec] = field(default_factory=dict)
    # The Kimi `:N` suffix counts tool calls over the whole conversation; minted ids continue it.
    next_kimi_counter: int = 0
    tool_choice_none: bool = False  # `tool_choice: "none"`: no markup becomes a call
    parallel_tool_calls: bool = True  # false: only the first call of a response becomes a call
    model: str = ""  # picks the dialects and whether reasoning starts pre-opened
    # Set from the addon's options: the dialects to run (None: by model), whether the output
    # starts inside reasoning (read from the request and the model, backends.py; the option
    # overrides it; None: the lexers' table by model), and the Chat field reasoning moved out of
    # `content` goes to (None: the one upstream uses, else `reasoning_content`).
    dialects: tuple[str, ...] | None = None
    reasoning_preopened: bool | None = None
    reasoning_field: str | None = None
    # Seed 002's non-OpenAI additions, off by default (options toolshim_extensions and
    # toolshim_parse_error_chunk): `extensions` in non-streaming Chat bodies, and a final
    # `finish_reason: "error"` chunk when markup failed to parse as a call.
    extensions: bool = False
    parse_error_chunk: bool = False
    call_id_prefix: str = "call_"  # minted ids: `call_` (OpenAI), `toolu_` (Anthropic Messages)

    @classmethod
    def from_body(cls, body: bytes | None) -> RequestContext:
        """Read a request body; anything unreadable gives an empty context (no tools known)."""
        if not body:
            return cls()
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError:
            return cls()
        return cls.from_request(request)

    @classmethod
    def from_request(cls, request: Any) -> RequestContext:
        """Read a parsed request body."""
        if not isinstance(request, dict):
            return cls()
        choice = request.get("tool_choice")
        tools = _declared_tools(request.get("tools"))
        # Anthropic: {"type": "none" | "auto" | "any" | "tool", "name", "disable_parallel_tool_use"}
        anthropic_choice = choice if isinstance(choice, dict) and choice.get("type") in ("none", "auto", "any", "tool") else {}
        if anthropic_choice.get("type") == "tool" and anthropic_choice.get("name") in tools:
            tools = {anthropic_choice["name"]: tools[anthropic_choice["name"]]}  # that tool alone
        return cls(
            tools=tools,
            next_kimi_counter=_next_counter(request),
            tool_choice_none=choice == "none" or anthropic_choice.get("type") == "none",
            parallel_tool_calls=request.get("parallel_tool_calls") is not False and anthropic_choice.get("disable_parallel_tool_use") is not True,
            model=request["model"] if isinstance(request.get("model"), str) else "",
            reasoning_preopened=reasoning_preopened(request["model"] if isinstance(request.get("model"), str) else "", request),
        )


def _declared_tools(tools: Any) -> dict[str, ToolSpec]:
    registry: dict[str, ToolSpec] = {}
    if not isinstance(tools, list):
        return registry
    for tool in tools:
        # Anthropic's custom tools have no type or "custom"; its server tools have versioned types.
        if not isinstance(tool, dict) or tool.get("type", "function") not in ("function", "custom"):
            continue
        spec = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        name = spec.get("name")
        if not isinstance(name, str) or not name:
            continue
        parameters = spec.get("parameters", spec.get("input_schema"))  # OpenAI, Anthropic
        registry[name] = ToolSpec(
            name=name,
            parameters=parameters if isinstance(parameters, dict) else None,
            strict=spec.get("strict") is True,
        )
    return registry


def _next_counter(request: dict[str, Any]) -> int:
    """One past the highest Kimi counter in the ids of the conversation so far."""
    highest = -1
    for item in _history_items(request):
        if not isinstance(item, dict):
            continue
        ids = [item.get("tool_call_id"), item.get("call_id")]
        for call in item.get("tool_calls") or ():
            if isinstance(call, dict):
                ids.append(call.get("id"))
        for block in item.get("content") if isinstance(item.get("content"), list) else ():
            if isinstance(block, dict):  # Anthropic: tool_use and tool_result blocks
                ids += [block.get("id"), block.get("tool_use_id")]
        for call_id in ids:
            if isinstance(call_id, str) and (m := _KIMI_COUNTER.search(call_id)):
                highest = max(highest, int(m.group(1)))
    return highest + 1


def _history_items(request: dict[str, Any]) -> list[Any]:
    for key in ("messages", "input"):  # Chat Completions, Responses
        items = request.get(key)
        if isinstance(items, list):
            return items
    return []
