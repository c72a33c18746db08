"""Incremental Server-Sent Events framing.

`SseFramer` is fed the response body in whatever pieces the network delivers and hands back
whole events, each carrying its exact upstream bytes so that an event needing no change can be
forwarded byte for byte. Bytes are never decoded before an event is complete, so a UTF-8
sequence split across reads is never mangled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import repeat
from operator import add

import orjson

# One line ending: CRLF, a lone CR or a lone LF (the SSE spec allows all three).
_LINE_END = re.compile(rb"\r\n|\r|\n")
_TEXT_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(slots=True)
class SseEvent:
    """One SSE block: its raw bytes (terminating blank line included) and its parsed fields."""

    raw: bytes
    data: str | None = None  # data lines joined with "\n"; None when the block has no data line
    event: str | None = None  # the `event:` field, when present
    malformed: bool = False  # not valid UTF-8: can only be forwarded as it is

    @property
    def is_done_sentinel(self) -> bool:
        return self.data is not None and self.data.startswith("[DONE]")


def parse_block(raw: bytes) -> SseEvent:
    """Parse one complete block (as cut by SseFramer) into its fields."""
    if is_one_data_line(raw):  # what streaming servers send: read without splitting lines
        value = raw[6:-2] if raw.startswith(b"data: ") else raw[5:-2]
        try:
            return SseEvent(raw, value.decode("utf-8"))
        except UnicodeDecodeError:
            return SseEvent(raw, malformed=True)
    data_at = named_data_at(raw)
    if data_at:  # what the Responses and Messages APIs send: the same, after the name's line
        name, value = raw[7 if raw[6] == 32 else 6 : data_at - 1], raw[data_at + 6 if raw[data_at + 5] == 32 else data_at + 5 : -2]
        try:
            return SseEvent(raw, value.decode("utf-8"), name.decode("utf-8"))
        except UnicodeDecodeError:
            return SseEvent(raw, malformed=True)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return SseEvent(raw, malformed=True)
    data_lines: list[str] = []
    event_name = None
    for line in _TEXT_LINE_END.split(text):
        if not line or line.startswith(":"):
            continue
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data_lines.append(value)
        elif name == "event":
            event_name = value
    return SseEvent(raw, "\n".join(data_lines) if data_lines else None, event_name)


def read_event(raw: bytes) -> tuple[dict, SseEvent] | None:
    """A typed JSON event (`{"type": …}`: Responses, Anthropic) and its block, or None when the
    block is anything else (no data, not UTF-8, not JSON, no type): such a block passes as it came."""
    block = parse_block(raw)
    if block.data is None or block.malformed:
        return None
    try:
        event = orjson.loads(block.data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        return None
    return event, block


# (These two run for nearly every event. They ask with slices, `in` and `partition`: CPython
# 3.11's `find`, `startswith` and `endswith` parse their arguments from a format string on every
# call, about a thousand instructions each, where `13 in raw` is a few hundred.)


def is_one_data_line(raw: bytes) -> bool:
    """`data:…\n\n` and nothing else: one line, LF-ended, then the blank line."""
    return raw[:5] == b"data:" and 13 not in raw and raw.partition(b"\n")[2] == b"\n"  # (after the first LF, only the last)


def named_data_at(raw: bytes) -> int:
    """Where the data line of `event:…\ndata:…\n\n` begins, when `raw` is that and nothing
    else (an event line and one data line, LF-ended, then the blank line); else 0."""
    if raw[:6] != b"event:":
        return 0
    line, _, rest = raw.partition(b"\n")
    if rest[:5] == b"data:" and 13 not in raw and rest.partition(b"\n")[2] == b"\n":
        return len(line) + 1
    return 0


def has_no_fields(raw: bytes) -> bool:
    """Is `raw` one of the blocks that cannot hold an `id:` or `retry:` line (a data line, with
    an event line before it or not), told without a search of its lines?"""
    return is_one_data_line(raw) or named_data_at(raw) > 0


def encode_event(data: bytes, event: str | None = None) -> bytes:
    """Serialise one event (`data` must be a single line, as compact JSON is)."""
    if event is None:
        return b"data: " + data + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"


class SseFramer:
    """Cuts a byte stream into SSE blocks at blank lines.

    Scanning resumes where the previous feed stopped, so an event delivered one byte at a time
    costs linear work, not quadratic.
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._scan = 0  # first byte of the line not yet scanned
        self._line_start = 0  # start of the current (unfinished) line

    @property
    def pending(self) -> int:
        """Bytes held because their event is not complete yet."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return the raw bytes of every block completed by them."""
        if not self._buf and len(data) > 2:
            if has_no_fields(data):
                return [data]  # a read that is one whole event, as most are: nothing to scan
            if data[-2:] == b"\n\n" and data[0] != 10 and 13 not in data and data.find(b"\n\n\n") < 0:
                # Whole events with LF line ends (a read of several, in bursts), no empty block
                # among them: cut at their blank lines in C, as `_cut_lf` cuts them one by one.
                blocks = data.split(b"\n\n")
                blocks.pop()
                return list(map(add, blocks, repeat(b"\n\n")))
        self._buf += data
        return self._cut(final=False)

    def hold(self, rest: bytes) -> None:
        """`feed` of bytes in which no block ends, given while nothing is held: the rest of a
        read after its last blank line, without a CR (`SseRewriter._whole_read`). Such bytes
        neither begin with a line end nor hold a blank line, so `feed` would only keep them,
        scanned: kept so here, without the scan's calls."""
        self._buf += rest
        self._scan = len(rest)
        self._line_start = rest.rfind(b"\n") + 1

    def close(self) -> list[bytes]:
        """End of body: return the blocks completed now; an unterminated tail stays for
        `take_pending` (it is no event, so it can only be forwarded as it is)."""
        return self._cut(final=True)

    def take_pending(self) -> bytes:
        """Give up framing: return the held bytes as they are (used when failing open)."""
        rest = bytes(self._buf)
        self._buf.clear()
        self._scan = self._line_start = 0
        return rest

    def _cut(self, final: bool) -> list[bytes]:
        buf = self._buf
        blocks: list[bytes] = []
        block_start = 0
        scan, line_start = self._scan, self._line_start
        if buf.find(b"\r", scan) < 0:
            return self._cut_lf(scan, line_start)
        while True:
            m = _LINE_END.search(buf, scan)
            if m is None:
                scan = len(buf)  # the next feed resumes here instead of rescanning the line
                break
            end = m.end()
            if m.group() == b"\r" and end == len(buf) and not final:
                scan = m.start()  # a CR at the very end may be the first half of a CRLF
                break
            if m.start() == line_start:  # empty line: the block is complete
                blocks.append(bytes(buf[block_start:end]))
                block_start = end
            scan = line_start = end
        if block_start:
            del buf[:block_start]
            scan -= block_start
            line_start -= block_start
        self._scan, self._line_start = scan, line_start
        return blocks

    def _cut_lf(self, scan: int, line_start: int) -> list[bytes]:
        """`_cut` when no CR is left to read (LF line ends, as servers send them): one search
        for each block's blank line (a line end, then a line end at the start of a line), not
        one for each line."""
        buf = self._buf
        blocks: list[bytes] = []
        block_start, size = 0, len(buf)
        while True:
            if line_start == scan < size and buf[scan] == 10:  # (the line begun here is empty)
                end = scan + 1
            else:  # (a line end before `scan` would have moved `line_start` to it)
                end = buf.find(b"\n\n", scan) + 2
                if end < 2:
                    break
            blocks.append(bytes(buf[block_start:end]))
            block_start = scan = line_start = end
        line_start = max(line_start, buf.rfind(b"\n", scan) + 1)
        if block_start:
            del buf[:block_start]
            line_start -= block_start
        self._scan, self._line_start = size - block_start, line_start
        return blocks
