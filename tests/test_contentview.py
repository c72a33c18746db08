"""The "LLM stream" view inside mitmproxy: registration and auto-selection through mitmproxy 11's
own content view machinery, the mitmproxy 12 adapter on a stand-in base class, and one real
mitmweb serving the view of a flow toolshim rewrote."""

from __future__ import annotations

import http.cookiejar
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mitmproxy import contentviews
from mitmproxy.test import tflow, tutils

from harness import ADDON_SCRIPT, PROJECT_ROOT, read_flows, sse_body
from toolshim import contentview, llm_view
from toolshim.apis import METADATA_KEY

FLOWS = PROJECT_ROOT / "flows"
KIMI_SSE = b'data: {"choices": [{"index": 0, "delta": {"content": "Hi <|tool_call_begin|>"}}]}\n\ndata: [DONE]\n\n'


def llm_flow(path: str = "/v1/chat/completions", body: bytes = KIMI_SSE, content_type: str = "text/event-stream; charset=utf-8") -> Any:
    flow = tflow.tflow(req=tutils.treq(method=b"POST", path=path.encode(), content=b"{}"), resp=tutils.tresp(content=body))
    flow.response.headers["content-type"] = content_type
    return flow


@pytest.fixture
def views_restored() -> Iterator[None]:
    """mitmproxy's list of views as it was before the test, whatever the test registers."""
    before = list(contentviews.views)
    yield
    contentviews.views[:] = before


@pytest.fixture
def registered(views_restored: None) -> None:
    contentview.register()


def auto_view(message: Any, flow: Any) -> tuple[str, list[llm_view.Line]]:
    description, lines, error = contentviews.get_message_content_view("auto", message, flow)
    assert error is None
    return description, list(lines)


# -- mitmproxy 11 --------------------------------------------------------------------------------


def test_auto_picks_the_view_for_an_event_stream_of_a_chat_flow(registered: None) -> None:
    flow = read_flows(FLOWS / "kimi_seed_000_reasoning.flow")[0]
    description, lines = auto_view(flow.response, flow)
    assert description == "LLM stream: Chat Completions"
    assert ("highlight", "<|tool_calls_section_begin|>") in [segment for line in lines for segment in line]
    assert lines == [[(style, text) for style, text in line] for line in llm_view.render(flow.response.content, "chat")]


def test_auto_picks_the_view_for_a_responses_stream_and_shows_the_kept_original(registered: None) -> None:
    flow = llm_flow("/v1/responses", sse_body([{"type": "response.completed", "response": {"status": "completed", "output": []}}]))
    flow.metadata[METADATA_KEY] = {"upstream": KIMI_SSE, "calls": 0}
    flow.comment = "toolshim: summary"
    description, lines = auto_view(flow.response, flow)
    assert description == "LLM stream: Responses API, rewritten by toolshim"
    text = llm_view.plain_text(lines)
    assert text.startswith("toolshim: summary\nclient got (rewritten by toolshim)\n")
    assert "upstream sent (original)" in text and "status: completed" in text


def test_auto_picks_the_view_for_a_messages_stream_and_shows_the_kept_original(registered: None) -> None:
    flow = read_flows(FLOWS / "messages_kimi_in_thinking_stream.flow")[0]
    description, lines = auto_view(flow.response, flow)
    assert description == "LLM stream: Anthropic Messages API"
    assert lines == llm_view.render(flow.response.content, "messages")
    assert ("highlight", "<|tool_calls_section_begin|>") in [segment for line in lines for segment in line]
    assert "  [0] thinking signature: ''" in llm_view.plain_text(lines).split("\n")
    flow.metadata[METADATA_KEY] = {"upstream": flow.response.content, "calls": 1}
    flow.comment = "toolshim: kimi → 1 call (bash)"
    description, lines = auto_view(flow.response, flow)
    assert description == "LLM stream: Anthropic Messages API, rewritten by toolshim"
    assert llm_view.plain_text(lines).startswith("toolshim: kimi → 1 call (bash)\nclient got (rewritten by toolshim)\n  events\n")


