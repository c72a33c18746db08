"""What the Python clients share: the shell tool they run, and the prompt. Runs in the clients'
own venv (tests/clients/requirements.txt), never in the project's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

BASE_URL = os.environ["TOOLSHIM_BASE_URL"]
MODEL = os.environ["TOOLSHIM_MODEL"]
API_KEY = os.environ["OPENAI_API_KEY"]
SYSTEM = "You are a careful assistant. Use the tools to run checks."


def prompt(model: str = MODEL) -> str:
    """The first user message, unique per test (the model name is), so no two tests share a
    conversation in toolshim's memory."""
    return f"Run the two checks for {model}, then tell me what they printed."


def run_shell_command(command: str) -> str:
    """Run a shell command and return what it printed."""
    output = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=10).stdout
    report("run_shell", {"command": command}, output)
    return output


def report(name: str, args: dict, output: str) -> None:
    print(f"TOOL {name} {json.dumps(args)} -> {output.strip()}", flush=True)


def final(text: str) -> None:
    print(f"FINAL: {text}", flush=True)


def fail(error: BaseException) -> None:
    status = getattr(error, "status_code", "") or getattr(getattr(error, "response", None), "status_code", "")
    body = getattr(error, "body", None)
    print(f"ERROR: {status} {error} {json.dumps(body) if body is not None else ''}", file=sys.stderr, flush=True)
    sys.exit(1)
