"""Reasoning markup in a content channel: `<think>…</think>` and its spellings.

    <think>The user wants the weather.</think>

    It is sunny.

A block opens only at the start of the content (whitespace aside), where models write it: the
text between the tags is reasoning (`ReasoningText`), the rest is content. Spellings: `<think>`,
`<reasoning>`, `<thought>`, each with its own closing tag, and the pairs of the families that run
(`pairs`, the registry's `reasoning_tags`: Seed-OSS's `<seed:think>`, Mistral's `[THINK]`,
Command's `<|START_THINKING|>`; `keeps`: the markers a family's thought keeps as its text,
Mistral's `[TOOL_CALLS]`). Templates that pre-open the block (DeepSeek-R1, QwQ, Qwen3 Thinking)
make the output start inside reasoning with only the closing tag to come: `preopened=True`.

States (`_state`):

    START   --an opening tag first------> THINK    (the tag and whitespace before it dropped)
    START   --anything else-------------> CONTENT  (WATCH where a closer may come bare)
    WATCH   --`</think>`----------------> CONTENT  (the tag dropped, the layout after it kept)
    WATCH   --a tool-call marker--------> CONTENT  (arguments may hold the tags)
    THINK   --a closing tag-------------> CONTENT  (the tag and the whitespace after it dropped)
    THINK   --a tool-call section begins-> CONTENT  (registry `ends_reasoning`: the call ends it;
                                                    the marker goes on, for the call dialects)
    CONTENT: everything is content, tags included (code that strips think tags, arguments)

A pre-opened stream starts in THINK, where an opening tag written anyway (DeepSeek-R1-0528
writes its own) is dropped too. WATCH (`bare_close`): a family whose template may open the block
(by request: thinking was not said) may write a bare closer; what came before it went out as
content, and the closer itself never does (issue 20: a bare `</think>` never reaches content).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from .base import Lexer, Marker, ReasoningText, Reporting, Segment, Text, find_marker

CLOSE, TOOLS, STOP = "close", "tools", "stop"  # marker kinds inside a block, and WATCH's own
_PAIRS = {"<think>": "</think>", "<reasoning>": "</reasoning>", "<thought>": "</thought>"}  # any model's
# Every generic spelling, opening and closing (the registry adds the families' own).
REASONING_TAGS = tuple(_PAIRS) + tuple(_PAIRS.values())


@lru_cache(maxsize=1024)
def _marker(text: str, kind: str) -> Marker:
    """The one marker of `text` in the role `kind`. Markers are compared and hashed by identity:
    a lexer's tuples of them, made anew for each stream, would each be a table `find_marker`
    has not made yet (base.py's `_marker_table`, a few tens of thousands of instructions)."""
    return Marker(text, kind)


_CLOSE_MARKERS = tuple(_marker(t, CLOSE) for t in _PAIRS.values())

START, CONTENT, THINK, WATCH = "start", "content", "think", "watch"
_BARE_CLOSER = "</think>"  # WATCH's: the families that may leave the block open all close it so


class ThinkLexer(Reporting):
    """Splits one content channel into reasoning and content (see the module docstring)."""

    def __init__(
        self, *, preopened: bool = False, tool_starts: tuple[str, ...] = (), started: bool = False, pairs: dict[str, str] | None = None,
        keeps: dict[str, tuple[str, ...]] | None = None, bare_close: tuple[str, ...] | None = None,
    ) -> None:  # fmt: skip
        """`bare_close`: watch for a bare closer after a start that opened nothing, up to the first
        of these markers (the running dialects' starts); None: no watch."""
        self._pairs = {**_PAIRS, **pairs} if pairs else _PAIRS
        closers = tuple(_marker(t, CLOSE) for t in self._pairs.values()) if pairs else _CLOSE_MARKERS
        self._think_markers = closers + tuple(_marker(t, TOOLS) for t in tool_starts)
        self._watch_markers = None if bare_close is None else (_marker(_BARE_CLOSER, CLOSE),) + tuple(_marker(t, STOP) for t in bare_close)
        after_start = CONTENT if bare_close is None else WATCH
        self._start = THINK if preopened else after_start if started else START  # started: content was sent before
        self._markers_in = {tag: tuple(m for m in self._think_markers if m.kind != TOOLS or m.text not in kept) for tag, kept in (keeps or {}).items()}
        self._reset()
        self._report_idle()

    def _reset(self) -> None:
        self._state = self._start
        self._at_start = True  # THINK: nothing read yet (a pre-opened model may still write `<think>`)
        self._opener = ""  # the tag that opened the block ("" when pre-opened)
        self._buf = ""
        self._drop_ws = False  # after a closing tag: the blank lines that follow are layout

    def _idle_now(self) -> bool:
        # WATCH too: text without a marker's first character passes as content unread.
        return (self._state == CONTENT or self._state == WATCH) and not self._buf and not self._drop_ws

    @property
    def reads_nothing(self) -> bool:
        """Idle in CONTENT: any text, markers included, would pass as content unread. (WATCH's
        idle is weaker: a `<` there may begin the bare closer.)"""
        return self.idle and self._state == CONTENT

    def finish(self) -> list[Segment]:
        out = self._run(final=True)
        self._reset()
        self._report_idle()
        return out

    def _run(self, final: bool) -> list[Segment]:
        out: list[Segment] = []
        buf, pos = self._buf, 0
        while pos < len(buf):
            if self._state == CONTENT:
                self._emit(buf[pos:], out)
                pos = len(buf)
                break
            if self._state == START or self._at_start:
                if not buf[pos:].strip():
                    # Whitespace alone decides nothing, but holding it would make the result
                    # depend on whether it came in an event of its own (which may pass untouched).
                    self._emit(buf[pos:], out)
                    pos = len(buf)
                    break
                opened = self._open_tag(buf, pos, final)
                if opened is None:  # a possible tag cut short: wait for more
                    break
                if opened != pos:
                    pos, self._state, self._at_start = opened, THINK, False
                    continue
                self._at_start = False
                if self._state == START:
                    self._state = CONTENT if self._watch_markers is None else WATCH
                    continue
            if self._state == WATCH:
                markers = self._watch_markers
            else:
                markers = self._markers_in.get(self._opener, self._think_markers)
            match = find_marker(buf, pos, markers, final)
            if match is not None and match.marker is not None and match.marker.kind == STOP:
                self._state = CONTENT  # the text, the marker and the rest go on as one piece, as ever
                continue
            end = len(buf) if match is None else match.pos
            if match is not None and match.marker is None:
                # A possible tag is held with the whitespace before it: sent alone, the dialects
                # behind would keep what, in one piece with markup, is its padding (fuzzing).
                end = pos + len(buf[pos:end].rstrip())
            if end > pos:
                self._emit(buf[pos:end], out)
            if match is None or match.marker is None:
                pos = end
                break
            marker = match.marker
            pos = match.pos + len(marker.text)
            was, self._state = self._state, CONTENT
            if marker.kind == CLOSE:
                # After a bare closer the layout is kept: else it runs into the content before.
                self._drop_ws = was == THINK
            else:  # a tool call begins (inside reasoning, or WATCH ends): content for the call dialects
                out.append(Text(marker.text))
        self._buf = buf[pos:]
        if final and self._buf:  # whitespace or a cut tag at the very end: it was text
            self._emit(self._buf, out)
            self._buf = ""
        return out

    def _open_tag(self, buf: str, pos: int, final: bool) -> int | None:
        """At the start: the position after an opening tag (and the whitespace before it), `pos`
        when none opens here, None when it cannot be told yet."""
        rest = buf[pos:].lstrip()
        if not rest:
            return pos if final else None
        for tag in self._pairs:
            if rest.startswith(tag):
                self._opener = tag
                return len(buf) - len(rest) + len(tag)
        if not final and any(tag.startswith(rest) for tag in self._pairs):
            return None
        return pos

    def _emit(self, text: str, out: list[Segment]) -> None:
        if self._state == THINK:
            out.append(ReasoningText(text))
            return
        if self._drop_ws:
            text = text.lstrip()
            if not text:
                return
            self._drop_ws = False
        out.append(Text(text))


class ReasoningSplit:
    """A content channel that may hold reasoning: `ThinkLexer` splits it, and each side runs its
    own chain of call dialects. Calls inside `<think>` follow parsers.md 5.11: tag dialects hold
    a block found there, bounded like any block, and make it a call only when it is complete,
    well-formed and names a declared tool; anything else stays reasoning text. (Kimi and
    DeepSeek sections end the reasoning in `ThinkLexer` itself and are calls.)
    """

    def __init__(self, think: ThinkLexer, make_reasoning: Callable[[], Lexer], content: Lexer) -> None:
        self._think = think
        # The reasoning side's chain, made when reasoning first comes (most streams hold no
        # `<think>`: a stream's first read made its lexers for nothing, a tenth of that read).
        self._make_reasoning: Callable[[], Lexer] | None = make_reasoning
        self._reasoning: Lexer | None = None
        self._content = content
        self._side: Lexer | None = None  # the chain the last piece of text went to

    @property
    def idle(self) -> bool:
        return self._think.idle and (self._reasoning is None or self._reasoning.idle) and self._content.idle

    def feed(self, text: str) -> list[Segment]:
        return self._route(self._think.feed(text))

    def finish(self) -> list[Segment]:
        out = self._route(self._think.finish())
        if self._reasoning is not None:
            out += self._as_side(self._reasoning, self._reasoning.finish())
        out += self._content.finish()
        self._side = None
        return out

    def _reasoning_side(self) -> Lexer:
        if self._reasoning is None:
            self._reasoning = self._make_reasoning()
            self._make_reasoning = None
        return self._reasoning

    def _route(self, segments: list[Segment]) -> list[Segment]:
        out: list[Segment] = []
        for seg in segments:
            side = self._reasoning_side() if type(seg) is ReasoningText else self._content
            if self._side is not None and self._side is not side:
                out += self._as_side(self._side, self._side.finish())  # what one side held ends where the other begins
            self._side = side
            out += self._as_side(side, side.feed(seg.text))
        return out

    def _as_side(self, side: Lexer, segments: list[Segment]) -> list[Segment]:
        if side is self._content:
            return segments
        return [ReasoningText(seg.text) if type(seg) is Text else seg for seg in segments]
