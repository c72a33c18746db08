"""The `anthropic` Python SDK: a tool loop as its docs write it. Each turn is a
`client.messages.stream(...)` read to `get_final_message()`; the tool_use blocks are run and the
assistant's content goes back as it came, followed by a user message of tool_result blocks.

Environment: TOOLSHIM_BASE_URL (the proxy, no /v1), TOOLSHIM_MODEL, ANTHROPIC_API_KEY.
Prints "MESSAGE <json>" per message received, "TOOL <name> <arguments> -> <output>" per tool run
and "FINAL: <text>" at the end (newlines as spaces); on an API error prints
"ERROR: <status> <message> <body>" and exits 1.
"""

from __future__ import annotations

import json
import os

import anthropic

from common import BASE_URL, MODEL, SYSTEM, fail, final, report, run_shell_command

TOOLS = [
    {
        "name": "run_shell",
        "description": "Run a shell command and return what it printed.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The command line."}},
            "required": ["command"],
        },
    },
    {
        "name": "read_file",
        "description": "Read a text file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
]


def run_tool(name: str, args: dict) -> str:
    if name == "run_shell":
        return run_shell_command(args["command"])
    output = f"(no file {args.get('path')})" if name == "read_file" else f"unknown tool {name}"
    report(name, args, output)
    return output


def main() -> None:
    client = anthropic.Anthropic(base_url=BASE_URL, api_key=os.environ["ANTHROPIC_API_KEY"], max_retries=0, timeout=30)
    messages: list[dict] = [{"role": "user", "content": f"Run the check for {MODEL}, then tell me what it printed."}]
    for _ in range(6):
        with client.messages.stream(model=MODEL, max_tokens=1024, system=SYSTEM, messages=messages, tools=TOOLS) as stream:
            message = stream.get_final_message()
        content = [block.model_dump(mode="json", exclude_none=True) for block in message.content]
        print(f"MESSAGE {json.dumps({'stop_reason': message.stop_reason, 'content': content})}", flush=True)
        calls = [block for block in message.content if block.type == "tool_use"]
        if not calls:
            final("".join(block.text for block in message.content if block.type == "text").replace("\n", " "))
            return
        messages.append({"role": "assistant", "content": message.content})
        messages.append({
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": run_tool(call.name, call.input)} for call in calls],
        })
    raise RuntimeError("no final answer after 6 steps")


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # noqa: BLE001 - report whatever the SDK raised
        fail(error)
