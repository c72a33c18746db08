"""Runs one real agent client against a proxy and reads what it did.

Every client declares a shell tool, runs what the model asks for, and prints (or, for Codex and
Claude Code, reports as JSON events) each tool run and its final answer. `ClientRun` reads that
into the same shape for every client: the outputs of the tools it ran, its final answer, its exit
code and whatever it said about errors; for the Anthropic clients also the content blocks of
every message they received.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from thinking_backend import STEP_OUTPUTS

CLIENTS_DIR = Path(__file__).resolve().parent
NODE_DIR = CLIENTS_DIR / "node"
PYTHON_DIR = CLIENTS_DIR / "python"
RUN_TIMEOUT = 120

Kind = Literal["node", "python", "codex", "claude"]

# Codex features that reach the internet or add tools and requests the loop does not need
# (plugin sync runs `git ls-remote https://github.com/…`; model discovery, app and update checks).
CODEX_DISABLED_FEATURES = (
    "plugins",
    "remote_plugin",
    "plugin_sharing",
    "apps",
    "api_key_model_discovery",
    "tool_suggest",
    "in_app_updates",
    "image_generation",
    "browser_use",
    "computer_use",
    "goals",
    "multi_agent",
    "shell_snapshot",
    "skill_mcp_dependency_install",
    "memories",
    "hooks",
)


@dataclass(frozen=True)
class Client:
    name: str
    kind: Kind
    script: str = ""
    env: tuple[tuple[str, str], ...] = ()
    streams: bool = True  # asks for SSE (else a JSON body)

    def __str__(self) -> str:
        return self.name


@dataclass
class ClientRun:
    returncode: int
    stdout: str
    stderr: str
    tool_outputs: list[str] = field(default_factory=list)
    final: str | None = None
    errors: list[str] = field(default_factory=list)
    # Anthropic clients: every content block of the messages received, in order.
    blocks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def output(self) -> str:
        return f"{self.stdout}\n{self.stderr}"

    def describe(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout[-6000:]}\n--- stderr\n{self.stderr[-6000:]}"

    def ran_both_steps(self) -> bool:
        """The two tool runs happened, in order, and printed the backend's markers."""
        return len(self.tool_outputs) == 2 and all(
            marker in out for marker, out in zip(STEP_OUTPUTS, self.tool_outputs)
        )


def _read_printed(run: ClientRun) -> None:
    for line in run.stdout.splitlines():
        if line.startswith("TOOL ") and " -> " in line:
            run.tool_outputs.append(line.split(" -> ", 1)[1])
        elif line.startswith("FINAL: "):
            run.final = line[len("FINAL: ") :]
        elif line.startswith("MESSAGE "):
            run.blocks += json.loads(line[len("MESSAGE ") :]).get("content") or []
    run.errors += [line[len("ERROR: ") :] for line in run.stderr.splitlines() if line.startswith("ERROR: ")]


def _read_codex_events(run: ClientRun) -> None:
    """`codex exec --json`: one event a line; command_execution and agent_message items, and
    error / turn.failed events."""
    for line in run.stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        item = event.get("item") or {}
        if event.get("type") == "item.completed" and item.get("type") == "command_execution":
            run.tool_outputs.append(item.get("aggregated_output", ""))
        elif event.get("type") == "item.completed" and item.get("type") == "agent_message":
            run.final = item.get("text")
        elif event.get("type") == "turn.failed":
            run.errors.append(json.dumps(event.get("error")))
        elif event.get("type") == "error":
            run.errors.append(event.get("message", ""))


def _read_claude_events(run: ClientRun) -> None:
    """`claude -p --output-format stream-json --verbose`: one event a line; `assistant` events
    carry the blocks received (one block each), `user` events the tool_result blocks of the tools
    Claude Code ran, and the last, `result`, its final answer (or `is_error` and what went
    wrong)."""
    for line in run.stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        content = (event.get("message") or {}).get("content") if isinstance(event.get("message"), dict) else None
        blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
        if event.get("type") == "assistant":
            run.blocks += blocks
        elif event.get("type") == "user":
            run.tool_outputs += [_result_text(b.get("content")) for b in blocks if b.get("type") == "tool_result"]
        elif event.get("type") == "result":
            if event.get("is_error") or event.get("subtype") != "success":
                run.errors.append(json.dumps({k: event.get(k) for k in ("subtype", "api_error_status", "result", "errors")}))
            else:
                run.final = event.get("result")


def _result_text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content)


def claude_code_env(base_url: str, model: str, home: Path) -> dict[str, str]:
    """Claude Code offline: the proxy as its API, a test key (no login), every model alias on the
    test's model, no update, telemetry or error reports, and a HOME of its own."""
    return {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
    }


def codex_config(base_url: str, model: str) -> str:
    return f"""\
model = "{model}"
model_provider = "toolshim"
check_for_update_on_startup = false
web_search = "disabled"

[model_providers.toolshim]
name = "toolshim test upstream"
base_url = "{base_url}"
wire_api = "responses"
env_key = "OPENAI_API_KEY"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[feedback]
enabled = false
"""


def run_client(
    client: Client,
    *,
    base_url: str,
    model: str,
    env: dict[str, str],
    workdir: Path,
    python: Path | None = None,
) -> ClientRun:
    """Run `client` to its end against `base_url` (the proxy's /v1; for the Anthropic clients the
    proxy's root, as ANTHROPIC_BASE_URL is), in `workdir`."""
    env = {**env, "TOOLSHIM_BASE_URL": base_url, "TOOLSHIM_MODEL": model, **dict(client.env)}
    workdir.mkdir(parents=True, exist_ok=True)
    if client.kind == "node":
        node = shutil.which("node") or "node"
        cmd = [node, str(NODE_DIR / client.script)]
    elif client.kind == "python":
        assert python is not None
        cmd = [str(python), str(PYTHON_DIR / client.script)]
    elif client.kind == "claude":
        home = workdir / "claude-home"
        home.mkdir(exist_ok=True)
        env.update(claude_code_env(base_url, model, home))
        # `--allowedTools Bash` lets the print mode run Bash without asking (and
        # --dangerously-skip-permissions refuses to run as root).
        cmd = [str(NODE_DIR / "node_modules" / ".bin" / "claude"), "-p",
               f"Run the check for {model} with the Bash tool, then tell me what it printed.",
               "--model", model, "--allowedTools", "Bash", "--max-turns", "4",
               "--output-format", "stream-json", "--verbose", "--no-session-persistence", "--strict-mcp-config"]
    else:
        home = workdir / "codex-home"
        home.mkdir(exist_ok=True)
        (home / "config.toml").write_text(codex_config(base_url, model))
        env["CODEX_HOME"] = str(home)
        env["HOME"] = str(workdir)  # no user profile or ~/.codex of this machine
        # No sandbox: the only commands are the backend's `echo`s, and Codex's bubblewrap sandbox
        # needs user namespaces, which not every CI machine grants.
        cmd = [str(NODE_DIR / "node_modules" / ".bin" / "codex"), "exec", "--json", "--skip-git-repo-check",
               "--ephemeral", "--color", "never", "--sandbox", "danger-full-access"]
        for feature in CODEX_DISABLED_FEATURES:
            cmd += ["--disable", feature]
        cmd.append(f"Run the two checks for {model}, then tell me what they printed.")
    proc = subprocess.run(
        cmd,
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="replace",
        timeout=RUN_TIMEOUT,
    )
    run = ClientRun(proc.returncode, proc.stdout, proc.stderr)
    readers = {"codex": _read_codex_events, "claude": _read_claude_events}
    readers.get(client.kind, _read_printed)(run)
    return run
