"""Chat Completions: map lexer segments back onto `chat.completion.chunk` events and messages.

Wire rules the real clients enforce (DESIGN.md, research/wire.md section 1): every
`tool_calls` delta has a 0-based `index` in order of appearance; `id`, `type` and
`function.name` appear once, in a call's first delta; a chunk holds at most one entry per
index; `finish_reason` becomes `tool_calls` when a call was emitted and upstream said `stop`;
metadata (`id`, `model`, `created`, ...) and the usage chunk are kept; no empty deltas.
"""

from __future__ import annotations

import re
from types import FunctionType
from typing import Any

import orjson

from .bodies import burst_events
from .calls import INVALID_JSON, STRICT_FAILURE, CallScope, RewriteStats
from .lexers import ScopeLexers, reads_the_start
from .lexers.base import CallArgs, CallBegin, CallEnd, ChainLexer, Lexer, ReasoningEnd, ReasoningText, Segment, Text
from .native import EMPTY_ARGUMENTS, OBJECT_ARGUMENTS, ArgumentTyping, NativeCalls
from .sse import encode_event, is_one_data_line, parse_block
from .stream import Contribution, Frame, SecondOf, SseRewriter, each_string, guarded, held_burst, live_path, markup_may_start, noting_lane, plain_body, quiet_lane, string_spans, text_may_start_markup, unwind
from .tools import RequestContext

CONTENT = "content"
REASONING_KEYS = ("reasoning_content", "reasoning")  # SGLang/Moonshot, vLLM/OpenRouter
TEXT_KEYS = (*REASONING_KEYS, CONTENT)
PARSE_FAILURES = (INVALID_JSON, STRICT_FAILURE)
_TEXT_KEY_SET = frozenset(TEXT_KEYS)
_PLAIN_CHOICE_KEYS = frozenset(("index", "delta", "logprobs", "finish_reason"))
# Upstream's own tool calls in a chunk: they take call indices, so the chunk must be read.
_UPSTREAM_CALLS = re.compile(rb'"tool_calls"\s*:\s*\[\s*\{')
# Content that starts the answer: whitespace alone does not (a `<think>` may still open after it,
# as the lexers and the buffered rewrite have it; fuzzing found " " then "<think>…" read apart).
_CONTENT_TEXT = re.compile(rb'"content"\s*:\s*"(?:[ \t\r\n]|\\[nrt])*(?:[^"\\ \t\r\n]|\\[^nrt])')
_loads = orjson.loads  # (the lanes' one global lookup)
# The open call's index while a frame is rendered (`ChatStreamRewriter._arm`), then replaced by
# the index itself: digits no stream's metadata holds where the call's index goes.
_INDEX_PROBE = 8_106_359_127_405_193
_INDEX_PROBE_BYTES = str(_INDEX_PROBE).encode()
# Once a call was made, a finish_reason must be read (`stop` becomes `tool_calls`).
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"')


# A part of a choice's output, in order: ("text", keys, text) | ("call", index, id, name)
# | ("args", index, text).
Part = tuple


class CallIndices:
    """The call indices of one choice, handed out in order to its calls found in markup and to
    upstream's own (`NativeCalls.allocate`). (Apart from `ChoiceRewriter`, so that the two hold
    no reference cycle: a choice's objects go by their reference counts, not the collector.)"""

    __slots__ = ("next", "_scope")

    def __init__(self, scope: CallScope) -> None:
        self.next = 0
        self._scope = scope

    def take(self) -> int:
        index = self.next
        self.next += 1
        return index

    def take_native(self) -> int:
        """Upstream's own tool calls keep their order but share our index space."""
        index = self.take()
        self._scope.note_upstream_call()
        return index


class ChoiceRewriter:
    """The text channels of one choice: their lexers, call indices and reasoning switch."""

    def __init__(self, context: RequestContext, stats: RewriteStats, *, max_held: int) -> None:
        self._scope = CallScope(context, stats)
        self._dialects = ScopeLexers(self._scope, max_held=max_held)
        # The field(s) reasoning goes to when `<think>` is found in content: the ones upstream
        # uses for reasoning in this choice, else the configured one.
        self._reasoning_keys: tuple[str, ...] | None = None
        self._reasoning_field = context.reasoning_field or "reasoning_content"
        self._upstream_reasoning = False  # upstream sent a reasoning field in this choice
        self.content_started = False  # content passed untouched before a lexer was made
        self._lexers: dict[tuple[str, ...], Lexer] = {}
        self._reasoning_over: set[tuple[str, ...]] = set()  # channels whose `</think>` leaked
        self._open_index: int | None = None
        self._indices = CallIndices(self._scope)
        self.native = NativeCalls(self._indices.take_native, self._scope.mint_call_id, stats.stream_repairs, self._scope.tools)  # upstream's own calls

    @property
    def idle(self) -> bool:
        """Nothing held, and text with no marker would pass as it came."""
        if not self._dialects.idle:
            return False  # (first: the cheapest, and what a call's events find)
        if (CONTENT,) not in self._lexers and (self._dialects.bare_json or (self._dialects.preopened and not self._upstream_reasoning)):
            return False  # the start of the content must be read (pre-opened reasoning, bare JSON)
        if self.native.emitted:
            return False  # upstream made calls: its finish_reason must be read ("stop" is wrong)
        if self._reasoning_over:
            return False  # a reasoning channel's text now goes to content: none passes as it came (fuzzing)
        return self.native.idle  # (the lexers report their own changes: `_dialects.idle`)

    def feed(self, channel: tuple[str, ...], text: str, parts: list[Part]) -> None:
        lexer = self._lexers.get(channel)
        if lexer is None:
            reasoning = channel[0] != CONTENT
            if not text and not reasoning:
                return  # an empty first piece (`"content": ""` with the role) decides nothing yet
            if reasoning:
                self._upstream_reasoning = True
                if self._reasoning_keys is None:
                    self._reasoning_keys = channel  # reasoning found in content goes where upstream puts it
            # An upstream that splits reasoning itself has already closed any pre-opened block.
            lexer = self._lexers[channel] = self._dialects.new_lexer(
                reasoning=reasoning, preopened=not self._upstream_reasoning, started=self.content_started
            )
        self._place(channel, lexer.feed(text), parts)

    def finish(self, parts: list[Part]) -> None:
        for channel, lexer in self._lexers.items():
            self._place(channel, lexer.finish(), parts)

    def lexer(self, channel: tuple[str, ...]) -> Lexer | None:
        return self._lexers.get(channel)

    def place(self, channel: tuple[str, ...], segments: list[Segment], parts: list[Part]) -> None:
        """What the channel's lexer made of a piece of its text (fed by a lane), as parts."""
        self._place(channel, segments, parts)

    def note_upstream_calls(self, count: int) -> None:
        """A whole message's own calls, listed before any of ours: they count, as when streamed."""
        for _ in range(count):
            self._scope.note_upstream_call()

    @property
    def emitted_calls(self) -> bool:
        """True once this choice holds a call of ours (upstream's own ones do not count)."""
        return self._indices.next > self.native.emitted

    def _place(self, channel: tuple[str, ...], segments: list[Segment], parts: list[Part]) -> None:
        for seg in segments:
            if type(seg) is Text:
                keys = (CONTENT,) if channel in self._reasoning_over else channel
                parts.append(("text", keys, seg.text))
            elif type(seg) is CallArgs:
                parts.append(("args", self._open_index, seg.text))
            elif type(seg) is CallBegin:
                self._open_index = self._indices.take()
                parts.append(("call", self._open_index, seg.id, seg.name))
            elif type(seg) is CallEnd:
                self._open_index = None
            elif type(seg) is ReasoningEnd:
                self._reasoning_over.add(channel)
            elif type(seg) is ReasoningText:
                self._scope.stats.reasoning_moved += len(seg.text)
                if self._reasoning_keys is None:
                    self._reasoning_keys = (self._reasoning_field,)
                parts.append(("text", self._reasoning_keys, seg.text))


