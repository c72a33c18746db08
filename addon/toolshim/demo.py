"""`toolshim-demo`: toolshim's before and after on bundled flows, with no backend, API key or network.

    toolshim-demo                   the default flows: Kimi, Hermes, Responses API, gpt-oss,
                                    MiniMax on the Anthropic Messages API
    toolshim-demo NAME ...          other flows of flows/ (a .flow file's name, without .flow)
    toolshim-demo --flows DIR NAME  flows of another folder

One real mitmdump runs the addon as a reverse proxy whose upstream is never contacted: mitmproxy's
server replay answers each request with an upstream answer recorded in flows/, and kills any
request it has no answer for. Each flow's recorded request goes through the OpenAI Python SDK
(the Anthropic Python SDK for a Messages API flow: `messages.stream()` → `get_final_message()`);
the demo prints what the upstream sent, leaked markup and all, and the tool calls the SDK read
from what toolshim made of it.

Exit status: 0 when every flow reached the SDK as tool calls with no markup left in its text,
1 when one did not, 2 when the demo could not run (usage, setup), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from mitmproxy import exceptions, http, io

import toolshim

from .apis import CHAT, MESSAGES, RESPONSES, api_of
from .show import accumulate, message_content, response_output

if TYPE_CHECKING:
    from anthropic import Anthropic
    from openai import OpenAI

PROJECT_ROOT = Path(toolshim.__file__).resolve().parents[2]  # from addon/toolshim/__init__.py
ADDON_SCRIPT = PROJECT_ROOT / "addon" / "toolshim.py"
FLOWS_DIR = PROJECT_ROOT / "flows"

# The default tour, one flow per kind of leak, with what a newcomer should see in it.
DEFAULT_FLOWS = {
    "kimi_seed_000_reasoning": "Kimi K2.5 writes two tool calls into its reasoning",
    "sentinel_chat_stream_text_then_two_calls": "Qwen2.5 writes two Hermes <tool_call> blocks into its answer",
    "responses_sentinel_stream_text_call_text": "Qwen3 writes a <tool_call> block between two sentences",
    "dialect_gpt_oss_harmony": "gpt-oss writes its Harmony channels, a call among them, into its answer",
    "messages_minimax_invoke_in_text": "MiniMax-M2.1 writes an <invoke> block between two sentences of a text block",
}

# A discard-port address: in reverse mode mitmdump needs an upstream, and server replay makes
# sure it is never used (nothing listens there, so a request that slipped through would fail).
UNUSED_UPSTREAM = "http://127.0.0.1:9"
BASE_PATH = "/v1"
SDK_PATHS = {CHAT: f"{BASE_PATH}/chat/completions", RESPONSES: f"{BASE_PATH}/responses", MESSAGES: "/v1/messages"}
DEMO_API_KEY = "demo-no-key-needed"  # the SDK insists on a key; nothing checks it
SDK_OPTIONS = {"extra_headers", "extra_query", "extra_body", "timeout"}  # the SDK's, not request fields

API_TITLES = {CHAT: "Chat Completions API", RESPONSES: "Responses API", MESSAGES: "Anthropic Messages API"}
SDK_NAMES = {CHAT: "OpenAI", RESPONSES: "OpenAI", MESSAGES: "Anthropic"}
TEXT_FIELDS = ("reasoning_content", "reasoning", "content")  # Chat text, in show.py's order
TERMINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")

# Markup left in the text the SDK got means a repair failed: the structural markers of the
# dialects in the README (special tokens, the tag dialects' opening tags, Mistral's brackets).
LEFTOVER_MARKUP = re.compile(
    r"<\|[a-z_]+\|>"  # Kimi, gpt-oss Harmony, Llama special tokens
    r"|<｜"  # DeepSeek's fullwidth special tokens
    r"|</?tool_call>|</?minimax:tool_call>|<function[= ]|<invoke\b|<arg_key>"
    r"|\[TOOL_CALLS\]|\[ARGS\]"
)

WIDTH = 100
BREAK_AFTER = re.compile(r".+?(?: |\\n|>(?! )|$)")  # the pieces `wrapped` may break a line after
MAX_SHOWN_TEXT = 480  # characters of one text field; flows of your own may be long
LOG_TAIL_LINES = 25
STARTUP_TIMEOUT = 30.0
LISTENING = re.compile(r"listening at \S*?:(\d+)")


class DemoError(Exception):
    """The demo cannot run: the message says why, for the user."""


# -- the flows ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DemoFlow:
    name: str
    situation: str
    api: str
    request: dict[str, Any]  # the recorded request body
    recorded: http.HTTPFlow  # its response is the upstream's raw answer


def load_flow(folder: Path, name: str) -> DemoFlow:
    """The first answered Chat Completions, Responses or Messages call in `folder/name.flow`."""
    name = name.removesuffix(".flow")
    path = folder / f"{name}.flow"
    if not path.is_file():
        known = sorted(candidate.stem for candidate in folder.glob("*.flow"))
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"did you mean {' or '.join(close)}?" if close else f"the names are those of its {len(known)} .flow files"
        raise DemoError(f"no flow named {name!r} in {folder}; {hint}")
    try:
        with path.open("rb") as file:
            flows = [flow for flow in io.FlowReader(file).stream() if isinstance(flow, http.HTTPFlow)]
    except exceptions.FlowReadException as exc:
        raise DemoError(f"cannot read {path}: {exc}") from exc
    for flow in flows:
        api = api_of(flow)
        if api is None or flow.response is None or not 200 <= flow.response.status_code < 300:
            continue
        try:
            request = orjson.loads(flow.request.get_content(strict=False) or b"")
        except orjson.JSONDecodeError as exc:
            raise DemoError(f"{path}: the recorded request is not JSON ({exc})") from exc
        if not isinstance(request, dict) or not isinstance(request.get("model"), str):
            raise DemoError(f"{path}: the recorded request names no model")
        return DemoFlow(name, DEFAULT_FLOWS.get(name, ""), api, request, flow)
    raise DemoError(f"{path} holds no successful Chat Completions, Responses or Messages call to replay")


def write_replay_file(path: Path, flows: Sequence[DemoFlow]) -> None:
    """The recorded answers for server replay, in the order the demo asks for them.

    Server replay matches a request on scheme, method and path (content, host and port are
    ignored: the SDK serialises the request its own way, and the proxy is not the recording's
    upstream), so every Chat flow has the same key. Answers with one key are served first in,
    first out, each once: asked one at a time and never retried, the n-th request gets the n-th
    answer. The copies get the scheme and path the SDK will use, so that flows recorded against
    any backend (https, another base path) match too.
    """
    with path.open("wb") as file:
        writer = io.FlowWriter(file)
        for demo_flow in flows:
            answer = demo_flow.recorded.copy()
            answer.request.scheme = "http"
            answer.request.path = SDK_PATHS[demo_flow.api]
            writer.add(answer)


# -- mitmdump -------------------------------------------------------------------------------------


def find_mitmdump() -> str:
    """The mitmdump of this Python environment (next to the interpreter), else the one on PATH."""
    for name in ("mitmdump", "mitmdump.exe"):
        candidate = Path(sys.executable).parent / name
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("mitmdump")
    if found is None:
        raise DemoError(f"mitmdump not found next to {sys.executable} or on PATH; install toolshim with: pip install -e '.[demo]'")
    return found


class ReplayProxy:
    """One mitmdump with toolshim in front of server replay, on a free port of 127.0.0.1.

    Its output goes to a log file that is shown only when something fails.
    """

    def __init__(self, executable: str, replay_file: Path, log_file: Path) -> None:
        self.command = [
            executable,
            "--mode", f"reverse:{UNUSED_UPSTREAM}",
            "--listen-host", "127.0.0.1",
            "--listen-port", "0",
            "-s", str(ADDON_SCRIPT),
            "--server-replay", str(replay_file),
            "--set", "server_replay_extra=kill",
            "--set", "server_replay_ignore_content=true",
            "--set", "server_replay_ignore_host=true",
            "--set", "server_replay_ignore_port=true",
            # In reverse mode mitmproxy connects upstream as soon as a client connects, unless
            # told to wait for a request that needs it (none does here).
            "--set", "connection_strategy=lazy",
            "--set", "flow_detail=0",
        ]  # fmt: skip
        self.log_file = log_file
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}{BASE_PATH}"

    @property
    def anthropic_base_url(self) -> str:
        """The Anthropic SDK adds /v1/messages to its base URL."""
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ReplayProxy:
        with self.log_file.open("wb") as log:
            self._process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},  # the port is read from the log
            )
        try:
            self.port = self._wait_until_listening()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _wait_until_listening(self) -> int:
        assert self._process is not None
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if match := LISTENING.search(self.log()):
                return int(match.group(1))
            if self._process.poll() is not None:
                raise DemoError(f"mitmdump exited with status {self._process.returncode}:\n{self.log_tail()}")
            time.sleep(0.05)
        raise DemoError(f"mitmdump did not start listening within {STARTUP_TIMEOUT:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def log(self) -> str:
        return self.log_file.read_text(encoding="utf-8", errors="replace")

    def log_tail(self) -> str:
        return "\n".join(f"  | {line}" for line in self.log().splitlines()[-LOG_TAIL_LINES:])


# -- answers, as the upstream sent them and as the SDK read them ----------------------------------


@dataclass(frozen=True)
class Text:
    label: str  # "content", "reasoning_content = reasoning" (mirrored), "output[0] message"
    text: str


@dataclass(frozen=True)
class Call:
    label: str  # "tool_calls[0]", "output[1] function_call", "content[1] tool_use"
    name: str
    id_key: str  # "id" on Chat Completions and the Messages API, "call_id" on the Responses API
    call_id: str
    arguments: str  # JSON text
    arguments_key: str = "arguments"  # "input" on the Messages API


@dataclass
class Answer:
    entries: list[Text | Call] = field(default_factory=list)
    ending: str = ""  # Chat's finish_reason, Messages' stop_reason; Responses items say it themselves

    @property
    def calls(self) -> list[Call]:
        return [entry for entry in self.entries if isinstance(entry, Call)]


def chat_answer(texts: dict[str, str], calls: list[tuple[str, str, str]], finish_reason: str | None) -> Answer:
    """Chat text fields (a mirrored field shown once) and (id, name, arguments) calls."""
    answer = Answer(ending=f"finish_reason: {finish_reason}")
    for key in TEXT_FIELDS:
        text = texts.get(key) or ""
        if not text:
            continue
        mirror = next((i for i, entry in enumerate(answer.entries) if isinstance(entry, Text) and entry.text == text), None)
        if mirror is None:
            answer.entries.append(Text(key, text))
        else:
            answer.entries[mirror] = Text(f"{answer.entries[mirror].label} = {key}", text)
    for index, (call_id, name, arguments) in enumerate(calls):
        answer.entries.append(Call(f"tool_calls[{index}]", name, "id", call_id, arguments))
    return answer


def responses_answer(items: list[dict[str, Any]]) -> Answer:
    """Responses output items, as plain dicts."""
    answer = Answer()
    for index, item in enumerate(items):
        label = f"output[{index}] {item.get('type')}"
        if item.get("type") == "function_call":
            answer.entries.append(Call(label, item.get("name") or "", "call_id", item.get("call_id") or "", item.get("arguments") or ""))
        else:
            parts = [*(item.get("content") or []), *(item.get("summary") or [])]
            answer.entries.append(Text(label, "".join(part.get("text") or "" for part in parts if isinstance(part, dict))))
    return answer


def messages_answer(blocks: list[dict[str, Any]], stop_reason: Any) -> Answer:
    """Messages content blocks, as plain dicts (a streamed tool_use block's input is shown as its
    pieces joined, `input_json`, JSON or not)."""
    answer = Answer(ending=f"stop_reason: {stop_reason}")
    for index, block in enumerate(blocks):
        kind = block.get("type")
        label = f"content[{index}] {kind}"
        if kind == "tool_use":
            arguments = block["input_json"] if "input_json" in block else orjson.dumps(block.get("input", {})).decode()
            answer.entries.append(Call(label, block.get("name") or "", "id", block.get("id") or "", arguments, "input"))
        else:
            answer.entries.append(Text(label, str(block.get("text") or block.get("thinking") or "")))
    return answer


def recorded_answer(demo_flow: DemoFlow) -> Answer:
    """What the upstream sent: the recorded body, accumulated."""
    assert demo_flow.recorded.response is not None
    body = demo_flow.recorded.response.get_content(strict=False) or b""
    if demo_flow.api == RESPONSES:
        return responses_answer(response_output(body))
    if demo_flow.api == MESSAGES:
        return messages_answer(*message_content(body))
    result = accumulate(body)
    calls = [(call["id"], call["name"], call["arguments"]) for _, call in sorted(result["tool_calls"].items())]
    return chat_answer(result["text"], calls, result["finish_reason"])


def sdk_arguments(method: Callable[..., Any], request: dict[str, Any]) -> dict[str, Any]:
    """The request's keys as arguments of an SDK method; the keys it does not know (backend
    extensions such as `chat_template_kwargs`) go through `extra_body`, as recorded."""
    parameters = inspect.signature(method).parameters
    known = {key: value for key, value in request.items() if key in parameters and key not in SDK_OPTIONS}
    extra_body = {key: value for key, value in request.items() if key not in known}
    return {**known, "extra_body": extra_body}


def ask_chat(client: OpenAI, request: dict[str, Any]) -> Answer:
    """Send a Chat Completions request; choice 0 of what the SDK parsed."""
    result = client.chat.completions.create(**sdk_arguments(client.chat.completions.create, request))
    if request.get("stream"):
        with result as chunks:
            return chat_answer(*accumulated(chunks))
    choice = result.choices[0]
    calls = [(call.id, call.function.name, call.function.arguments) for call in choice.message.tool_calls or []]
    return chat_answer(text_fields(choice.message), calls, choice.finish_reason)


def text_fields(message: Any) -> dict[str, str]:
    """The text fields of an SDK message or delta. reasoning_content and reasoning are not
    OpenAI fields: the SDK keeps them as extras."""
    fields = {"content": message.content, **(message.model_extra or {})}
    return {key: fields[key] for key in TEXT_FIELDS if isinstance(fields.get(key), str)}


def accumulated(chunks: Iterable[Any]) -> tuple[dict[str, str], list[tuple[str, str, str]], str | None]:
    """Choice 0 of a stream of SDK chunks: its text fields, its (id, name, arguments) calls by
    index, and its finish_reason."""
    texts: dict[str, str] = {}
    calls: dict[int, list[str]] = {}
    finish_reason = None
    for choice in (choice for chunk in chunks for choice in chunk.choices if choice.index == 0):
        for key, text in text_fields(choice.delta).items():
            texts[key] = texts.get(key, "") + text
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, ["", "", ""])
            call[0] += delta.id or ""
            call[1] += (delta.function and delta.function.name) or ""
            call[2] += (delta.function and delta.function.arguments) or ""
        finish_reason = choice.finish_reason or finish_reason
    return texts, [(call_id, name, arguments) for _, (call_id, name, arguments) in sorted(calls.items())], finish_reason


def ask_responses(client: OpenAI, request: dict[str, Any]) -> Answer:
    """Send a Responses request; the output items of the response the SDK parsed (a stream's
    terminal event carries the whole response)."""
    result = client.responses.create(**sdk_arguments(client.responses.create, request))
    if not request.get("stream"):
        return responses_answer([item.model_dump() for item in result.output])
    response = None
    with result as events:  # read to the end, so the connection is closed cleanly
        for event in events:
            if event.type in TERMINAL_EVENTS:
                response = event.response
    if response is None:
        raise RuntimeError("the stream ended without a terminal response event")
    return responses_answer([item.model_dump() for item in response.output])


def ask_messages(client: Anthropic, request: dict[str, Any]) -> Answer:
    """Send a Messages request; the content blocks of the message the SDK built (a stream read
    by `messages.stream()` to its end, then `get_final_message()`)."""
    if request.get("stream"):
        arguments = sdk_arguments(client.messages.stream, {key: value for key, value in request.items() if key != "stream"})
        with client.messages.stream(**arguments) as events:
            for _ in events:  # read to the end, so the connection is closed cleanly
                pass
            message = events.get_final_message()
    else:
        message = client.messages.create(**sdk_arguments(client.messages.create, request))
    return messages_answer([block.model_dump() for block in message.content], message.stop_reason)


def problems_of(answer: Answer) -> list[str]:
    found = [] if answer.calls else ["the SDK got no tool call"]
    for entry in answer.entries:
        if isinstance(entry, Text) and (markup := LEFTOVER_MARKUP.search(entry.text)):
            found.append(f"markup left in {entry.label}: {markup.group()!r}")
    return found


# -- output ---------------------------------------------------------------------------------------


def wrapped(text: str, indent: str) -> list[str]:
    """`text` in lines of about WIDTH, continued further indented. Lines break after a space, an
    escaped newline or a tag's `>`, never inside a markup token (shown texts are repr()s, whose
    newlines are `\\n`)."""
    lines, line = [], indent
    for piece in BREAK_AFTER.findall(text):
        if len(line) + len(piece) > WIDTH and line.strip():
            lines.append(line.rstrip())
            line = indent + "    "
        line += piece
    return [*lines, line.rstrip()]


def clipped(text: str) -> str:
    if len(text) <= MAX_SHOWN_TEXT:
        return repr(text)
    return f"{text[:MAX_SHOWN_TEXT]!r} … ({len(text) - MAX_SHOWN_TEXT} more characters)"


def render(answer: Answer, indent: str = "    ") -> str:
    lines: list[str] = []
    for entry in answer.entries:
        if isinstance(entry, Call):
            lines.append(f"{indent}{entry.label}: {entry.name}, {entry.id_key} {entry.call_id}")
            lines += wrapped(f"{entry.arguments_key} {entry.arguments}", indent + "    ")
        else:
            lines += wrapped(f"{entry.label}: {clipped(entry.text)}", indent)
    if answer.ending:
        lines.append(indent + answer.ending)
    return "\n".join(lines)


def heading(number: int, total: int, demo_flow: DemoFlow) -> str:
    request = demo_flow.request
    # a Chat tool's name is in its `function`, a Responses tool's on the tool itself
    tools = [(tool.get("function") or tool).get("name") for tool in request.get("tools") or [] if isinstance(tool, dict)]
    api = API_TITLES[demo_flow.api] + (", streamed" if request.get("stream") else "")
    declared = f"tools {', '.join(map(str, tools))}" if tools else "no tools"
    details = f"{demo_flow.name}: {request['model']}, {api}, {declared}"
    if not demo_flow.situation:
        return "\n".join(wrapped(f"[{number}/{total}] {details}", ""))
    return "\n".join([f"[{number}/{total}] {demo_flow.situation}", *wrapped(details, "      ")])


# -- the demo -------------------------------------------------------------------------------------


def sdk_versions(flows: Sequence[DemoFlow]) -> str:
    """The SDKs the flows are read by, with their versions."""
    import openai  # main() made sure it is installed

    versions = [f"the OpenAI Python SDK {openai.__version__}"]
    if any(demo_flow.api == MESSAGES for demo_flow in flows):
        import anthropic

        versions.append(f"the Anthropic Python SDK {anthropic.__version__} (Messages API)")
    return " and ".join(versions)


def run_demo(flows: Sequence[DemoFlow], proxy: ReplayProxy) -> int:
    import openai  # main() made sure it is installed

    print(
        textwrap.fill(
            f"toolshim-demo: {len(flows)} recorded upstream answers, replayed by a local mitmdump (no "
            f"backend, no API key, no network), repaired by toolshim, read by {sdk_versions(flows)}.",
            WIDTH,
        )
    )
    failed = 0
    # trust_env=False: no proxy variable (HTTP_PROXY, ALL_PROXY) may reroute the SDK. No retries:
    # each request takes one answer off the replay queue (see write_replay_file).
    with contextlib.ExitStack() as clients:
        client = clients.enter_context(
            openai.OpenAI(
                base_url=proxy.base_url,
                api_key=DEMO_API_KEY,
                max_retries=0,
                timeout=30,
                http_client=openai.DefaultHttpxClient(trust_env=False),
            )
        )
        anthropic_client = None
        if any(demo_flow.api == MESSAGES for demo_flow in flows):
            import anthropic  # main() made sure it is installed
            import httpx

            anthropic_client = clients.enter_context(
                anthropic.Anthropic(
                    base_url=proxy.anthropic_base_url,
                    api_key=DEMO_API_KEY,
                    max_retries=0,
                    timeout=30,
                    # The Anthropic SDK's client mounts the environment's proxies even with
                    # trust_env=False, unless it is given a transport of its own.
                    http_client=anthropic.DefaultHttpxClient(trust_env=False, transport=httpx.HTTPTransport(trust_env=False)),
                )
            )
        for number, demo_flow in enumerate(flows, 1):
            print(f"\n{heading(number, len(flows), demo_flow)}")
            print("  the upstream sent (recorded):")
            print(render(recorded_answer(demo_flow)))
            print(f"  the {SDK_NAMES[demo_flow.api]} SDK got, through toolshim:")
            try:
                if demo_flow.api == MESSAGES:
                    answer = ask_messages(anthropic_client, dict(demo_flow.request))
                else:
                    ask = ask_responses if demo_flow.api == RESPONSES else ask_chat
                    answer = ask(client, dict(demo_flow.request))
            except Exception as exc:  # whatever the SDK raised is the finding: shown, not a traceback
                problems = [f"{type(exc).__name__}: {exc}"]
            else:
                print(render(answer))
                problems = problems_of(answer)
            if problems:
                failed += 1
                print(f"  => NOT REPAIRED: {'; '.join(problems)}")
            else:
                count = len(answer.calls)
                print(f"  => repaired: {count} tool call{'s' if count > 1 else ''}, no markup left")
    if failed:
        print(f"\n{failed} of {len(flows)} flows were not repaired. The end of mitmdump's log:\n{proxy.log_tail()}")
        return 1
    print(f"\nAll {len(flows)} flows repaired: the SDK got real tool calls and no markup.")
    print("In front of a real backend: mitmdump --mode reverse:https://BACKEND -s addon/toolshim.py")
    return 0


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="toolshim-demo",
        description="Show toolshim repairing leaked tool-call markup in recorded flows: a real mitmdump "
        "replays the upstream's answers (no backend, no API key, no network) to the OpenAI SDK (the "
        "Anthropic SDK for Messages API flows).",
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"flows to show, by .flow file name (default: {', '.join(DEFAULT_FLOWS)})",
    )
    parser.add_argument("--flows", type=Path, default=FLOWS_DIR, metavar="DIR", help="folder of the .flow files (default: the checkout's flows/)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    if importlib.util.find_spec("openai") is None:
        print("toolshim-demo needs the OpenAI Python SDK: pip install -e '.[demo]'", file=sys.stderr)
        return 2
    try:
        if not arguments.flows.is_dir():
            raise DemoError(f"no flows folder at {arguments.flows}; pass one with --flows DIR")
        if not ADDON_SCRIPT.is_file():
            raise DemoError(f"the addon script {ADDON_SCRIPT} is missing: run toolshim-demo from a checkout (pip install -e .)")
        flows = [load_flow(arguments.flows, name) for name in arguments.names or DEFAULT_FLOWS]
        if any(demo_flow.api == MESSAGES for demo_flow in flows) and importlib.util.find_spec("anthropic") is None:
            if arguments.names:
                print("toolshim-demo needs the Anthropic Python SDK for Messages API flows: pip install anthropic", file=sys.stderr)
                return 2
            # `.[demo]` installs the OpenAI SDK only: the tour goes on without its Messages flow.
            print("toolshim-demo: the Anthropic Python SDK is not installed, so the tour leaves out its Messages API flow (pip install anthropic)", file=sys.stderr)
            flows = [demo_flow for demo_flow in flows if demo_flow.api != MESSAGES]
        executable = find_mitmdump()
        with tempfile.TemporaryDirectory(prefix="toolshim-demo-") as scratch:
            replay_file = Path(scratch) / "replay.flow"
            write_replay_file(replay_file, flows)
            with ReplayProxy(executable, replay_file, Path(scratch) / "mitmdump.log") as proxy:
                return run_demo(flows, proxy)
    except DemoError as exc:
        print(f"toolshim-demo: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ntoolshim-demo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
