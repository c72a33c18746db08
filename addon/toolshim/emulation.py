"""Tool calling for backends that have none (seed 001): the request side.

The backend only understands text. So the request that goes upstream loses `tools`,
`tool_choice` and `parallel_tool_calls`; instead the model is taught, in its system prompt
(Chat, and Anthropic's `system`) or `instructions` (Responses), to write each call as a block

    <tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>

and the conversation so far is flattened into the same text: earlier calls become the blocks
the model was taught, tool results become `[function_call_output call_id=… output=…]` lines.
The answer is then repaired by the ordinary sentinel dialect against the original request's
tools, so the client sees real tool calls.

A tool result or a user message could carry a `<tool_call>` block itself (a web page, a file):
such tags are neutralised (`<tool_call>` → `<tool-call>`) so that what a tool returned can never
be repeated by the model into a call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from .tools import RequestContext, ToolSpec

CHAT, RESPONSES, MESSAGES = "chat", "responses", "messages"
_SENTINEL_TAG = re.compile(r"<(/?)tool_call>")


def neutralise(text: str) -> str:
    """`<tool_call>` and `</tool_call>` become `<tool-call>` and `</tool-call>`: still readable,
    never a tag the sentinel dialect reads."""
    return _SENTINEL_TAG.sub(r"<\1tool-call>", text)


def _compact(value: Any) -> str:
    return orjson.dumps(value).decode()


def sentinel_block(name: str, arguments: str) -> str:
    """A call as the model was taught to write it (seed 001: arguments as a JSON string)."""
    return "<tool_call>" + _compact({"name": name, "arguments": arguments}) + "</tool_call>"


def output_line(call_id: str, output: str) -> str:
    return f"[function_call_output call_id={call_id} output={neutralise(output)}]"


# -- the injected rules -------------------------------------------------------------------------


def tool_choice_rule(tool_choice: Any) -> str:
    """One sentence per `tool_choice` (seed 001, "Injection content")."""
    if tool_choice == "none":
        return "Do not call any tool in this reply: never emit <tool_call>. Answer in text."
    if tool_choice == "required":
        return "You MUST call at least one tool in this reply."
    forced = _forced_name(tool_choice)
    if forced is not None:
        return f"You MUST call the tool `{forced}` in this reply; if you call a tool, it must be `{forced}`."
    return "Call a tool when it helps; otherwise answer in text."


def _forced_name(tool_choice: Any) -> str | None:
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        function = tool_choice.get("function") if isinstance(tool_choice.get("function"), dict) else tool_choice
        name = function.get("name")
        return name if isinstance(name, str) else None
    return None


def manifest(tools: dict[str, ToolSpec], descriptions: dict[str, str], tool_choice: Any, parallel: bool) -> str:
    """The tool manifest and formatting rules the model is given."""
    lines = [
        "# Tools",
        "",
        "You can call the tools listed below. To call one, write exactly this, on its own, once per call:",
        '<tool_call>{"name": "TOOL_NAME", "arguments": "ARGUMENTS"}</tool_call>',
        'where ARGUMENTS is the JSON object of arguments, encoded as a JSON string: "{\\"key\\": \\"value\\"}".',
        "",
        "Rules:",
        "- Only call tools with <tool_call>...</tool_call> blocks; never describe a call in any other way.",
        "- No Markdown fences around a block. Text outside blocks is shown to the user.",
        "- After your calls, stop and wait. Each result comes back as [function_call_output call_id=... output=...].",
        f"- {tool_choice_rule(tool_choice)}",
    ]
    if not parallel:
        lines.append("- Call at most one tool in this reply.")
    if any(spec.strict for spec in tools.values()):
        lines.append("- For tools marked strict, the arguments MUST conform exactly to the schema.")
    lines += ["", "Tools:"]
    for name, spec in tools.items():
        strict = " (strict)" if spec.strict else ""
        description = descriptions.get(name, "")
        lines.append(f"- {name}{strict}: {description}".rstrip(": ").rstrip())
        lines.append(f"  parameters: {_compact(spec.parameters or {'type': 'object'})}")
    return "\n".join(lines)


# -- the request rewrite ------------------------------------------------------------------------


@dataclass(slots=True)
class EmulatedRequest:
    """What the emulation did to one request (for the log and the flow's metadata)."""

    body: dict[str, Any]  # what goes upstream
    context: RequestContext  # the original request's tools and policy: the answer is read with it
    tool_choice: Any = None  # the original request's
    tools: list[str] = field(default_factory=list)
    echoed_calls: int = 0  # earlier calls flattened (assistant tool_calls, function_call items)
    outputs: int = 0  # tool results flattened
    neutralised: int = 0  # sentinel tags made harmless in results and user text
    dropped_items: int = 0  # Responses input items a text backend cannot take (reasoning)

    @property
    def requires_call(self) -> bool:
        """The client demanded a call (`required` or a forced function)."""
        return self.tool_choice == "required" or _forced_name(self.tool_choice) is not None

    def telemetry(self) -> dict[str, Any]:
        return {
            "tools": self.tools,
            "echoed_calls": self.echoed_calls,
            "outputs": self.outputs,
            "neutralised": self.neutralised,
            "dropped_items": self.dropped_items,
        }


def openai_tool_choice(tool_choice: Any) -> Any:
    """Anthropic's `tool_choice` in OpenAI's words (`any` is `required`, `tool` forces a name)."""
    if isinstance(tool_choice, dict) and tool_choice.get("type") in ("none", "auto", "any", "tool"):
        kind = tool_choice["type"]
        if kind == "tool":
            return {"type": "function", "name": tool_choice.get("name")}
        return "required" if kind == "any" else kind
    return tool_choice


def emulate_request(request: dict[str, Any], api: str) -> EmulatedRequest:
    """The text-only request for `request` (a parsed Chat, Responses or Messages body); it is
    not changed."""
    context = RequestContext.from_request(request)
    body = {k: v for k, v in request.items() if k not in ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call")}
    tool_choice = openai_tool_choice(request.get("tool_choice"))
    result = EmulatedRequest(body, context, tool_choice, tools=list(context.tools))
    if api == MESSAGES:
        messages = request.get("messages")
        if isinstance(messages, list):
            body["messages"] = list(_flatten_messages(messages, result))
        if context.tools:
            rules = manifest(context.tools, _descriptions(request.get("tools")), tool_choice, context.parallel_tool_calls)
            system = body.get("system")
            if isinstance(system, list):  # text blocks (cache_control and all): one more
                body["system"] = [*system, {"type": "text", "text": rules}]
            else:
                body["system"] = f"{system}\n\n{rules}" if isinstance(system, str) and system else rules
        return result
    if api == CHAT:
        messages = request.get("messages")
        if isinstance(messages, list):
            body["messages"] = list(_flatten_chat(messages, result))
    else:
        items = request.get("input")
        if isinstance(items, list):
            body["input"] = list(_flatten_responses(items, result))
        elif isinstance(items, str):
            body["input"] = _neutralised(items, result)
    if context.tools:
        rules = manifest(context.tools, _descriptions(request.get("tools")), tool_choice, context.parallel_tool_calls)
        if api == CHAT:
            body["messages"] = _with_system_prompt(body.get("messages") or [], rules)
        else:
            instructions = body.get("instructions")
            body["instructions"] = f"{instructions}\n\n{rules}" if isinstance(instructions, str) and instructions else rules
    return result


def _descriptions(tools: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, dict):
            spec = tool.get("function") if isinstance(tool.get("function"), dict) else tool
            if isinstance(spec.get("name"), str) and isinstance(spec.get("description"), str):
                out[spec["name"]] = " ".join(spec["description"].split())
    return out


def _neutralised(text: str, result: EmulatedRequest) -> str:
    safe = neutralise(text)
    if safe != text:
        result.neutralised += 1
    return safe


def _text_of(content: Any) -> str:
    """A message's content as text: a string, or the text of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "") if isinstance(part, dict) and isinstance(part.get("text"), str) else ""
            for part in content
        )
    return "" if content is None else _compact(content)


def _with_system_prompt(messages: list[Any], rules: str) -> list[Any]:
    """The rules join the first system/developer message, or open the conversation as one."""
    first = messages[0] if messages else None
    if isinstance(first, dict) and first.get("role") in ("system", "developer") and isinstance(first.get("content"), str):
        return [{**first, "content": f"{first['content']}\n\n{rules}"}, *messages[1:]]
    return [{"role": "system", "content": rules}, *messages]


class _Transcript(list):
    """The flattened conversation, counting what it flattens into `result`. Consecutive tool
    results share one user turn, since chat templates want user and assistant turns to alternate."""

    def __init__(self, result: EmulatedRequest) -> None:
        super().__init__()
        self._result = result
        self._results_turn: dict[str, Any] | None = None

    def add_result(self, call_id: Any, output: str) -> None:
        self._result.outputs += 1
        if neutralise(output) != output:
            self._result.neutralised += 1
        line = output_line(str(call_id or ""), output)
        if self and self[-1] is self._results_turn:
            self._results_turn["content"] += "\n" + line
        else:
            self._results_turn = {"role": "user", "content": line}
            self.append(self._results_turn)

    def add_user(self, message: dict[str, Any]) -> None:
        """A user turn, its text (a string or text parts) with sentinel tags neutralised."""
        content = message.get("content")
        if isinstance(content, str):
            message = {**message, "content": _neutralised(content, self._result)}
        elif isinstance(content, list):
            parts = [
                {**p, "text": _neutralised(p["text"], self._result)} if isinstance(p, dict) and isinstance(p.get("text"), str) else p
                for p in content
            ]
            message = {**message, "content": parts}
        self.append(message)


def _flatten_chat(messages: list[Any], result: EmulatedRequest) -> list[Any]:
    out = _Transcript(result)
    for message in messages:
        if not isinstance(message, dict):
            out.append(message)
            continue
        role = message.get("role")
        if role == "assistant" and isinstance(message.get("tool_calls"), list):
            blocks = []
            for call in message["tool_calls"]:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict) and isinstance(function.get("name"), str):
                    blocks.append(sentinel_block(function["name"], str(function.get("arguments") or "{}")))
                    result.echoed_calls += 1
            text = _text_of(message.get("content"))
            flattened = {k: v for k, v in message.items() if k not in ("tool_calls", "function_call")}
            flattened["content"] = "\n".join(filter(None, [text, *blocks]))
            out.append(flattened)
        elif role in ("tool", "function"):
            out.add_result(message.get("tool_call_id") or message.get("name"), _text_of(message.get("content")))
        elif role == "user":
            out.add_user(message)
        else:
            out.append(message)
    return out


def _flatten_responses(items: list[Any], result: EmulatedRequest) -> list[Any]:
    out = _Transcript(result)
    for item in items:
        if not isinstance(item, dict):
            out.append(item)
            continue
        kind = item.get("type")
        if kind == "function_call":
            result.echoed_calls += 1
            block = sentinel_block(str(item.get("name")), str(item.get("arguments") or "{}"))
            last = out[-1] if out else None
            if isinstance(last, dict) and last.get("role") == "assistant" and isinstance(last.get("content"), str):
                last["content"] += "\n" + block  # calls after the assistant's text: one turn
            else:
                out.append({"role": "assistant", "content": block})
        elif kind == "function_call_output":
            out.add_result(item.get("call_id"), _text_of(item.get("output")))
        elif kind == "reasoning":
            result.dropped_items += 1  # encrypted or provider-specific: a text backend has no use for it
        elif item.get("role") == "assistant" and kind in (None, "message"):
            out.append({"role": "assistant", "content": _text_of(item.get("content"))})
        elif item.get("role") == "user":
            out.add_user(item)
        else:
            out.append(item)
    return out


def _flatten_messages(messages: list[Any], result: EmulatedRequest) -> list[Any]:
    """Anthropic: tool_use blocks become the blocks the model was taught, tool_result blocks the
    output lines, thinking blocks are dropped (signed for another model, or of no use to a text
    backend); text stays text."""
    out: list[Any] = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            out.append({**message, "content": _neutralised(content, result)} if isinstance(content, str) and message.get("role") == "user" else message)
            continue
        lines = []
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "tool_use" and isinstance(block.get("name"), str):
                result.echoed_calls += 1
                lines.append(sentinel_block(block["name"], _compact(block.get("input") if block.get("input") is not None else {})))
            elif kind == "tool_result":
                result.outputs += 1
                output = _text_of(block.get("content"))
                if neutralise(output) != output:
                    result.neutralised += 1
                lines.append(output_line(str(block.get("tool_use_id") or ""), output))
            elif kind in ("thinking", "redacted_thinking"):
                result.dropped_items += 1
            elif kind == "text" and isinstance(block.get("text"), str):
                lines.append(_neutralised(block["text"], result) if message.get("role") == "user" else block["text"])
            else:  # images, documents: left for a backend that can read them
                lines.append(block)
        if all(isinstance(line, str) for line in lines):
            out.append({**message, "content": "\n".join(lines)})
        else:
            out.append({**message, "content": [{"type": "text", "text": line} if isinstance(line, str) else line for line in lines]})
    return out