@pytest.mark.parametrize(
    "flow, message",
    [
        pytest.param(read_flows(FLOWS / "non_llm_get_models.flow")[0], "response", id="JSON of a non-LLM flow"),
        pytest.param(llm_flow(body=b'{"choices": []}', content_type="application/json"), "response", id="JSON answer of a chat flow"),
        pytest.param(llm_flow(), "request", id="the request of a chat flow"),
        pytest.param(llm_flow(path="/v1/models"), "response", id="event stream of another path"),
    ],
)
def test_auto_leaves_everything_else_to_mitmproxys_views(registered: None, flow: Any, message: str) -> None:
    description, _ = auto_view(getattr(flow, message), flow)
    assert not description.startswith(contentview.VIEW_NAME)
    assert contentview.VIEW.render_priority(b"", content_type="application/json", flow=flow, http_message=getattr(flow, message)) == 0


def test_picked_by_hand_the_view_reads_a_json_answer(registered: None) -> None:
    body = json.dumps({"choices": [{"message": {"content": "Hi"}, "finish_reason": "stop"}]}).encode()
    flow = llm_flow(body=body, content_type="application/json")
    description, lines, error = contentviews.get_message_content_view(contentview.VIEW_NAME, flow.response, flow)
    assert error is None and description == "LLM stream: Chat Completions"
    assert "content: 'Hi'" in llm_view.plain_text(lines)


def test_registering_is_idempotent_and_unregistering_removes_the_view(views_restored: None) -> None:
    contentview.unregister()
    before = list(contentviews.views)
    contentview.register()
    contentview.register()  # a script reload calls it again: no "Duplicate view"
    assert [view.name for view in contentviews.views].count(contentview.VIEW_NAME) == 1
    contentview.unregister()
    assert contentviews.get(contentview.VIEW_NAME) is None
    contentview.unregister()  # and twice does no harm
    assert contentviews.views == before


