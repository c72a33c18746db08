"""What every streamed rewrite shares: SSE framing in, fail-open per event, the end of body.

An API rewriter (Chat Completions, Responses) subclasses `SseRewriter` and implements
`_on_block` (one complete SSE block in, the blocks to send out) and `_at_end` (the body ended:
release what the lexers still hold).
"""

from __future__ import annotations

import re

from .calls import RewriteStats
from .sse import SseFramer

# `id:` and `retry:` lines of an event (an `id` line may have no colon). They are state of the
# client's EventSource (the last event id, the reconnection delay), not part of the data.
_CARRIED_FIELD = re.compile(rb"(?:^|(?<=[\r\n]))(?:id|retry)(?:[:][^\r\n]*)?(?:\r\n|\r|\n)", re.MULTILINE)
# Mistral's bracket markers, or a text that ends in what may begin one (`… [TOO"`). The JSON's
# own brackets (`"choices":[{`, `"logprobs":[]`) never match.
_BRACKET_MARKUP = re.compile(rb'\[(?:TOOL_CALLS\]|/?THINK\]|ARGS\]|CALL_ID\]|/?[A-Z_]*")')


def markup_may_start(raw: bytes) -> bool:
    """Might a marker of some dialect begin in the text of these raw events (JSON bytes)? Every
    marker begins with `<` (`\\u003c` escaped) or a bracket marker."""
    if raw.find(b"<") >= 0 or raw.find(b"\\u003") >= 0:
        return True
    # A pattern that begins with a literal is searched for that byte in C: one pass, where
    # counting the JSON's own `[{` and `[]` to rule brackets out took three.
    return _BRACKET_MARKUP.search(raw) is not None


