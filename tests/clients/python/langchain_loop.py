"""LangChain: ChatOpenAI with bound tools and the usual manual agent loop (invoke, run the
tool_calls, append ToolMessages), not streamed.

Environment: TOOLSHIM_BASE_URL, TOOLSHIM_MODEL, OPENAI_API_KEY.
Prints "TOOL <name> <arguments> -> <output>" per tool run and "FINAL: <text>" at the end; on an
API error prints "ERROR: <status> <message> <body>" and exits 1.
"""

from __future__ import annotations

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from common import API_KEY, BASE_URL, MODEL, SYSTEM, fail, final, prompt, report, run_shell_command


@tool
def run_shell(command: str) -> str:
    """Run a shell command and return what it printed."""
    return run_shell_command(command)


@tool
def read_file(path: str) -> str:
    """Read a text file."""
    output = f"(no file {path})"
    report("read_file", {"path": path}, output)
    return output


TOOLS = {t.name: t for t in (run_shell, read_file)}


def main() -> None:
    llm = ChatOpenAI(model=MODEL, base_url=BASE_URL, api_key=API_KEY, max_retries=0, timeout=30)
    llm_with_tools = llm.bind_tools(list(TOOLS.values()))
    messages = [SystemMessage(SYSTEM), HumanMessage(prompt())]
    for _ in range(6):
        ai = llm_with_tools.invoke(messages)
        messages.append(ai)
        if not ai.tool_calls:
            final(ai.text if isinstance(ai.text, str) else ai.text())
            return
        for call in ai.tool_calls:
            messages.append(TOOLS[call["name"]].invoke(call))
    raise RuntimeError("no final answer after 6 steps")


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # noqa: BLE001 - report whatever the client raised
        fail(error)
