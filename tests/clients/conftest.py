"""The real agent clients, installed on demand and cached between runs.

The Python clients (requirements.txt) get a venv of their own in `.cache/python/`: their openai
and h11 pins conflict with mitmproxy's, so they cannot share the project's venv. The node clients
(node/package.json, node/package-lock.json) are installed with `npm ci` into
`node/node_modules/`, where node's module resolution finds them from the scripts beside it. Both
folders are gitignored and carry a stamp: a hash of the pins plus the interpreter's version.
A session installs only when the stamp differs, under a file lock (two pytest processes never
install at once); the stamp is written last, so an interrupted install is redone.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CLIENTS_DIR = Path(__file__).resolve().parent
CACHE_DIR = CLIENTS_DIR / ".cache"
NODE_DIR = CLIENTS_DIR / "node"
PYTHON_DIR = CLIENTS_DIR / "python"
REQUIREMENTS = CLIENTS_DIR / "requirements.txt"
STAMP = ".toolshim-install-key"
INSTALL_TIMEOUT = 900

if str(CLIENTS_DIR) not in sys.path:
    sys.path.insert(0, str(CLIENTS_DIR))


def _key(*parts: bytes | str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()


@contextmanager
def _install_lock() -> Iterator[None]:
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / "install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(cmd: list[str], *, cwd: Path | None = None, what: str) -> None:
    proc = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, stdin=subprocess.DEVNULL
    )
    if proc.returncode != 0:
        pytest.fail(
            f"installing {what} failed ({' '.join(cmd)} exited {proc.returncode}):\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}",
            pytrace=False,
        )


def _installed(stamp: Path, key: str) -> bool:
    try:
        return stamp.read_text() == key
    except OSError:
        return False


def _report(what: str, started: float) -> None:
    # Shown with -s, and in the log of a failing test.
    print(f"\n[tests/clients] installed {what} in {time.monotonic() - started:.1f}s", file=sys.stderr)


@pytest.fixture(scope="session")
def client_python() -> Path:
    """The interpreter of the clients' venv, with openai-agents, langchain-openai and anthropic."""
    venv = CACHE_DIR / "python"
    python = venv / "bin" / "python"
    key = _key(REQUIREMENTS.read_bytes(), sys.version, platform.machine())
    with _install_lock():
        if _installed(venv / STAMP, key) and python.exists():
            return python
        started = time.monotonic()
        shutil.rmtree(venv, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(venv)], what="the clients' venv")
        _run(
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-q",
             "-r", str(REQUIREMENTS)],
            what="the Python clients",
        )
        (venv / STAMP).write_text(key)
        _report("the Python clients", started)
    return python


@pytest.fixture(scope="session")
def node_clients() -> Path:
    """node/ with its node_modules installed: openai, ai, @ai-sdk/openai-compatible, @openai/codex,
    @anthropic-ai/sdk and @anthropic-ai/claude-code (whose postinstall puts the native binary of
    this platform in place of its bin/claude.exe)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("node and npm are needed for tests/clients (Node 20 or newer)", pytrace=False)
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout
    lock = NODE_DIR / "package-lock.json"
    key = _key((NODE_DIR / "package.json").read_bytes(), lock.read_bytes(), version, platform.machine())
    modules = NODE_DIR / "node_modules"
    with _install_lock():
        if _installed(modules / STAMP, key):
            return NODE_DIR
        started = time.monotonic()
        _run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_DIR, what="the node clients")
        (modules / STAMP).write_text(key)
        _report("the node clients", started)
    return NODE_DIR


@pytest.fixture(scope="session")
def client_env() -> dict[str, str]:
    """The environment of every client: test keys, no telemetry, and no way out of this machine.

    Proxy variables point at the discard port, so a client that tried to reach the internet
    (update checks, telemetry, model catalogues) fails at once on this machine instead of leaving
    it; NO_PROXY keeps the loopback direct.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "LANGCHAIN_", "LANGSMITH_", "CODEX_", "PYTEST_", "ANTHROPIC_", "CLAUDE"))
        and k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
    }
    dead = "http://127.0.0.1:9"
    env.update(
        OPENAI_API_KEY="test-key",
        ANTHROPIC_API_KEY="test-key",
        HTTP_PROXY=dead,
        HTTPS_PROXY=dead,
        ALL_PROXY=dead,
        http_proxy=dead,
        https_proxy=dead,
        all_proxy=dead,
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        OPENAI_AGENTS_DISABLE_TRACING="1",
        LANGCHAIN_TRACING_V2="false",
        LANGSMITH_TRACING="false",
        DO_NOT_TRACK="1",
        NO_UPDATE_NOTIFIER="1",
        npm_config_update_notifier="false",
        PYTHONUNBUFFERED="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env
