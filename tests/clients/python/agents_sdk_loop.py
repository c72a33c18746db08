"""The OpenAI Agents SDK with OpenAIChatCompletionsModel against the proxy, streamed: the Runner
runs the tool loop itself.

Environment: TOOLSHIM_BASE_URL, TOOLSHIM_MODEL, OPENAI_API_KEY.
Prints "TOOL <name> <arguments> -> <output>" per tool run and "FINAL: <text>" at the end; on an
API error prints "ERROR: <status> <message> <body>" and exits 1.
"""

from __future__ import annotations

import asyncio

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from common import API_KEY, BASE_URL, MODEL, SYSTEM, fail, final, prompt, report, run_shell_command

set_tracing_disabled(True)  # traces would go to api.openai.com


@function_tool
def run_shell(command: str) -> str:
    """Run a shell command and return what it printed.

    Args:
        command: The command line.
    """
    return run_shell_command(command)


@function_tool
def read_file(path: str) -> str:
    """Read a text file."""
    output = f"(no file {path})"
    report("read_file", {"path": path}, output)
    return output


async def main() -> None:
    client = AsyncOpenAI(base_url=BASE_URL, api_key=API_KEY, max_retries=0, timeout=30)
    agent = Agent(
        name="checker",
        instructions=SYSTEM,
        tools=[run_shell, read_file],
        model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
    )
    result = Runner.run_streamed(agent, prompt(), max_turns=6)
    async for _event in result.stream_events():
        pass
    final(str(result.final_output))


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as error:  # noqa: BLE001 - report whatever the SDK raised
        fail(error)