class SseRewriter:
    """An SSE body in (any byte pieces), the repaired SSE body out."""

    def __init__(self) -> None:
        self._framer = SseFramer()
        self.stats = RewriteStats()
        self.failure: Exception | None = None
        self._echo = EchoCheck()
        # `id:`/`retry:` lines of events rewritten or held, not sent yet: (the event's number in
        # the stream, the event's raw bytes, its field lines).
        self._carried: list[tuple[int, bytes, bytes]] = []
        self._taken = 0  # events read so far: the number of the one being read
        # Set by a subclass while its state lets whole reads pass when `_nothing_to_read`.
        self._passes_whole_reads = False

    @property
    def changed(self) -> bool:
        """Did the client get anything else than upstream sent (so far)?"""
        return self._echo.changed

    def feed(self, data: bytes) -> list[bytes]:
        # (Not while fields are carried: the next event sent takes them.)
        if self._passes_whole_reads and self._echo.idle and not self._carried:
            # The fast path: the whole events of this read pass unframed when nothing in them
            # needs a look; an unfinished last event waits in the framer, as ever.
            end = data.rfind(b"\n\n") + 2  # a blank line ends an event (a CRLF stream has none)
            # Only a read that ends an event takes the framer's held bytes out: a long event
            # arriving in many reads stays with the framer, which scans each byte once (taking
            # them out on every read copied and rescanned them: a 10 MB event took seconds).
            # A blank line split across reads is found by the framer below.
            if end >= 2 and self._framer.pending:
                held = self._framer.take_pending()
                data = held + data
                end += len(held)
            # After the last "\n\n", events ending in CR line ends ("\r\n\r\n", "\r\r") may be
            # complete: they must be framed and read, not left to the framer (fuzzing found a
            # `data: [DONE]\r\n\r\n` dropped that way), so such a read takes the framed path.
            if end >= 2 and b"\r" not in data[end:] and self._nothing_to_read(data if end == len(data) else data[:end]):
                if end == len(data):
                    return [data]
                self._framer.feed(data[end:])  # no event is complete in it
                return [data[:end]]
        out: list[bytes] = []
        for raw in self._framer.feed(data):
            self._echo.took(raw)
            out += self._on_block_failing_open(raw)
        self._echo.gave(out)
        return out

    def close(self) -> list[bytes]:
        """End of body: complete blocks, then whatever the lexers still hold, then the tail."""
        out: list[bytes] = []
        for raw in self._framer.close():
            self._echo.took(raw)
            out += self._on_block_failing_open(raw)
        if self.failure is None:
            try:
                released = self._at_end()
            except Exception as exc:  # nothing more to lose than what was held
                self.failure = exc
            else:
                out += released
        # Fields still carried with nothing after them to go on are dropped: an event of an
        # `id:` alone would reach the OpenAI SDK as an event with empty data, which it cannot read.
        self._attach_carried(out, None)
        self._carried = []
        tail = self._framer.take_pending()
        self._echo.gave(out)
        self._echo.end()
        return [*out, tail] if tail else out

    def take_pending(self) -> bytes:
        """Failing open: the bytes not yet forwarded, as they came."""
        return self._framer.take_pending()

    def _on_block_failing_open(self, raw: bytes) -> list[bytes]:
        """Invariant 4: after the first exception this stream's events pass as they came."""
        self._taken += 1
        if self.failure is not None:
            return [raw]
        try:
            out = self._on_block(raw)
        except Exception as exc:  # a bug of ours must not cost the client an event
            self.failure = exc
            return self._attach_carried([raw], raw)
        if out != [raw]:
            # Nearly every event is one line (`data: …`), which leaves no other field.
            if raw.find(b"\n") != len(raw) - 2 and not any(piece is raw for piece in out):
                fields = b"".join(_CARRIED_FIELD.findall(raw))
                if fields:
                    self._carried.append((self._taken, raw, fields))
        return self._attach_carried(out, raw) if self._carried else out

    def _attach_carried(self, out: list[bytes], raw: bytes | None) -> list[bytes]:
        """An event rewritten or held loses its raw lines: its `id:` and `retry:` go on the
        events sent in its place, or on the next ones sent, so that the client's last event id
        and retry delay end up where upstream's would, never going back.

        `raw` is the event just read (None at the end). The last of a piece's fields wins, so
        fields older than an event sent as it came go before its own; the newest go on the last
        piece sent. A held event sent as it came later still carries its own fields."""
        if not self._carried or not out:
            return out
        number_of = {id(src): number for number, src, _ in self._carried}
        if raw is not None:
            number_of[id(raw)] = self._taken
        waiting = [(number, fields) for number, src, fields in self._carried if not any(piece is src for piece in out)]
        self._carried = []
        numbers = [number_of.get(id(piece)) for piece in out]
        for position, number in enumerate(numbers):
            older = [fields for n, fields in waiting if number is not None and n < number]
            if older:
                out[position] = b"".join(older) + out[position]
                waiting = [(n, fields) for n, fields in waiting if n > number]
        if waiting:
            fields = b"".join(fields for _, fields in waiting)
            last = out[-1]
            if numbers[-1] is not None:  # an event as it came, older than the fields: they go after its own
                cut = len(last) - (2 if last.endswith(b"\r\n") else 1)  # before the blank line
                out[-1] = last[:cut] + fields + last[cut:]
            else:
                out[-1] = fields + last
        return out

    def _nothing_to_read(self, data: bytes) -> bool:
        """With `_passes_whole_reads` set: may these whole events go out as they came?"""
        return False

    def _on_block(self, raw: bytes) -> list[bytes]:
        raise NotImplementedError

    def _at_end(self) -> list[bytes]:
        return []


class EchoCheck:
    """Is the body sent still byte for byte the body received? Compared as the bytes go, keeping
    only what came in and was not sent yet (what the rewriter holds), so a flow can be annotated
    as rewritten or not without a copy of either body."""

    # Held raw bytes past this mean the rewriter is holding markup over many events (a block, a
    # section): whatever it releases is re-framed into other events, so the bodies differ. Deciding
    # it here spares keeping ~85 bytes of event JSON per held character (bench/e2e.py, memory).
    MAX_UNSENT = 16 * 1024

    def __init__(self) -> None:
        self.changed = False
        self._unsent = bytearray()

    def took(self, raw: bytes) -> None:
        if not self.changed:
            self._unsent += raw

    def gave(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            if self.changed:
                return
            if self._unsent.startswith(piece):
                del self._unsent[: len(piece)]
            else:
                self._differs()
        if len(self._unsent) > self.MAX_UNSENT:
            self._differs()

    @property
    def idle(self) -> bool:
        """Everything received was sent as it came (or a difference is known already)."""
        return not self._unsent

    def end(self) -> None:
        if self._unsent:  # held and never sent: dropped
            self._differs()

    def _differs(self) -> None:
        self.changed = True
        self._unsent = bytearray()