def text_channels(holder: dict[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    """The text fields of a delta or message as channels, reasoning first (it comes first in
    the model's output, and tells whether content can start inside reasoning): mirrored
    reasoning fields are one channel. (Runs for every event read: kept to one pass.)"""
    reasoning = [(key, value) for key, value in holder.items() if key in REASONING_KEYS and isinstance(value, str)]
    if len(reasoning) == 2 and reasoning[0][1] == reasoning[1][1]:
        channels = [((reasoning[0][0], reasoning[1][0]), reasoning[0][1])]
    else:
        channels = [(_CHANNEL_OF[key], value) for key, value in reasoning]
    content = holder.get(CONTENT)
    if isinstance(content, str):
        channels.append((_CHANNEL_OF[CONTENT], content))
    return channels


_CHANNEL_OF = {key: (key,) for key in TEXT_KEYS}


def parts_to_deltas(parts: list[Part]) -> list[dict[str, Any]]:
    """Pack parts into deltas, keeping order: text may precede calls in one delta, never follow.

    A call's first delta carries index, id, type and name (arguments joined to it); each
    delta holds at most one entry per call index.
    """
    deltas: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    for part in parts:
        kind = part[0]
        if kind == "text":
            _, keys, text = part
            last_key = next(reversed(current), None) if current else None
            if "tool_calls" in current or (keys[0] in current and last_key not in keys):
                deltas.append(current)
                current = {}
            for key in keys:
                current[key] = current.get(key, "") + text
        else:
            index = part[1]
            calls = current.setdefault("tool_calls", [])
            entry = next((c for c in calls if c["index"] == index), None)
            if kind == "call":
                calls.append(_call_start(part))
            elif entry is not None:
                entry["function"]["arguments"] += part[2]
            else:
                calls.append({"index": index, "function": {"arguments": part[2]}})
    if current:
        deltas.append(current)
    return deltas


def _call_start(part: Part) -> dict[str, Any]:
    """A call's first delta entry (of its "call" part): index, id, type and name."""
    return {"index": part[1], "id": part[2], "type": "function", "function": {"name": part[3], "arguments": ""}}


class Rendered:
    """What the full path makes of the events of a frame (`ChatStreamRewriter._render_frame`):
    the output frame around a piece of the open call's arguments (`head`, `tail`, whole events
    `before` and `after` it), the events of a text held (`held`), the one event around a text
    of the frame's channel (`text`: its head and tail, () when a text renders otherwise, as a
    mirrored one does; None until wanted: `_text_frame`), and what renders any other parts of
    such an event (`render`: the chunk's metadata, its usage, its choice; the text itself plays
    no part in the rendering)."""

    __slots__ = ("head", "tail", "before", "after", "held", "text", "template", "usage", "choice")

    def __init__(
        self, head: bytes, tail: bytes, before: list[bytes], after: list[bytes], held: list[bytes], text: tuple[bytes, bytes] | tuple[()] | None,
        template: dict[str, Any], usage: dict[str, Any], choice: dict[str, Any],
    ) -> None:  # fmt: skip
        self.head, self.tail, self.before, self.after, self.held, self.text = head, tail, before, after, held, text
        self.template, self.usage, self.choice = template, usage, choice


class ArgsLane:
    """The steady state of markup being read: events that differ only in the text of one
    channel whose lexer holds something (a call's header, its arguments streamed live as
    Kimi, DeepSeek and Harmony do, a block held until it closes as the tag dialects do).

    Learned after an event read in full (`ChatStreamRewriter._arm`): the input `frame` from that
    event's own bytes, and the output frame (`head`, `tail`, and whole events `before` and
    `after` it) rendered by the full path's rules around a probe argument, so byte for byte
    what the full path sends. Per event: the frame is checked, its string decoded by orjson
    (which also rejects what is not one valid string, and decodes `\\u003c`), and only the
    innermost live lexer (`leaf`) is fed; the lexers around it (`path`) are transparent to its
    text while it is in the call (see `live_path`). `[]` (whitespace held): the `held` events;
    one `CallArgs`: the output frame around it; anything else goes back through `path` and
    on to the parts they make, rendered as the full path renders them (`_read_lexed`).
    """

    __slots__ = (
        "frame", "frame_head", "frame_mid", "frame_tail", "fixed", "start", "end", "leaf", "chained", "path", "head", "tail", "before", "after",
        "alone", "held", "finished", "rendered", "state", "channel", "guarded", "steady", "steady_bodies", "stop", "verbatim",
    )  # fmt: skip

    def __init__(
        self, frame: Frame, path: tuple[Lexer, list[Lexer]], head: bytes, rendered: Rendered, finished: bool, state: ChoiceRewriter,
        channel: tuple[str, ...],
    ) -> None:  # fmt: skip
        self.frame = frame
        # (What `_args_read` reads of them per event, one lookup each; `frame_mid` is not None when
        # the frame's string is mirrored: the same string twice)
        self.frame_head, self.frame_mid, self.frame_tail, self.fixed = frame.head, frame.mid, frame.tail, frame.fixed
        self.start, self.end = len(frame.head), len(frame.tail)  # where the string's body begins; its tail's length
        self.leaf, self.path = path
        self.chained = type(self.leaf) is ChainLexer  # (a chain armed while its first stage held something: `past_idle_first`)
        self.head, self.tail = head, rendered.tail
        self.before, self.after, self.held = rendered.before, rendered.after, rendered.held
        self.alone = not rendered.before and not rendered.after  # one event out for one in
        self.finished = finished
        self.rendered, self.state, self.channel = rendered, state, channel
        self.guarded = guarded(self.path)  # the leaf takes only text no marker can begin in (`live_path`)
        # The leaf's steady pieces, taken without the segments `feed` would make of them
        # (`Lexer.steady_piece`). Not for a chain's leaf, which may change, nor a guarded one,
        # whose text may begin a marker the chain around it reads. The class's functions, called
        # with the leaf: a bound method kept would be an object more a lane holds, for the
        # garbage collector to count (see `TextLane` in responses.py).
        self.steady = None if self.chained or self.guarded else getattr(type(self.leaf), "steady_piece", None)
        # The same for a read of several events at once (`_args_burst`), where the lane sends one
        # event for each piece and nothing for a piece that makes nothing.
        steady_bodies = getattr(type(self.leaf), "steady_bodies", None) if self.steady is not None else None
        self.steady_bodies = steady_bodies if self.alone and not self.held else None
        # The leaf in its verbatim state (`Lexer.steady_piece`), as its last piece left it: the
        # next text without `stop` nor whitespace at its end is the arguments it makes.
        self.stop = getattr(type(self.leaf), "verbatim_stop", None) if self.steady is not None else None
        self.verbatim = False

    def past_idle_first(self) -> Lexer:
        """The leaf, a chain whose first stage is now idle: the path goes on into its second
        stage (`live_path`), and the lane's leaf is the one found there."""
        leaf, path = live_path(self.leaf, past_idle_first=True)
        self.leaf, self.path = leaf, [*self.path, *path]
        self.chained = type(leaf) is ChainLexer
        self.guarded = guarded(self.path)
        return leaf


class ChatStreamRewriter(SseRewriter):
    """A Chat Completions SSE body in (any byte pieces), the repaired SSE body out."""

    def __init__(self, context: RequestContext, *, max_held: int = 1 << 20) -> None:
        super().__init__()
        self._context = context
        self._max_held = max_held
        self._choices: dict[Any, ChoiceRewriter] = {}
        self._template: dict[str, Any] | None = None  # metadata of the last chunk read
        self._reads_start = reads_the_start(context)
        self._content_started = False
        # Until upstream's reasoning field is seen, events naming one are read: reasoning moved
        # out of `content` must go to the field upstream uses.
        self._reasoning_field_known = False
        # Nothing held: an event with nothing to read passes as it came.
        self._idle = not self._reads_start
        self._passes_whole_reads = self._idle  # (`_settle`)
        # The lanes (stream.py): plain text while idle (`_quiet_frame`), a call's arguments
        # while one is open (`_args`). Each is learned from an event the full path read, and
        # dropped by the next event the full path reads (or a lane reads as the full path
        # does, `_read_lexed`); the quiet one is taken up again once idle (`_quiet_kept`).
        self._quiet_frame: Frame | None = None
        self._quiet_run = 0  # events passed quietly since the last one read in full
        # The last quiet lane learned, taken up again whenever the rewriter is idle again (after
        # a call, a block): (frame, lane), or None. A frame that holds a finish_reason is not
        # kept (once a call was made, the full path reads one).
        self._quiet_kept: tuple[Frame, Any] | None = None
        self._args: ArgsLane | None = None
        self._armed_frame: Frame | None = None  # the frame of the last lane armed (`_arm`), and its `channel`
        self._lexed: tuple | None = None  # what `_rewrite_choice` read last (for `_arm`)
        self._renders: dict[tuple, tuple] = {}  # frame -> what it renders to (`_render_frame`; () none)

    # -- events ----------------------------------------------------------------------------------

    def _all_idle(self) -> bool:
        if len(self._choices) == 1:
            return next(iter(self._choices.values())).idle  # (one choice, as nearly every stream has)
        if not self._choices and self._reads_start:
            return False
        return all(choice.idle for choice in self._choices.values())

    def _nothing_to_read(self, raw: bytes) -> bool:
        """No marker can start in these bytes, neither an upstream call nor a first reasoning
        field is in them, nor (once a call was made) a finish_reason: they go out as they came
        (every caller sends them so), and the answer's first text among them begins the answer."""
        if markup_may_start(raw):
            return False
        # (`partition`, not `find`, whose arguments CPython 3.11 parses from a format string on
        # every call, nor `in`: see addon.py. Without the needle, it copies nothing.)
        if raw.partition(b'"tool_calls"')[1] and _UPSTREAM_CALLS.search(raw):
            return False
        if self.stats.calls and raw.partition(b'"finish_reason"')[1] and _FINISH.search(raw):
            return False
        if not self._reasoning_field_known and raw.partition(b'"reasoning')[1]:
            return False
        if not self._content_started and _CONTENT_TEXT.search(raw):
            self._content_starts()  # (a whole read's as well as an event's: a later `<think>` is text)
        return True

    def _content_starts(self) -> None:
        self._content_started = True  # a reasoning block can no longer open
        self._passes_whole_reads = True  # (`_settle`: its callers are idle)
        for choice in self._choices.values():
            choice.content_started = True

    def _on_block(self, raw: bytes) -> list[bytes]:
        if self._args is not None:
            out = self._args_read(raw)
            if out is not None:
                return out
        elif self._quiet_frame is not None and self._quiet_read(raw) is not None:
            return [raw]
        if self._idle and self._nothing_to_read(raw):
            if self.lanes:
                self._passed_whole(raw)
            return [raw]  # fast path: no marker can start here and nothing is held
        if self._quiet_frame is not None:
            out = self._quiet_markup(raw)
            if out is not None:
                return out
        return self._read_in_full(raw)

    def _read_in_full(self, raw: bytes, lexed: list[Segment] | None = None) -> list[bytes]:
        self._args = self._quiet_frame = self._direct = None
        self._quiet_run = 0
        self._lexed = None
        out = self._read_block(raw, lexed)
        self._settle()
        if self._lexed is not None and self.lanes:
            self._arm(raw)
        return out

    def _settle(self) -> None:
        """State changes only after an event read (in full or by a lane that fed a lexer): whether
        the next events may take the fast path."""
        self._idle = self._all_idle() and not (self._context.parse_error_chunk and self.stats.problems)
        # Whole reads pass while idle (`_nothing_to_read`), but in reasoning before the answer:
        # there Kimi's calls come every few dozen events, and a read with markup is read event by
        # event, its marker's event at less cost with a quiet frame (`_quiet_markup`), which is
        # learned from events passed one by one only (bench/instructions.py --cold: a Kimi flow
        # in bursts 3% more with its plain reads of reasoning passed whole; a plain flow 20%
        # less with the answer's start passed whole).
        self._passes_whole_reads = self._idle and (self._content_started or not self._reasoning_field_known)
        if self._idle and self._quiet_kept is not None and self._quiet_frame is None and self.lanes:
            self._quiet_frame, self._direct = self._quiet_kept
            if self.laned is not None:
                self.laned.armed(*self._direct.noted_as)

    def _read_block(self, raw: bytes, lexed: list[Segment] | None = None) -> list[bytes]:
        event = parse_block(raw)
        if event.data is None or event.malformed:
            return [raw]
        if event.is_done_sentinel:
            return [*self._flush_all(), raw]
        try:
            chunk = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            return [raw]
        if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list) or "error" in chunk:
            return [raw]
        if not self._reasoning_field_known and raw.find(b'"reasoning') >= 0:
            # (`find`, not `in`: `bytes in bytes` tries the needle as an integer first, and the
            # exception it makes and clears costs about what the search does.)
            self._reasoning_field_known = True
        chunks = self._rewrite_chunk(chunk, lexed)
        if chunks is None:
            return [raw]
        return [encode_event(orjson.dumps(c), event.event) for c in chunks]

    def _choice(self, index: Any) -> ChoiceRewriter:
        choice = self._choices.get(index)
        if choice is None:
            choice = self._choices[index] = ChoiceRewriter(self._context, self.stats, max_held=self._max_held)
            choice.content_started = self._content_started
        return choice

    def _rewrite_chunk(self, chunk: dict[str, Any], lexed: list[Segment] | None = None) -> list[dict[str, Any]] | None:
        """The chunks replacing `chunk`, or None when it passes unchanged. `lexed`: what the
        lexer of its one text channel made of its text already (the lane fed it)."""
        self._template = {k: v for k, v in chunk.items() if k not in ("choices", "usage")}
        out: list[dict[str, Any]] = []
        changed = False
        for choice in chunk["choices"]:
            if not isinstance(choice, dict) or not isinstance(choice.get("delta", {}), dict):
                return None
            rewritten = self._rewrite_choice(choice, lexed)
            if rewritten is None:
                out.append({**self._template, "choices": [choice]})
            else:
                changed = True
                out += rewritten
        if not changed:
            return None
        return self._with_usage(chunk, out)

    def _with_usage(self, chunk: dict[str, Any], out: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if len(out) == 0:
            return [] if chunk.get("usage") is None else [{**self._template, "choices": [], "usage": chunk["usage"]}]
        if "usage" in chunk:
            for c in out:
                c["usage"] = None
            out[-1]["usage"] = chunk["usage"]
        return out

    def _rewrite_choice(self, choice: dict[str, Any], lexed: list[Segment] | None = None) -> list[dict[str, Any]] | None:
        index = choice.get("index", 0)
        state = self._choice(index)
        delta = choice.get("delta") or {}
        finish = choice.get("finish_reason")
        parts: list[Part] = []
        unchanged = True
        channels = text_channels(delta)
        for channel, text in channels:
            before = len(parts)
            if lexed is None:
                state.feed(channel, text, parts)
            else:
                state.place(channel, lexed, parts)
            produced = parts[before:]
            if not (len(produced) == 1 and produced[0] == ("text", channel, text)) and not (not produced and not text):
                unchanged = False
        native = delta.get("tool_calls")
        natives: list[dict[str, Any]] = []
        if isinstance(native, list):
            natives = state.native.feed(native)
            if state.native.changed:
                unchanged = False  # renumbered past the calls we emitted, or repaired
        held: list[dict[str, Any]] = []
        parse_error = None
        if finish is not None:
            before = len(parts)
            state.finish(parts)
            held = state.native.finish()
            if len(parts) > before or held:
                unchanged = False
            if finish == "stop" and (state.emitted_calls or state.native.emitted):
                finish = "tool_calls"
                self.stats.finish_reasons_changed += 1
                unchanged = False
            parse_error = self._parse_error() if self._context.parse_error_chunk else None
            if parse_error is not None:
                finish = "error"
                unchanged = False
        elif native is None and len(channels) == 1:
            self._lexed = (state, choice, channels[0], parts)  # a lane may follow (`_arm`)
        if unchanged:
            return None
        return self._render(index, choice, delta, parts, natives, held, finish, parse_error)

    def _render(
        self, index: Any, choice: dict[str, Any], delta: dict[str, Any], parts: list[Part], natives: list[dict[str, Any]],
        held: list[dict[str, Any]], finish: Any, parse_error: dict[str, Any] | None,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """The chunks a choice's parts go out in."""
        if finish is None and not natives and len(parts) == 1 and parts[0][0] != "text" and choice.get("logprobs") is None:
            # The bulk of a tool-call stream: one piece of arguments in, one out (or a call's
            # start). What the general packing below makes of it, when the choice and its delta
            # hold nothing else.
            if choice.keys() <= _PLAIN_CHOICE_KEYS and delta.keys() <= _TEXT_KEY_SET:
                part = parts[0]
                entry = {"index": part[1], "function": {"arguments": part[2]}} if part[0] == "args" else _call_start(part)
                return [{**self._template, "choices": [{"index": index, "delta": {"tool_calls": [entry]}, "logprobs": None, "finish_reason": None}]}]

        head = {k: v for k, v in delta.items() if k not in TEXT_KEYS and k != "tool_calls"}
        deltas = parts_to_deltas(parts)
        if natives:
            deltas.append({"tool_calls": natives})
        if held:
            deltas.append({"tool_calls": held})
        if head:
            if deltas and "tool_calls" not in deltas[0]:
                deltas[0] = {**head, **deltas[0]}
            else:
                deltas.insert(0, head)
        extras = {k: v for k, v in choice.items() if k not in ("index", "delta", "finish_reason", "logprobs")}
        out = [
            {**self._template, "choices": [{"index": index, "delta": d, "logprobs": None, "finish_reason": None}]}
            for d in deltas
        ]
        if out and choice.get("logprobs") is not None:
            out[0]["choices"][0]["logprobs"] = choice["logprobs"]
        if finish is not None:
            # finish_reason travels alone, after the last arguments (vLLM #44098)
            out.append({**self._template, "choices": [{"index": index, "delta": {}, "logprobs": None, "finish_reason": finish}]})
            if finish == "error":
                out[-1]["error"] = parse_error
        if out and extras:
            out[-1]["choices"][0].update(extras)
        return out

    _telltales = {"call": b'"tool_calls"'}

    @staticmethod
    def _assembled(raw: bytes) -> list[Contribution]:
        """What a client (the OpenAI SDK's accumulator) assembles from one event: per choice,
        its text fields, each tool call's arguments and fields, the rest of the delta and the
        choice; the chunk's other fields (see `EchoCheck`)."""
        event = parse_block(raw)
        if event.data is None:
            return []  # a comment, a lone `id:`: nothing a client assembles
        if event.malformed:
            return [(("raw",), raw.decode("latin-1"), True)]
        try:
            chunk = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            return [(("data",), event.data, True)]
        if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
            return [(("data",), event.data, True)]
        out: list[Contribution] = [(("chunk", key), value, False) for key, value in chunk.items() if key != "choices"]
        for choice in chunk["choices"]:
            if not isinstance(choice, dict):
                out.append((("data",), orjson.dumps(choice).decode(), True))
                continue
            index = choice.get("index")
            for key, value in choice.items():
                if key == "delta" and isinstance(value, dict):
                    for name, part in value.items():
                        if name in _TEXT_KEY_SET and isinstance(part, str):
                            out.append((("text", index, name), part, True))
                        elif name == "tool_calls" and isinstance(part, list):
                            out += _assembled_calls(index, part)
                        else:
                            out.append((("delta", index, name), part, False))
                elif key == "logprobs" and isinstance(value, dict) and isinstance(value.get("content"), list):
                    out.append((("logprobs", index), "".join(orjson.dumps(item).decode() + "\x1e" for item in value["content"]), True))
                elif key != "index":
                    out.append((("choice", index, key), value, False))
        return out

    # -- lanes -----------------------------------------------------------------------------------

    def _passed_whole(self, raw: bytes) -> None:
        self._quiet_run += 1
        if self._quiet_run in (2, 16):  # a run of quiet events: worth a frame
            self._learn_quiet(raw)

    def _passed_among(self, event: bytes) -> None:
        if self._quiet_kept is None:
            self._learn_quiet(event, take=False)

    def _learn_quiet(self, raw: bytes, take: bool = True) -> None:
        """A plain text event passed as it came: its frame lets the next ones pass from their
        bytes (`_quiet_read`), in `feed` as well when nothing is held for the echo check. Not
        `take`: only kept, for when the rewriter is idle again (`_settle`)."""
        if not is_one_data_line(raw):
            return
        for keys in (("content",), ("reasoning", "reasoning_content"), ("reasoning_content",), ("reasoning",)):
            spans = string_spans(raw, keys)
            if spans is not None:
                break
        else:
            return
        if keys[0] == CONTENT and not self._content_started:
            return  # whether the content started is decided by the event's text
        frame = Frame.around(raw, spans)
        if frame is None or _CONTENT_TEXT.search(frame.head) or _CONTENT_TEXT.search(frame.tail):
            return
        frame.channel = keys if frame.mid is None else None  # (mirrored: the channel's key order is the delta's)
        lane = quiet_lane(frame, self._echo, None if self._reasoning_field_known else b"reasoning")
        if self.laned is not None:  # (the text it passes is noted for remembering: `NotedEvents`)
            lane = noting_lane(lane, frame, _quiet_text(raw, keys))
        if take:
            self._quiet_frame = frame
            if self.laned is not None:
                self.laned.armed(*lane.noted_as)
            self._direct = lane
        # (What passed quietly once passes so whenever the rewriter is idle: the conditions of
        # `_nothing_to_read` only grow weaker, a finish_reason after a call aside.)
        self._quiet_kept = None if _FINISH.search(frame.head) or _FINISH.search(frame.tail) else (frame, lane)

    def _quiet_read(self, raw: bytes) -> bytes | None:
        """`raw` when it is an event of the quiet frame whose text may pass unread (what
        `_nothing_to_read` says of it: the frame passed it, and the text holds nothing it looks
        for), else None."""
        body = self._quiet_frame.split(raw)
        # (`"reasoning` in the bytes: the full path takes it for the field's name)
        if body is None or not plain_body(body, None if self._reasoning_field_known else b"reasoning"):
            return None
        return raw

    def _quiet_markup(self, raw: bytes) -> list[bytes] | None:
        """An event of the quiet frame whose text a lexer must read (a `<` that may begin a
        marker), read as the full path reads it: the channel's innermost live lexer is fed its
        text (`live_path`), and what comes out (nothing: the text is held; the text itself)
        is rendered from the frame, as a lane renders it (`_render_frame`, rendered by then
        for an event of this frame read in full). Anything else goes on through the full
        path. None, before any lexer was fed: the full path reads the event."""
        frame = self._quiet_frame
        channel = frame.channel
        rendered = self._renders.get((frame.head, frame.mid, frame.tail, None)) if channel is not None else None
        if not rendered or len(self._choices) != 1:
            return None
        state = next(iter(self._choices.values()))
        lexer = state.lexer(channel)
        body = frame.split(raw)
        if lexer is None or not body:
            return None
        start = len(frame.head)  # (a quiet frame is not mirrored: `frame.channel`)
        try:
            text = orjson.loads(raw[start - 1 : start + len(body) + 1])
        except orjson.JSONDecodeError:
            return None
        if not self._reasoning_field_known and "reasoning" in text and raw.find(b'"reasoning', start - 1, start + len(body)) >= 0:
            self._reasoning_field_known = True  # (as `_args_read`)
        leaf, path = live_path(lexer)
        return self._read_lexed(raw, text, unwind(path, leaf.feed(text)), state, channel, rendered)

    def _read_lexed(
        self, raw: bytes, text: str, lexed: list[Segment], state: ChoiceRewriter, channel: tuple[str, ...], rendered: Rendered,
        armed: Frame | None = None,
    ) -> list[bytes]:  # fmt: skip
        """What the full path (`_read_in_full`) makes of an event of a rendered frame whose text
        (`text`, of `channel`) the lexers made `lexed` of: the event as it came when its text
        comes out as it was, else its parts rendered by the full path's own rules; then the
        lanes are worked out again. (The frame's event holds one choice of one channel, no
        finish_reason, no calls of upstream's, no event name: `_render_frame` checked it.)
        `armed`: the frame of the argument lane that read the event (`_arm` learned it)."""
        self._args = self._quiet_frame = self._direct = None
        self._quiet_run = 0
        self._template = rendered.template
        parts: list[Part] = []
        state.place(channel, lexed, parts)
        if len(parts) == 1 and parts[0] == ("text", channel, text):
            out = [raw]
        elif not parts:
            out = [*rendered.held]  # (what the frame's event of no parts renders to: rendered once)
        elif (
            len(parts) == 1 and parts[0][0] == "text" and parts[0][1] == channel
            and (around := rendered.text if rendered.text is not None else self._text_frame(rendered, channel))
        ):  # fmt: skip
            out = [around[0] + orjson.dumps(parts[0][2])[1:-1] + around[1]]  # (rendered once, as the full path renders a text)
        else:
            choice = rendered.choice
            chunks = self._with_usage(rendered.usage, self._render(choice.get("index", 0), choice, choice["delta"], parts, [], [], None, None))
            out = [encode_event(orjson.dumps(c)) for c in chunks]
        self._settle()
        if self.lanes:
            self._lexed = (state, None, (channel, text), parts)
            self._arm(raw, armed)
        return out

    def _arm(self, raw: bytes, armed: Frame | None = None) -> None:
        """After an event read in full that left its one channel's lexer holding something (a
        call's header or arguments, a block): the lane of the next events of that channel,
        when this event's shape allows one (see `ArgsLane`). `armed`: the frame of the lane that
        read `raw`, one this method learned from a one-line event: `raw` is one line of it, and
        is not framed again."""
        state, choice, (channel, text), parts = self._lexed
        self._lexed = None
        if len(self._choices) != 1 or not text or (armed is None and not is_one_data_line(raw)):
            return
        lexer = state.lexer(channel)
        if lexer is None or lexer.idle:
            return
        frame = self._armed_frame
        if frame is None or (frame is not armed and (frame.channel != channel or frame.split(raw) is None)):
            # (A stream's events share a frame: the one learned last is taken again while this
            # event is one of it. Its bytes alone make a frame, whatever event it came from.)
            spans = string_spans(raw, channel)
            frame = Frame.around(raw, spans) if spans is not None else None
            if frame is None:
                return
            frame.channel = channel
            self._armed_frame = frame
        # What the frame renders to depends on its bytes and the open call's index alone: a
        # stream's sections and calls re-arm the lane from the same few frames, each call's
        # index put in its place (rendered once around a stand-in index, `_INDEX_PROBE`).
        index = state._open_index
        key = (frame.head, frame.mid, frame.tail, index if index is None else _INDEX_PROBE)
        rendered = self._renders.get(key)
        if rendered is None:
            if choice is None:
                return  # (`_quiet_markup`: rendered the next time an event of the frame is read in full)
            rendered = self._renders[key] = self._render_frame(raw, frame, choice, channel, key[3]) or ()
            if len(self._renders) > 16:
                self._renders.clear()
        if not rendered:
            return
        head = rendered.head if index is None else rendered.head.replace(_INDEX_PROBE_BYTES, str(index).encode())
        # A chain's second stage gets `second.finish()` before each piece of arguments: a no-op
        # only when it was finished last and fed nothing since, as when this event's last part
        # was the call or its arguments. Else such a piece takes the full path once.
        finished = bool(parts) and parts[-1][0] in ("args", "call")
        lane = ArgsLane(frame, live_path(lexer, past_idle_first=True), head, rendered, finished, state, channel)
        self._args = lane
        if (laned := self.laned) is not None and lane.alone:
            # The call the lane's pieces go to, as the client numbers it, and the bytes around each.
            call = ("args", rendered.choice.get("index", 0), index) if type(index) is int else None
            laned.armed(call, head, lane.tail)
        holder = lane.leaf.first if lane.chained else lane.leaf
        runs = lane.steady is None and lane.frame_mid is None and not lane.held and frame.tail[-2:] == b"\n\n" and hasattr(holder, "holds_block")
        self._direct = self._lane_direct(type(self)._held_read if runs else type(self)._args_read)

    def _render_frame(self, raw: bytes, frame: Frame, choice: dict[str, Any], channel: tuple[str, ...], open_index: int | None) -> Rendered | None:
        """The output of an event of `frame` (the event just read, `raw`), rendered by the full
        path's own rules: around a probe argument (a piece of the open call's arguments: `head`,
        `tail`, whole events `before` and `after`), and of no parts (the text held). None when the
        frame does not hold exactly this choice's delta text (checked on a probe)."""
        json_at = 6 if raw.startswith(b"data: ") else 5
        try:
            probe = orjson.loads(frame.probe(b"\\u0001")[json_at:-2])
        except orjson.JSONDecodeError:
            return None
        chunk = orjson.loads(raw[json_at:-2])
        choices = chunk.get("choices")
        if not isinstance(choices, list) or len(choices) != 1 or choices[0] != choice:
            return None
        if probe != {**chunk, "choices": [{**choice, "delta": {**choice["delta"], **{key: "\x01" for key in channel}}}]}:
            return None
        index, delta = choice.get("index", 0), choice["delta"]
        held = self._with_usage(chunk, self._render(index, choice, delta, [], [], [], None, None))
        rendered = self._with_usage(chunk, self._render(index, choice, delta, [("args", open_index, "\x00")], [], [], None, None))
        encoded = [encode_event(orjson.dumps(c)) for c in rendered]
        hits = [i for i, piece in enumerate(encoded) if b"\\u0000" in piece]
        if len(hits) != 1 or encoded[hits[0]].count(b"\\u0000") != 1:
            return None
        at = hits[0]
        head, _, tail = encoded[at].partition(b"\\u0000")
        if open_index == _INDEX_PROBE and (head.count(_INDEX_PROBE_BYTES) != 1 or any(_INDEX_PROBE_BYTES in piece for piece in (tail, *encoded[:at], *encoded[at + 1 :]))):
            return None  # the stand-in index is not alone where the call's index goes
        usage = {"usage": chunk["usage"]} if "usage" in chunk else {}
        held_events = [encode_event(orjson.dumps(c)) for c in held]
        return Rendered(head, tail, encoded[:at], encoded[at + 1 :], held_events, None, self._template, usage, choice)

    def _text_frame(self, rendered: Rendered, channel: tuple[str, ...]) -> tuple[bytes, bytes] | tuple[()]:
        """The event of `rendered`'s frame around a text of `channel`, as the full path renders
        one (what the lexers give back changed: a `<` held and sent with the next piece, the
        whitespace after a block sent before the text after it): its head and tail, or () when
        a text renders otherwise (a mirrored one, twice). Rendered the first time it is wanted
        (`rendered.text`), with the frame's template in place (`_read_lexed`)."""
        choice = rendered.choice
        chunks = self._with_usage(rendered.usage, self._render(choice.get("index", 0), choice, choice["delta"], [("text", channel, "\x00")], [], [], None, None))
        around: tuple[bytes, bytes] | tuple[()] = ()
        if len(chunks) == 1 and (event := encode_event(orjson.dumps(chunks[0]))).count(b"\\u0000") == 1:
            head, _, tail = event.partition(b"\\u0000")
            around = (head, tail)
        rendered.text = around
        return around

    def _args_read(self, raw: bytes) -> list[bytes] | None:
        """An event through the lane, or None (before anything was fed: the full path reads
        it). See `ArgsLane`."""
        lane = self._args
        start = lane.start
        mid = lane.frame_mid
        if mid is None:
            if raw[:start] != lane.frame_head or raw[-lane.end :] != lane.frame_tail:
                return None
            end = len(raw) - lane.end
            if end <= start:
                return None  # no longer than the frame (or overlapping it): no text
        else:  # mirrored fields: the same string twice (`Frame.split`, inline)
            extra = len(raw) - lane.fixed
            if extra <= 0 or extra & 1:
                return None
            end = start + (extra >> 1)
            string = raw[start:end]
            if b"".join((lane.frame_head, string, mid, string, lane.frame_tail)) != raw:
                return None
        body = raw[start - 1 : end + 1]  # the string with its quotes: one JSON string or an error
        if 10 in body:
            return None  # several events (a JSON string holds no line end): not one string, told cheaply
        try:
            text = _loads(body)
        except orjson.JSONDecodeError:  # (an error costs its message: a decoded copy, its line counted)
            return None  # not one string (a quote, bytes that are no UTF-8): the full path
        if not self._reasoning_field_known and "reasoning" in text and raw.find(b'"reasoning', start - 1, end) >= 0:
            # (The frame's own bytes were read in full: only the string can name the field, as
            # the full path reads it: `raw.find(b'"reasoning')`.)
            self._reasoning_field_known = True
        if lane.verbatim and lane.stop not in text and not text[-1].isspace():
            piece = text  # (what the leaf's `steady_piece` makes of it: no call)
        elif (steady := lane.steady) is not None and (piece := steady(lane.leaf, text, lane.finished)) is not None:
            lane.verbatim = lane.stop is not None and piece != "" and not text[-1].isspace()
            if not piece:
                return [*lane.held]  # (the steady state made nothing of it: whitespace held)
        else:
            lane.verbatim = False  # (the leaf is fed: its state is no longer known)
            leaf = lane.leaf
            if lane.chained and leaf.first.idle and not leaf.second.idle:
                leaf = lane.past_idle_first()  # (armed while the first stage held something)
            if lane.guarded and text_may_start_markup(text):
                # A marker may begin: the chain whose idle first stage the leaf is fed past reads
                # it whole. Held, with every such first stage idle again, the lane stays as it is.
                at = next(n for n, node in enumerate(lane.path) if type(node) is SecondOf)
                segments = lane.path[at].chain.feed(text)
                if segments or not all(node.chain.first.idle for node in lane.path[at:] if type(node) is SecondOf):
                    return self._read_lexed(raw, text, unwind(lane.path[:at], segments), lane.state, lane.channel, lane.rendered, lane.frame)
            else:
                segments = leaf.feed(text)
            if not segments:
                if leaf.idle:  # what the full path's end of event works out again: the lanes, the quiet path
                    self._args = self._direct = None
                    self._settle()
                return [*lane.held]
            if not (lane.finished and len(segments) == 1 and type(segments[0]) is CallArgs and not leaf.idle):
                # Anything else: what the lexers around the leaf make of it, rendered as the full path does.
                return self._read_lexed(raw, text, unwind(lane.path, segments), lane.state, lane.channel, lane.rendered, lane.frame)
            piece = segments[0].text
        # A piece of the open call's arguments (the commonest event of a tool-call stream, most
        # often the leaf's steady piece: `Lexer.steady_piece`), around the output frame.
        if piece == text and 92 not in body:
            body = body[1:-1]
        else:  # orjson's escapes may differ from upstream's
            body = orjson.dumps(piece)[1:-1]
        if lane.alone:
            piece = lane.head + body + lane.tail
            if (laned := self.laned) is not None:
                laned.append(piece)
            return [piece]
        return [*lane.before, lane.head + body + lane.tail, *lane.after]

    def _args_burst(self, data: bytes) -> list[bytes] | None:
        """`_args_read` for a read of several events (`SseRewriter._feed_read`'s), taken at once
        when each is a plain piece of the open call's arguments streamed live (`burst_events`):
        the events to send, one for each piece that makes arguments. None: nothing taken (the
        events go through `_args_read` one by one)."""
        lane = self._args
        if lane.steady_bodies is None or (not self._reasoning_field_known and data.find(b"reasoning") >= 0):
            return None  # (`_args_read` notes a text that names the reasoning field; `find`: see addon.py)
        lane.verbatim = False  # (the leaf takes the pieces: its state after them is not told)
        return burst_events(data, lane.frame, lane.leaf.steady_bodies, lane.finished, lane.head, lane.tail, self.laned)

    # (`_feed_read` offers a read of several events to the lane's `burst` first.)
    _args_read.burst = _args_burst  # type: ignore[attr-defined]

    def _args_run(self, events: list[bytes], first: int) -> int:
        """`_args_read` for a run of `_feed_read`'s events from `first` (split at their blank
        lines) that add to a block the leaf holds whole, none sent: their texts fed as one (the
        lexers read text the same however it is cut). How many: 0, none (`_args_read` takes
        the next); -n, none of the next n (looked at, no run). (`SseRewriter._lane_runs`)"""
        lane = self._args
        holder = lane.leaf.first if lane.chained else lane.leaf  # (a chain's first stage holding a block makes nothing for its second)
        holding = getattr(holder, "holds_block", None)
        if holding is None or not holding():
            return 0
        head, start, bare_tail = lane.frame_head, lane.start, lane.frame_tail[:-2]
        tail_size = len(bare_tail)
        bodies = []
        for raw in events[first:]:
            # `_args_read`'s frame check (by slices, not `startswith` and `endswith`: see sse.py);
            # one JSON string each is checked below, and one with a `<` (a tag may begin) ends the run
            end = len(raw) - tail_size
            if raw[:start] != head or raw[end:] != bare_tail:
                break
            body = raw[start:end]
            if not body or 60 in body:
                break
            bodies.append(body)
        if len(bodies) < 2:
            return 0
        texts = each_string(bodies)
        if texts is None:
            return -len(bodies)
        text = "".join(texts)
        if (not self._reasoning_field_known and "reasoning" in text) or (lane.guarded and text_may_start_markup(text)) or not holder.held_bulk(text):
            return -len(bodies)  # (`_args_read` reads them: the field named, a marker that may begin, a `<` escaped, the cap)
        return len(bodies)

    def _held_burst(self, data: bytes) -> list[bytes] | None:
        """`_args_run` for a read of several events at once (`stream.held_burst`); None: the read
        goes through `_args_run` and `_args_read`."""
        lane = self._args
        return held_burst(data, lane.frame, lane.leaf, not self._reasoning_field_known, lane.guarded)  # (what `_args_run` refuses too)

    # `_args_read` under a second name, with a `run` and a `burst`: the lane of a block held
    # whole (`_arm`). `_feed_read` picks its loop by the lane's `run`, so a lane that takes no
    # runs (arguments streamed live, mirrored fields, events sent for held text) is not offered
    # them at all.
    _held_read = FunctionType(_args_read.__code__, _args_read.__globals__, "_held_read", _args_read.__defaults__, _args_read.__closure__)
    _held_read.run = _args_run  # type: ignore[attr-defined]
    _held_read.burst = _held_burst  # type: ignore[attr-defined]

    def _parse_error(self) -> dict[str, Any] | None:
        """Seed 002's error chunk: the first note of markup that did not parse as a call."""
        for note in self.stats.notes:
            if note.startswith(PARSE_FAILURES):
                return {"message": f"Tool call parsing failed: {note}", "type": "tool_call_parse_error"}
        return None

    def _at_end(self) -> list[bytes]:
        return self._flush_all()

    def _flush_all(self) -> list[bytes]:
        """End of stream without a finish_reason: release or close what the lexers hold."""
        if self._template is None or self._all_idle():
            return []
        out: list[bytes] = []
        for index, state in self._choices.items():
            parts: list[Part] = []
            state.finish(parts)
            held = state.native.finish()
            for delta in [*parts_to_deltas(parts), *([{"tool_calls": held}] if held else [])]:
                chunk = {**self._template, "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}]}
                out.append(encode_event(orjson.dumps(chunk)))
        return out


def _quiet_text(raw: bytes, keys: tuple[str, ...]) -> tuple[str, Any, tuple[str, ...]] | None:
    """What the events of a quiet frame learned from `raw` add to, for remembering (`NotedEvents`):
    ("text", choice index, `keys`) when the event's one choice's delta holds nothing else a
    client accumulates; None: the lane's events are read again."""
    try:
        chunk = orjson.loads(raw[raw.index(b":") + 1 :])
    except (orjson.JSONDecodeError, ValueError):
        return None
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict) or not isinstance(choices[0].get("delta"), dict):
        return None
    if any(name not in keys and name != "role" and value not in ("", None) for name, value in choices[0]["delta"].items()):
        return None
    return ("text", choices[0].get("index", 0), keys)


def _assembled_calls(index: Any, entries: list[Any]) -> list[Contribution]:
    out: list[Contribution] = []
    for entry in entries:
        if not isinstance(entry, dict):
            out.append((("data",), orjson.dumps(entry).decode(), True))
            continue
        call = entry.get("index")
        for key, value in entry.items():
            if key == "function" and isinstance(value, dict):
                for name, part in value.items():
                    grows = name == "arguments" and isinstance(part, str)
                    out.append((("call", index, call, "function", name), part, grows))
            elif key != "index":
                out.append((("call", index, call, key), value, False))
    return out


def rewrite_chat_completion(
    body: dict[str, Any], context: RequestContext, *, max_held: int = 1 << 20, stats: RewriteStats | None = None
) -> RewriteStats | None:
    """Rewrite a non-streaming `chat.completion` body in place; None when nothing changed.
    `stats`, when given, records what was found even if nothing changed (a strict failure)."""
    choices = body.get("choices")
    if not isinstance(choices, list):
        return None
    stats = stats if stats is not None else RewriteStats()
    changed = False
    for choice in choices:
        if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
            continue
        message = choice["message"]
        state = ChoiceRewriter(context, stats, max_held=max_held)
        changed = _type_native_calls(message, context, stats) or changed
        if isinstance(message.get("tool_calls"), list):
            # Upstream's own calls are listed first; with parallel_tool_calls false none of ours
            # may follow, as when streamed (fuzzing found a second call made here).
            state.note_upstream_calls(len(message["tool_calls"]))
        parts: list[Part] = []
        channels = text_channels(message)
        for channel, text in channels:
            state.feed(channel, text, parts)
        state.finish(parts)
        texts: dict[str, str] = {}
        calls: dict[int, dict[str, Any]] = {}
        for part in parts:
            if part[0] == "text":
                for key in part[1]:
                    texts[key] = texts.get(key, "") + part[2]
            elif part[0] == "call":
                calls[part[1]] = {"id": part[2], "type": "function", "function": {"name": part[3], "arguments": ""}}
            else:
                calls[part[1]]["function"]["arguments"] += part[2]
        if not calls and texts == {key: text for channel, text in channels for key in channel if text}:
            if context.extensions and parts:
                _add_extensions(body, parts)
                changed = True
            continue  # no markup in this message
        changed = True
        for channel, _ in channels:
            for key in channel:
                message[key] = texts.pop(key, "").strip() or None
        if CONTENT in texts:  # reasoning that went on after a leaked </think>
            message[CONTENT] = ((message.get(CONTENT) or "") + texts.pop(CONTENT)).strip() or None
        for key, text in texts.items():  # reasoning that was in content (`<think>`)
            message[key] = ((message.get(key) or "") + text).strip() or None
        if context.extensions:
            _add_extensions(body, parts)
        if calls:
            native = message.get("tool_calls") if isinstance(message.get("tool_calls"), list) else []
            message["tool_calls"] = native + [calls[i] for i in sorted(calls)]
            if CONTENT not in message:
                message[CONTENT] = None
            if choice.get("finish_reason") == "stop":
                choice["finish_reason"] = "tool_calls"
                stats.finish_reasons_changed += 1
    return stats if changed else None


def _type_native_calls(message: dict[str, Any], context: RequestContext, stats: RewriteStats) -> bool:
    """Upstream's own calls in a whole message, typed as when streamed (`ArgumentTyping`): a
    stringified value the schema types otherwise, `null` or empty arguments (`{}`), arguments
    sent as a JSON value rather than its text. Did anything change?"""
    changed = False
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        arguments = function.get("arguments")
        if isinstance(arguments, (dict, list)):
            stats.stream_repairs[OBJECT_ARGUMENTS] += 1
            arguments = function["arguments"] = orjson.dumps(arguments).decode()
            changed = True
        if arguments is not None and not isinstance(arguments, str):
            continue  # no telling what a client makes of it: as it came
        typed = ArgumentTyping.for_tool(context.tools.get(function.get("name") or ""), stats.stream_repairs).whole(arguments or "")
        if typed is None:
            stats.stream_repairs[EMPTY_ARGUMENTS] += 1
            typed = "{}"
        if typed != arguments:
            function["arguments"] = typed
            changed = True
    return changed


def _add_extensions(body: dict[str, Any], parts: list[Part]) -> None:
    """Seed 002's `extensions` of a non-streaming body (option toolshim_extensions): the
    reasoning pieces and the call events the rewrite found, in order."""
    reasoning = [part[2] for part in parts if part[0] == "text" and part[1][0] != CONTENT and part[2].strip()]
    ids: dict[int, str] = {}
    tool_call_chunks: list[dict[str, Any]] = []
    for part in parts:
        if part[0] == "call":
            if ids:
                tool_call_chunks.append({"type": "end", "tool_call_id": ids[max(ids)]})
            ids[part[1]] = part[2]
            tool_call_chunks.append({"type": "start", "tool_call_id": part[2], "tool_name": part[3]})
        elif part[0] == "args":
            tool_call_chunks.append({"type": "args", "tool_call_id": ids[part[1]], "delta": part[2]})
    if ids:
        tool_call_chunks.append({"type": "end", "tool_call_id": ids[max(ids)]})
    extensions = body.setdefault("extensions", {})
    extensions.setdefault("reasoning_chunks", []).extend(reasoning)
    extensions.setdefault("tool_call_chunks", []).extend(tool_call_chunks)