def test_a_view_left_by_an_earlier_import_is_replaced(views_restored: None) -> None:
    contentview.unregister()
    stale = contentview.legacy_view_class(contentviews.View)()
    contentviews.add(stale)
    contentview.register()
    assert contentviews.get(contentview.VIEW_NAME) is contentview.VIEW
    assert stale not in contentviews.views


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # urwid, imported with the console
def test_every_style_is_known_to_the_console_and_the_marking_ones_to_mitmweb() -> None:
    from mitmproxy.tools.console.palettes import Palette

    chat = sse_body(
        [
            {"choices": [{"index": 0, "delta": {"content": "a <tool_call>"}}]},
            {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": '{"n": 1, "b": true}'}}]}}]},
            ": comment",
            "not json",
        ]
    )
    messages = read_flows(FLOWS / "messages_broken_native_split_tool_use.flow")[0].response.content
    bodies = [(chat, "chat"), (b"[1]", "chat"), (sse_body([{"type": "response.completed", "response": {}}]), "responses"), (messages, "messages")]
    used = {style for body, api in bodies for line in llm_view.render(body, api, upstream=body, comment="c") for style, _ in line}
    assert {"header", "offset", "Token_Name_Tag", "key", "Token_Literal_String", "highlight", "Token_Literal_Number", "Token_Keyword_Constant", "warn", "error", "text"} == used
    assert used <= set(Palette._fields)
    stylesheet = (Path(contentviews.__file__).parents[1] / "tools" / "web" / "static" / "app.css").read_text()
    plain_in_mitmweb = {"text", "key", "warn", "error"}  # told apart by their words there
    assert all(f".contentview .{style}{{" in stylesheet for style in used - plain_in_mitmweb)


# -- mitmproxy 12 --------------------------------------------------------------------------------


class StandInContentview:
    """What a subclass gets from mitmproxy 12's `contentviews.Contentview` (a Protocol)."""

    @property
    def name(self) -> str:
        return type(self).__name__.removesuffix("Contentview")

    @property
    def syntax_highlight(self) -> str:
        return "none"

    def render_priority(self, data: bytes, metadata: Any) -> float:
        return 0


@dataclass
class StandInMetadata:
    """The fields of mitmproxy 12's `contentviews.Metadata` the view reads."""

    flow: Any = None
    content_type: str | None = None
    http_message: Any = None


def test_the_mitmproxy_12_view_prettifies_to_the_plain_text_of_the_lines() -> None:
    view = contentview.contentview_class(StandInContentview)()
    flow = llm_flow()
    flow.metadata[METADATA_KEY] = {"upstream": KIMI_SSE.replace(b"Hi", b"Hello")}
    assert view.name == "LLM stream" and view.syntax_highlight == "none"
    text = view.prettify(flow.response.content, StandInMetadata(flow, "text/event-stream", flow.response))
    assert text == llm_view.plain_text(llm_view.render(flow.response.content, "chat", flow.metadata[METADATA_KEY]["upstream"]))
    assert "content 'Hello <|tool_call_begin|>'" in text


def test_the_mitmproxy_12_view_is_chosen_only_for_the_event_stream_of_an_llm_response() -> None:
    view = contentview.contentview_class(StandInContentview)()
    flow = llm_flow()
    assert view.render_priority(KIMI_SSE, StandInMetadata(flow, "text/event-stream", flow.response)) == contentview.SSE_PRIORITY > 1
    assert view.render_priority(KIMI_SSE, StandInMetadata(flow, "application/json", flow.response)) == 0
    assert view.render_priority(KIMI_SSE, StandInMetadata(flow, "text/event-stream", flow.request)) == 0
    assert view.render_priority(KIMI_SSE, StandInMetadata(None, "text/event-stream", None)) == 0
    messages = llm_flow(path="/anthropic/v1/messages")
    assert view.render_priority(KIMI_SSE, StandInMetadata(messages, "text/event-stream", messages.response)) == contentview.SSE_PRIORITY
    other = llm_flow(path="/v1/embeddings")
    assert view.render_priority(KIMI_SSE, StandInMetadata(other, "text/event-stream", other.response)) == 0


# -- a real mitmweb ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def run_command(web: str, name: str) -> Any:
    """POST /commands/NAME as mitmweb's command bar does (tornado wants its XSRF cookie back)."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(f"{web}/", timeout=5).close()
    token = next(cookie.value for cookie in jar if cookie.name == "_xsrf")
    request = urllib.request.Request(
        f"{web}/commands/{name}", data=b'{"arguments": []}', method="POST",
        headers={"X-XSRFToken": token, "Content-Type": "application/json"},
    )  # fmt: skip
    with opener.open(request, timeout=5) as response:
        return json.load(response)


def test_mitmweb_serves_the_view_of_a_flow_toolshim_rewrote(tmp_path: Path) -> None:
    web_port = free_port()
    command = [
        str(Path(sys.executable).parent / "mitmweb"),
        "--no-web-open-browser",
        "--web-port", str(web_port),
        "--listen-host", "127.0.0.1",
        "--listen-port", str(free_port()),
        "-s", str(ADDON_SCRIPT),
        "-r", str(FLOWS / "kimi_seed_000_reasoning.flow"),
    ]  # fmt: skip
    web = f"http://127.0.0.1:{web_port}"
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        view, flows = None, []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                flows = get_json(f"{web}/flows")
                if flows:
                    view = get_json(f"{web}/flows/{flows[0]['id']}/response/content/auto.json")
                    if "upstream sent (original)" in llm_view.plain_text(view["lines"]):
                        break
            except OSError:  # not listening yet
                pass
            assert process.poll() is None, process.stdout.read().decode(errors="replace")
            time.sleep(0.1)
        assert view is not None, "mitmweb served no flow"
        assert view["description"] == "LLM stream: Chat Completions, rewritten by toolshim"
        segments = [tuple(segment) for line in view["lines"] for segment in line]
        assert ("Token_Name_Tag", "bash") in segments and ("Token_Name_Tag", "read_file") in segments  # the repaired calls
        assert ("highlight", "<|tool_calls_section_begin|>") in segments  # the original's markup
        assert flows[0]["comment"] == "toolshim: kimi → 2 calls (bash, read_file)"
        assert flows[0]["marked"] == "🔧"  # mitmweb serves the emoji of the mark :wrench:
        assert view["lines"][0] == [["header", flows[0]["comment"]]]
        assert contentview.VIEW_NAME in get_json(f"{web}/state")["contentViews"]
        # The counters, through mitmweb's command bar API.
        stats = run_command(web, "toolshim.stats")
        assert stats["value"].splitlines()[0] == "toolshim: 1 LLM flow, 1 rewritten, 2 calls from markup, 0 failed; LeakedMarkup 2"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()
