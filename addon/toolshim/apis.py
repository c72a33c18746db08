"""Which flows are LLM calls toolshim reads, and where it records what it did.

Shared by the addon, the content view and `show`; it reads only the request line, so it needs
no mitmproxy import.
"""

from __future__ import annotations

from typing import Any

CHAT, RESPONSES, MESSAGES = "chat", "responses", "messages"

# flow.metadata[METADATA_KEY]: what toolshim did to a flow (saved with it in .flow files).
METADATA_KEY = "toolshim"


def api_of(flow: Any) -> str | None:
    """Which API a request calls: Chat Completions, Responses, Anthropic Messages, or none of
    them (not ours to touch)."""
    if flow.request.method != "POST":
        return None
    path = flow.request.path.split("?")[0].rstrip("/")
    if path.endswith("/chat/completions"):
        return CHAT
    if path.endswith("/responses"):
        return RESPONSES
    if path.endswith("/v1/messages"):  # Anthropic, also behind a prefix (`/anthropic/v1/messages`)
        return MESSAGES
    return None
