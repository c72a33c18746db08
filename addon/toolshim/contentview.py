"""The "LLM stream" content view's mitmproxy skin: registration for mitmproxy 11 and 12.

`llm_view` renders; this module finds what to render in the flow (the API from the request
line, the original upstream body toolshim keeps in `flow.metadata`, the flow's comment) and
says when the view should be picked: for the `text/event-stream` response of a Chat
Completions, Responses or Anthropic Messages call (priority 2, above every built-in view).
Anything else gets 0, so mitmproxy's own views win: JSON answers of the same calls too, though
the view reads them when a user picks it.

mitmproxy 12 replaced the content view API (`Contentview.prettify` returns text; `add`
replaces a view of the same name and `remove` does nothing); mitmproxy 11 has `View`, whose
lines carry styles, and whose `add` refuses a second view of the same name. Both classes are
built by functions that take the base class, so that each can be tested without the other
mitmproxy installed; the one matching the running mitmproxy is registered.
"""

from __future__ import annotations

from typing import Any

from mitmproxy import contentviews, http

from . import llm_view
from .apis import CHAT, MESSAGES, METADATA_KEY, RESPONSES, api_of

VIEW_NAME = "LLM stream"
SSE_PRIORITY = 2.0  # above mitmproxy's built-in views, which return at most 1


def responded_api(flow: Any, http_message: Any) -> str | None:
    """The API of a Chat Completions, Responses or Messages flow, when `http_message` is its
    response."""
    if not isinstance(flow, http.HTTPFlow) or http_message is None or http_message is not flow.response:
        return None
    return api_of(flow)


def render_priority(content_type: str | None, flow: Any, http_message: Any) -> float:
    is_event_stream = (content_type or "").lower() == "text/event-stream"
    return SSE_PRIORITY if is_event_stream and responded_api(flow, http_message) else 0.0


def view_lines(data: bytes, flow: Any, http_message: Any) -> list[llm_view.Line]:
    api = responded_api(flow, http_message)
    upstream, comment, request_repairs = None, None, None
    if api is not None:
        info = flow.metadata.get(METADATA_KEY)
        kept = info.get("upstream") if isinstance(info, dict) else None
        upstream = kept if isinstance(kept, bytes) else None
        request_repairs = info.get("request") if isinstance(info, dict) else None
        comment = flow.comment or None
    return llm_view.render(data, api, upstream, comment, request_repairs=request_repairs)


def description(flow: Any, http_message: Any) -> str:
    """What mitmweb and the console show above the lines."""
    api = responded_api(flow, http_message)
    what = {CHAT: "Chat Completions", RESPONSES: "Responses API", MESSAGES: "Anthropic Messages API"}.get(api, "not an LLM response")
    info = flow.metadata.get(METADATA_KEY) if api is not None else None
    rewritten = ", rewritten by toolshim" if isinstance(info, dict) and "upstream" in info else ""
    return f"{VIEW_NAME}: {what}{rewritten}"


def legacy_view_class(base: type) -> type:
    """The view for mitmproxy 11, on `contentviews.View`."""

    class LlmStreamView(base):
        name = VIEW_NAME

        def __call__(self, data, *, content_type=None, flow=None, http_message=None, **unknown):
            return description(flow, http_message), iter(view_lines(data, flow, http_message))

        def render_priority(self, data, *, content_type=None, flow=None, http_message=None, **unknown):
            return render_priority(content_type, flow, http_message)

    return LlmStreamView


def contentview_class(base: type) -> type:
    """The view for mitmproxy 12, on `contentviews.Contentview`: plain text, no styles."""

    class LlmStreamContentview(base):
        name = VIEW_NAME
        syntax_highlight = "none"

        def prettify(self, data: bytes, metadata: Any) -> str:
            return llm_view.plain_text(view_lines(data, metadata.flow, metadata.http_message))

        def render_priority(self, data: bytes, metadata: Any) -> float:
            return render_priority(metadata.content_type, metadata.flow, metadata.http_message)

    return LlmStreamContentview


MITMPROXY_12 = hasattr(contentviews, "Contentview")
VIEW = contentview_class(contentviews.Contentview)() if MITMPROXY_12 else legacy_view_class(contentviews.View)()


def register() -> None:
    """Add the view; calling it again (a script reload) keeps exactly one."""
    if MITMPROXY_12:
        contentviews.add(VIEW)  # replaces a view of the same name
        return
    registered = contentviews.get(VIEW_NAME)
    if registered is VIEW:
        return
    if registered is not None:  # left by an earlier import of this module
        contentviews.remove(registered)
    contentviews.add(VIEW)


def unregister() -> None:
    """Remove the view (mitmproxy 11). mitmproxy 12 cannot remove a view; a later `register`
    replaces it."""
    if MITMPROXY_12:
        return
    registered = contentviews.get(VIEW_NAME)
    if registered is not None:
        contentviews.remove(registered)
