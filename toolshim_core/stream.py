"""What every streamed rewrite shares: SSE framing in, fail-open per event, the end of body.

An API rewriter (Chat Completions, Responses) subclasses `SseRewriter` and implements
`_on_block` (one complete SSE block in, the blocks to send out) and `_at_end` (the body ended:
release what the lexers still hold).
"""

from __future__ import annotations

from .calls import RewriteStats
from .sse import SseFramer


class SseRewriter:
    """An SSE body in (any byte pieces), the repaired SSE body out."""

    def __init__(self) -> None:
        self._framer = SseFramer()
        self.stats = RewriteStats()
        self.failure: Exception | None = None

    def feed(self, data: bytes) -> list[bytes]:
        out: list[bytes] = []
        for raw in self._framer.feed(data):
            out += self._on_block_failing_open(raw)
        return out

    def close(self) -> list[bytes]:
        """End of body: complete blocks, then whatever the lexers still hold, then the tail."""
        out: list[bytes] = []
        for raw in self._framer.close():
            out += self._on_block_failing_open(raw)
        if self.failure is None:
            try:
                out += self._at_end()
            except Exception as exc:  # nothing more to lose than what was held
                self.failure = exc
        tail = self._framer.take_pending()
        return [*out, tail] if tail else out

    def take_pending(self) -> bytes:
        """Failing open: the bytes not yet forwarded, as they came."""
        return self._framer.take_pending()

    def _on_block_failing_open(self, raw: bytes) -> list[bytes]:
        """Invariant 4: after the first exception this stream's events pass as they came."""
        if self.failure is not None:
            return [raw]
        try:
            return self._on_block(raw)
        except Exception as exc:  # a bug of ours must not cost the client an event
            self.failure = exc
            return [raw]

    def _on_block(self, raw: bytes) -> list[bytes]:
        raise NotImplementedError

    def _at_end(self) -> list[bytes]:
        return []
