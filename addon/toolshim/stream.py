"""What every streamed rewrite shares: SSE framing in, fail-open per event, the end of body.

An API rewriter (Chat Completions, Responses) subclasses `SseRewriter` and implements
`_on_block` (one complete SSE block in, the blocks to send out) and `_at_end` (the body ended:
release what the lexers still hold).
"""

from __future__ import annotations

import re

from .calls import RewriteStats
from .lexers import MARKUP_STARTS
from .sse import SseFramer, is_one_data_line

# `id:` and `retry:` lines of an event (an `id` line may have no colon). They are state of the
# client's EventSource (the last event id, the reconnection delay), not part of the data.
_CARRIED_FIELD = re.compile(rb"(?:^|(?<=[\r\n]))(?:id|retry)(?:[:][^\r\n]*)?(?:\r\n|\r|\n)", re.MULTILINE)
_LINE_END = re.compile(rb"\r\n?")
# Every marker begins with `<` or `[` (the dialect registry, `lexers.MARKUP_STARTS`). A `[` only
# counts as a bracket marker (`[TOOL_CALLS]`, `[THINK]`), or a text that ends in what may begin
# one (`… [TOO"`): the JSON's own brackets (`"choices":[{`, `"logprobs":[]`) never match.
# (tests/test_core_seed_oss.py checks that every registered start is seen.)
_BRACKET_MARKUP = re.compile(
    rb"\[(?:" + b"|".join(re.escape(m[1:].encode()) for m in MARKUP_STARTS if m[0] == "[") + rb'|/?[A-Z_]*")'
)


def markup_may_start(raw: bytes) -> bool:
    """Might a marker of some dialect begin in the text of these raw events (JSON bytes)? Every
    marker begins with `<` (`\\u003c` escaped) or is a bracket marker."""
    if raw.find(b"<") >= 0 or raw.find(b"\\u003") >= 0:
        return True
    # A pattern that begins with a literal is searched for that byte in C: one pass, where
    # counting the JSON's own `[{` and `[]` to rule brackets out took three.
    return _BRACKET_MARKUP.search(raw) is not None


def _latest_fields(fields: bytes) -> bytes:
    """Of `\\n`-ended field lines, the last `retry` and the last `id` (an EventSource keeps
    only those)."""
    last_id = last_retry = b""
    for line in fields.splitlines(keepends=True):
        if line.startswith(b"id"):
            last_id = line
        else:
            last_retry = line
    return last_retry + last_id


class SseRewriter:
    """An SSE body in (any byte pieces), the repaired SSE body out."""

    def __init__(self) -> None:
        self._framer = SseFramer()
        self.stats = RewriteStats()
        self.failure: Exception | None = None
        self._echo = EchoCheck()
        # `id:`/`retry:` lines of events rewritten or held, not sent yet: (the number of the
        # event in the stream, its field lines), oldest first.
        self._waiting: list[tuple[int, bytes]] = []
        # Held events the subclass may still send as they came, by identity: (raw, number).
        self._withheld: dict[int, tuple[bytes, int]] = {}
        self._sent_upto = 0  # the newest event whose fields went out while anything was waiting or held
        self._taken = 0  # events read so far: the number of the one being read
        # Set by a subclass while its state lets whole reads pass when `_nothing_to_read`.
        self._passes_whole_reads = False

    @property
    def changed(self) -> bool:
        """Did the client get anything else than upstream sent (so far)?"""
        return self._echo.changed

    def feed(self, data: bytes) -> list[bytes]:
        # (Not while fields wait or a held event keeps its own: the next event sent takes them.)
        if self._passes_whole_reads and self._echo.idle and not self._waiting and not self._withheld:
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
        self._place_fields(out, None)
        self._waiting = []
        self._withheld.clear()
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
            self._withheld.clear()  # nothing held is sent from now on
            return self._place_fields([raw], raw)
        if out != [raw] and not is_one_data_line(raw) and not any(piece is raw for piece in out):
            fields = _CARRIED_FIELD.findall(raw)
            if fields:
                sent_later = self._may_send_later(raw)
                self._wait(_LINE_END.sub(b"\n", b"".join(fields)), merge=not sent_later)
                if sent_later:
                    self._withheld[id(raw)] = (raw, self._taken)
        return self._place_fields(out, raw) if self._waiting or self._withheld else out

    def _wait(self, fields: bytes, merge: bool) -> None:
        """The fields of the event just read wait for an event to go on. Entries no held event
        stands between are merged, keeping the last `id` and the last `retry` (all the client
        keeps of them): a long hold costs one entry, not one per event. A held event's own entry
        stays apart: sent as it came, it carries its own fields, and only those are let go."""
        if merge and self._waiting and all(number < self._waiting[-1][0] for _, number in self._withheld.values()):
            fields = _latest_fields(self._waiting.pop()[1] + fields)
        self._waiting.append((self._taken, fields))

    def _place_fields(self, out: list[bytes], raw: bytes | None) -> list[bytes]:
        """An event rewritten or held loses its raw lines: its `id:` and `retry:` go on the
        events sent in its place, or on the next ones sent, so that the client's last event id
        and retry delay end up where upstream's would: never going back, none twice.

        `raw` is the event just read (None at the end). The last of an event's fields wins, so
        waiting fields older than an event sent as it came go before its own, and the newest go
        on the last piece. A held event sent as it came later keeps its own fields, unless they
        or newer ones went out meanwhile: then it goes without them."""
        if not out:
            return out
        last_keeps_own = False  # does the last piece end with its own fields (an event as it came)?
        for position, piece in enumerate(out):
            last_keeps_own = False
            if piece is raw:
                number = self._taken
                if self._withheld and not is_one_data_line(raw) and _CARRIED_FIELD.search(raw):
                    self._sent_upto = number  # fields newer than anything held
            elif (withheld := self._withheld.pop(id(piece), None)) is not None:  # (kept alive: ids are unique)
                number = withheld[1]
                if number <= self._sent_upto:  # its own fields would repeat or take the client back
                    out[position] = _CARRIED_FIELD.sub(b"", piece)
                    continue
                self._waiting = [entry for entry in self._waiting if entry[0] != number]  # it carries them
                self._sent_upto = number
            else:
                continue
            last_keeps_own = True
            older = [fields for n, fields in self._waiting if n < number]
            if older:
                out[position] = _latest_fields(b"".join(older)) + piece
                self._waiting = [entry for entry in self._waiting if entry[0] > number]
        if self._waiting:
            fields = _latest_fields(b"".join(fields for _, fields in self._waiting))
            self._sent_upto = max(self._sent_upto, self._waiting[-1][0])
            self._waiting = []
            last = out[-1]
            if last_keeps_own:  # older than the fields: they go after its own, before the blank line
                cut = len(last) - (2 if last.endswith(b"\r\n") else 1)
                out[-1] = last[:cut] + fields + last[cut:]
            else:
                out[-1] = fields + last
        return out

    def _may_send_later(self, raw: bytes) -> bool:
        """Might the event just read, not sent now, still be sent as it came (a subclass that
        holds raw events to send them later says so)? Then its fields stay in it."""
        return False

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
