"""Print what a .flow file's LLM responses say, before and after toolshim: `python -m toolshim.show F`.

For each Chat Completions, Responses or Anthropic Messages flow: what the upstream sent (from
the copy toolshim keeps in flow.metadata) and what the client got: text fields, tool calls,
finish_reason; for the Responses API, the output items; for the Messages API, the content
blocks (text, thinking and its signature, tool_use) and the stop_reason.
"""

from __future__ import annotations

import sys
from typing import Any

import orjson
from mitmproxy import http, io

from .apis import MESSAGES, METADATA_KEY, RESPONSES, api_of


def accumulate(body: bytes) -> dict[str, Any]:
    """Choice 0 of a Chat Completions body (SSE stream or JSON), accumulated."""
    result: dict[str, Any] = {"text": {}, "tool_calls": {}, "finish_reason": None}
    if body.lstrip().startswith(b"{"):
        message_choice = orjson.loads(body)["choices"][0]
        message = message_choice["message"]
        for key in ("reasoning_content", "reasoning", "content"):
            if message.get(key):
                result["text"][key] = message[key]
        for i, call in enumerate(message.get("tool_calls") or []):
            result["tool_calls"][i] = {"id": call["id"], "name": call["function"]["name"], "arguments": call["function"]["arguments"]}
        result["finish_reason"] = message_choice.get("finish_reason")
        return result
    for line in body.splitlines():
        if not line.startswith(b"data:") or line[5:].strip().startswith(b"[DONE]"):
            continue
        try:
            chunk = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            continue
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            for key in ("reasoning_content", "reasoning", "content"):
                if isinstance(delta.get(key), str):
                    result["text"][key] = result["text"].get(key, "") + delta[key]
            for entry in delta.get("tool_calls") or []:
                call = result["tool_calls"].setdefault(entry.get("index"), {"id": "", "name": "", "arguments": ""})
                function = entry.get("function") or {}
                call["id"] += entry.get("id") or ""
                call["name"] += function.get("name") or ""
                call["arguments"] += function.get("arguments") or ""
            result["finish_reason"] = choice.get("finish_reason") or result["finish_reason"]
    return result


def response_output(body: bytes) -> list[dict[str, Any]]:
    """The output items of a Responses body: the JSON's, or the terminal event's of a stream."""
    if body.lstrip().startswith(b"{"):
        return orjson.loads(body).get("output") or []
    items: dict[int, dict[str, Any]] = {}
    for line in body.splitlines():
        if not line.startswith(b"data:"):
            continue
        try:
            event = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            continue
        if not isinstance(event, dict):
            continue
        if event.get("type") in ("response.completed", "response.incomplete", "response.failed"):
            return (event.get("response") or {}).get("output") or []
        if event.get("type") == "response.output_item.done":  # a stream cut before its end
            items[event.get("output_index", len(items))] = event.get("item") or {}
    return [items[i] for i in sorted(items)]


def message_content(body: bytes) -> tuple[list[dict[str, Any]], Any]:
    """The content blocks and the stop_reason of a Messages body: the JSON's, or what a client
    accumulates from a stream (blocks by index; a tool_use block's `partial_json` pieces joined
    in `input_json`, and parsed into its `input` when they add up to JSON). A JSON error body
    (`{"type": "error", ...}`) is one block of type "error"."""
    if body.lstrip().startswith(b"{"):
        message = orjson.loads(body)
        if message.get("type") == "error":
            return [message], None
        return [block for block in message.get("content") or [] if isinstance(block, dict)], message.get("stop_reason")
    blocks: dict[Any, dict[str, Any]] = {}
    pieces: dict[Any, str] = {}
    stop_reason = None
    for data in _sse_data(body):
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(event, dict):
            continue
        kind, index = event.get("type"), event.get("index")
        if kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            blocks[index] = dict(event["content_block"])
        elif kind == "content_block_delta" and index in blocks and isinstance(event.get("delta"), dict):
            delta, block = event["delta"], blocks[index]
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + str(delta.get("text", ""))
            elif delta.get("type") == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
            elif delta.get("type") == "signature_delta":
                block["signature"] = delta.get("signature")  # replaces, as the anthropic SDK does
            elif delta.get("type") == "input_json_delta":
                pieces[index] = pieces.get(index, "") + str(delta.get("partial_json", ""))
        elif kind == "message_delta" and isinstance(event.get("delta"), dict):
            stop_reason = event["delta"].get("stop_reason")
    for index, text in pieces.items():
        blocks[index]["input_json"] = text
        try:
            blocks[index]["input"] = orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return [blocks[index] for index in blocks], stop_reason


def _sse_data(body: bytes) -> list[bytes]:
    """The data of each event of an SSE body (multi-line data joined)."""
    events, data = [], []
    for line in [*body.splitlines(), b""]:
        if not line.strip(b"\r"):
            if data:
                events.append(b"\n".join(data))
            data = []
        elif line.startswith(b"data:"):
            data.append(line[5:].removeprefix(b" "))
    return events


def describe_content(blocks: list[dict[str, Any]], stop_reason: Any, indent: str = "    ") -> str:
    lines = []
    for index, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "tool_use":
            arguments = block["input_json"] if "input_json" in block else orjson.dumps(block.get("input", {})).decode()
            lines.append(f"{indent}[{index}] tool_use: {block.get('name')}({arguments})  id={block.get('id')}")
        elif kind == "thinking":
            signature = block.get("signature")
            signed = f"signature={signature!r}" if signature is not None else "no signature"
            lines.append(f"{indent}[{index}] thinking: {block.get('thinking', '')!r}  {signed}")
        elif kind == "text":
            lines.append(f"{indent}[{index}] text: {block.get('text', '')!r}")
        elif kind == "error":
            lines.append(f"{indent}error: {orjson.dumps(block.get('error')).decode()}")
        else:
            lines.append(f"{indent}[{index}] {kind}")
    if not any(block.get("type") == "error" for block in blocks):
        lines.append(f"{indent}stop_reason: {stop_reason}")
    return "\n".join(lines)


def describe_output(items: list[dict[str, Any]], indent: str = "    ") -> str:
    lines = []
    for index, item in enumerate(items):
        kind = item.get("type")
        if kind == "function_call":
            lines.append(f"{indent}[{index}] function_call: {item.get('name')}({item.get('arguments')})  call_id={item.get('call_id')}")
        else:
            text = "".join(part.get("text", "") for part in item.get("content") or [] if isinstance(part, dict))
            lines.append(f"{indent}[{index}] {kind}: {text!r}")
    return "\n".join(lines) or f"{indent}(no output items)"


def describe(result: dict[str, Any], indent: str = "    ") -> str:
    lines = [f"{indent}{key}: {text!r}" for key, text in result["text"].items() if text]
    for index, call in sorted(result["tool_calls"].items()):
        lines.append(f"{indent}tool_calls[{index}]: {call['name']}({call['arguments']})  id={call['id']}")
    lines.append(f"{indent}finish_reason: {result['finish_reason']}")
    return "\n".join(lines)


SUMMARIES = {
    RESPONSES: lambda body: describe_output(response_output(body)),
    MESSAGES: lambda body: describe_content(*message_content(body)),
}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m toolshim.show FLOW_FILE", file=sys.stderr)
        return 2
    with open(argv[0], "rb") as f:
        for flow in io.FlowReader(f).stream():
            if not isinstance(flow, http.HTTPFlow) or api_of(flow) is None or not flow.response:
                continue
            summary = SUMMARIES.get(api_of(flow), lambda body: describe(accumulate(body)))
            print(f"{flow.request.method} {flow.request.pretty_url} -> {flow.response.status_code}")
            upstream = (flow.metadata.get(METADATA_KEY) or {}).get("upstream")
            try:
                if upstream:
                    print("  upstream sent:")
                    print(summary(upstream))
                print("  client got:" if upstream else "  body:")
                print(summary(flow.response.get_content(strict=False) or b""))
            except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as exc:
                print(f"  (not an LLM body this tool can read: {exc!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
