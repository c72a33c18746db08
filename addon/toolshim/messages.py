"""Anthropic Messages API (`POST …/v1/messages`): markup in text and thinking blocks becomes
`tool_use` blocks; upstream's own broken `tool_use` streams are made well-formed.

The event stream (research: requests_and_apis.md §2, wire.md §4.1):

    message_start → (content_block_start → content_block_delta* → content_block_stop)* →
    message_delta {stop_reason, usage} → message_stop          (`ping` anywhere)

Each upstream text or thinking block runs one lexer (a text block's may hold `<think>`, which
becomes a thinking block). What the lexer gives is placed in blocks of our own numbering: text
goes to the block of its kind, opened at its first character (a block that would stay empty is
never sent); a call closes the block before it and is a block of its own:

    content_block_start {type: tool_use, id, name, input: {}}
    content_block_delta {type: input_json_delta, partial_json}     each piece non-empty
    content_block_stop

The model's own id where it has one (Kimi headers), else `toolu_` + 24 alphanumerics. Blocks
are renumbered over everything sent; `stop_reason` becomes `tool_use` when a call was made.
A thinking block we close that never got a signature gets an empty `signature_delta` (Claude
Code drops unsigned thinking); a signature is never invented otherwise. Events that need no
change leave as their exact bytes (an upstream block start waits for the block's first text,
then goes as it came).

Upstream's own `tool_use` blocks are repaired as they stream: several blocks for one call (one
id) are merged, an `input` given at the start is moved into one delta (or dropped when deltas
follow), empty pieces are dropped, a block left open is closed, and pieces that would make the
arguments invalid JSON are held and repaired at the block's end (`JsonPrefix`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import orjson
from json_repair import repair_json

from .bodies import burst_events, plain_bodies
from .calls import CallScope, RewriteStats, random_id
from .lexers import ScopeLexers
from .native import EMPTY_ARGUMENTS, ArgumentTyping
from .lexers.base import CallArgs, CallBegin, CallEnd, ChainLexer, Lexer, ReasoningEnd, ReasoningText, Segment, Text, TextPieces
from .sse import encode_event, parse_block, read_event
from .stream import _CARRIED_FIELD, Contribution, Frame, SseRewriter, held_burst, live_path, markup_may_start, noting_lane, plain_body, quiet_lane, string_spans, text_may_start_markup, unwind
from .tools import RequestContext

TEXT, THINKING, TOOL_USE = "text", "thinking", "tool_use"
DELTA_OF = {TEXT: ("text_delta", "text"), THINKING: ("thinking_delta", "thinking")}
# Repairs of upstream's own tool_use stream (counted as BrokenStreamShape, like native.py's).
SPLIT_BLOCKS, INPUT_AT_START, EMPTY_PIECE, INVALID_PIECES, UNCLOSED_BLOCK, STOP_REASON = (
    "split_tool_use_blocks",
    "input_at_start",
    "empty_partial_json",
    "invalid_partial_json",
    "unclosed_block",
    "stop_reason",
)


@dataclass(slots=True)
class Outgoing:
    """An event to send: `raw` (exact upstream bytes) when it goes as it came."""

    event: dict[str, Any]
    raw: bytes | None = None


@dataclass(slots=True)
class OutBlock:
    """A block we send."""

    index: int
    kind: str
    signed: bool = False  # a thinking block that got a signature_delta


@dataclass(slots=True)
class SourceBlock:
    """An upstream text or thinking block: its lexer and the block its text is going to."""

    index: int  # upstream's
    kind: str
    start: Outgoing
    # None: not made yet (`MessagesRewriter.defer_lexers`): every delta so far went as it came.
    lexer: Lexer | None
    current: OutBlock | None = None  # the block our output is going to (None: none open)
    used_start: bool = False  # upstream's own start was sent for one of our blocks
    as_content: bool = False  # a leaked `</think>` ended the thinking: the rest is text
    open_call: OutBlock | None = None
    pending_signature: Outgoing | None = None
    produced: bool = False  # its lexer gave text or a call (else at its end it goes as it came)
    text_passed: bool = False  # text that decides the start went as it came, with no lexer made

    @property
    def quiet(self) -> bool:
        """Its lexer holds nothing (none made: only text that went as it came)."""
        return self.lexer is None or self.lexer.idle


@dataclass(slots=True)
class NativeCall:
    """An upstream tool_use block, as we pass it on."""

    out: OutBlock
    call_id: Any
    start_input: Any = None  # `input` upstream gave at the start (sent as a delta only if no delta follows)
    json: JsonPrefix = field(default_factory=lambda: JsonPrefix())
    held: list[str] = field(default_factory=list)  # pieces that would break the JSON, held
    deltas: int = 0
    stop: Outgoing | None = None  # upstream's stop, held one event: a split call's next block may follow
    typing: ArgumentTyping | None = None  # values typed by the tool's schema (native.py)


class MessagesRewriter:
    """The event-level rewrite of one message (sans-IO: dicts in, dicts or raw bytes out)."""

    def __init__(
        self, context: RequestContext, stats: RewriteStats, *, max_held: int = 1 << 20, sign_thinking: bool = True, keep_text: bool = False
    ) -> None:
        self.stats = stats
        # Whole bodies keep every block's text (they are rebuilt from it); a stream keeps only
        # upstream's own call arguments (checked and completed at their block's end): its state
        # stays bounded however long the answer.
        self._keep_text = keep_text
        context.call_id_prefix = "toolu_"
        self._dialects = ScopeLexers(CallScope(context, stats), max_held=max_held)
        self._sign_thinking = sign_thinking
        self._next_index = 0
        self._sources: dict[Any, SourceBlock] = {}
        self._passed: dict[Any, OutBlock] = {}  # upstream blocks passed on (other types), by upstream index
        self._native: dict[Any, NativeCall] = {}  # open upstream tool_use blocks, by upstream index
        self._last_native: NativeCall | None = None  # the latest, while its stop is held
        self.calls_made = 0  # ours and upstream's
        self.blocks: list[dict[str, Any]] = []  # what the client accumulates (for the state and tests)
        # The text, thinking or arguments of each block we send, by index (a dict's string grown
        # with += is copied whole on every delta: quadratic over a long block).
        self._grown: dict[int, TextPieces] = {}
        # What the lexer of the next text delta made of its text already (a lane fed it), and
        # what the last text delta's lexer gave (a lane may follow it).
        self.lexed: list[Segment] | None = None
        self.last_segments: list[Segment] | None = None
        # A stream's lanes on: a block's lexer is made when a delta needs one, not at its start.
        # Most blocks never hold markup, and an unknown model's chain is a dozen lexers or more.
        self.defer_lexers = False

    # -- events ----------------------------------------------------------------------------------

    def on_event(self, event: dict[str, Any], raw: bytes | None = None) -> list[Outgoing]:
        kind = event.get("type")
        incoming = Outgoing(event, raw)
        out: list[Outgoing] = []
        if kind != "content_block_start" or not self._continues_split_call(event):
            self._release_held_stop(out)
        index = event.get("index")
        if kind == "content_block_start" and isinstance(event.get("content_block"), dict):
            self._on_start(incoming, out)
        elif kind == "content_block_delta" and isinstance(event.get("delta"), dict):
            if index in self._sources:
                self._on_text_delta(self._sources[index], incoming, out)
            elif index in self._native:
                self._on_native_delta(self._native[index], incoming, out)
            else:
                out.append(self._renumbered(incoming))
        elif kind == "content_block_stop":
            if index in self._sources:
                self._on_text_stop(self._sources.pop(index), incoming, out)
            elif index in self._native:
                call = self._native.pop(index)
                call.stop = incoming
                self._last_native = call  # sent with the next event, unless the call continues
            else:
                out.append(self._renumbered(incoming))
                self._passed.pop(index, None)
        elif kind == "message_delta":
            self._close_everything(out)
            out.append(self._with_stop_reason(incoming))
        elif kind == "message_stop":
            self._close_everything(out)
            out.append(incoming)
        else:  # message_start, ping, error, what a later API version adds
            out.append(incoming)
        return out

    def finish(self) -> list[Outgoing]:
        """The body ended without `message_stop` (cut off): close what is open; the client
        learns it was cut from the missing `message_delta`, as from upstream."""
        out: list[Outgoing] = []
        self._release_held_stop(out)
        self._close_everything(out)
        return out

    # -- blocks ----------------------------------------------------------------------------------

    def _on_start(self, incoming: Outgoing, out: list[Outgoing]) -> None:
        event = incoming.event
        block, index = event["content_block"], event.get("index")
        kind = block.get("type")
        if kind in (TEXT, THINKING):
            source = SourceBlock(index, kind, incoming, None)
            self._sources[index] = source
            seed = block.get(kind)
            if isinstance(seed, str) and seed:  # text given at the start: read like a first delta
                self._place(source, self._lexer_of(source).feed(seed), out, None)
            elif not self.defer_lexers or self._dialects.bare_json:  # (bare JSON: the start is read)
                self._lexer_of(source)
            return
        if kind == TOOL_USE:
            self._start_native(incoming, out)
            return
        ours = self._new_block(kind)
        self.blocks[-1] = dict(block)  # a block we do not read (server tools, redacted thinking)
        self._passed[index] = ours
        out.append(self._renumbered(incoming, ours.index))

    def _on_text_delta(self, source: SourceBlock, incoming: Outgoing, out: list[Outgoing]) -> None:
        delta = incoming.event["delta"]
        if delta.get("type") == "signature_delta":
            self._on_signature(source, incoming, out)
            return
        name = DELTA_OF[source.kind][1]
        text = delta.get(name)
        if delta.get("type") != DELTA_OF[source.kind][0] or not isinstance(text, str):
            target = source.current or self._open(source, source.kind, out)
            out.append(self._renumbered(incoming, target.index))
            return
        segments, self.lexed = self.lexed, None
        if segments is None and source.lexer is None and not text_may_start_markup(text) and not text.isspace():
            # No marker can begin in it, and it decides that no `<think>` opens the text (not
            # whitespace alone): what a new lexer gives, and the lexer is left as it began.
            source.text_passed = True
            self._place(source, [Text(text)], out, incoming)
            return
        if segments is None:
            segments = self._lexer_of(source).feed(text)
        self.last_segments = segments
        self._place(source, segments, out, incoming)

    def _lexer_of(self, source: SourceBlock) -> Lexer:
        """The block's lexer, made now if it was not (upstream splits reasoning itself when it
        sends thinking blocks: no pre-opened `<think>`)."""
        if source.lexer is None:
            source.lexer = self._dialects.new_lexer(reasoning=source.kind == THINKING, preopened=False, started=source.text_passed)
        return source.lexer

    def _on_signature(self, source: SourceBlock, incoming: Outgoing, out: list[Outgoing]) -> None:
        """A signature signs the thinking as upstream wrote it: it goes to the thinking block
        still open (the common case: no call cut it), never to another block."""
        current = source.current
        if current is not None and current.kind == THINKING:
            current.signed = True
            self._add_signature(current.index, incoming.event["delta"].get("signature"))
            out.append(self._renumbered(incoming, current.index))
        elif current is None and source.kind == THINKING and not source.used_start:
            source.pending_signature = incoming  # no text yet: the block opens with it
        elif len(self.stats.notes) < 20:  # it signed text that is no longer one block: let go
            self.stats.notes.append(f"signature of thinking block {source.index} dropped: a call cut the thinking")

    def _on_text_stop(self, source: SourceBlock, incoming: Outgoing, out: list[Outgoing]) -> None:
        if source.lexer is not None:
            self._place(source, source.lexer.finish(), out, None)
        if source.open_call is not None:  # a call cut off with its block
            out.append(Outgoing({"type": "content_block_stop", "index": source.open_call.index}))
            source.open_call = None
        if not source.produced and not source.used_start:
            self._open(source, source.kind, out)  # a block with no text at all: as upstream sent it
        current = source.current
        if current is not None:
            self._sign_if_unsigned(current, out)
            same = current.index == source.index and source.used_start and current.kind == source.kind
            out.append(incoming if same and incoming.raw is not None else Outgoing({"type": "content_block_stop", "index": current.index}))
            source.current = None

    def _place(self, source: SourceBlock, segments: list[Segment], out: list[Outgoing], incoming: Outgoing | None) -> None:
        """Segments of one block's text, from the delta `incoming` (None: not from one delta)."""
        whole = incoming is not None and len(segments) == 1
        for seg in segments:
            kind = type(seg)
            if kind is Text or kind is ReasoningText:
                if not seg.text:
                    continue
                target_kind = THINKING if kind is ReasoningText or (source.kind == THINKING and not source.as_content) else TEXT
                if kind is ReasoningText:
                    self.stats.reasoning_moved += len(seg.text)
                self._text(source, target_kind, seg.text, out, incoming if whole else None)
            elif kind is CallBegin:
                source.produced = True
                self._close_current(source, out)
                call = self._new_block(TOOL_USE)
                source.open_call = call
                self.calls_made += 1
                out.append(Outgoing({
                    "type": "content_block_start",
                    "index": call.index,
                    "content_block": {"type": TOOL_USE, "id": seg.id, "name": seg.name, "input": {}},
                }))
                self.blocks[-1].update({"id": seg.id, "name": seg.name})
            elif kind is CallArgs:
                if seg.text and source.open_call is not None:
                    if self._keep_text:
                        self.grow(source.open_call.index, seg.text)
                    out.append(Outgoing(self.args_event(source.open_call.index, seg.text)))
            elif kind is CallEnd:
                if source.open_call is not None:
                    out.append(Outgoing({"type": "content_block_stop", "index": source.open_call.index}))
                    source.open_call = None
            elif kind is ReasoningEnd:
                source.as_content = True

    def _text(self, source: SourceBlock, kind: str, text: str, out: list[Outgoing], incoming: Outgoing | None) -> None:
        source.produced = True
        current = source.current
        if current is None or current.kind != kind:
            self._close_current(source, out)
            current = self._open(source, kind, out)
        if self._keep_text:
            self.grow(current.index, text)
        if incoming is not None and incoming.event.get("index") == current.index and kind == source.kind:
            if incoming.event["delta"].get(DELTA_OF[kind][1]) == text:
                out.append(incoming)  # as it came
                return
        out.append(Outgoing(self.text_event(current.index, kind, text)))

    @staticmethod
    def text_event(index: int, kind: str, text: str) -> dict[str, Any]:
        delta_type, name = DELTA_OF[kind]
        return {"type": "content_block_delta", "index": index, "delta": {"type": delta_type, name: text}}

    @staticmethod
    def args_event(index: int, text: str) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": text}}

    def _open(self, source: SourceBlock, kind: str, out: list[Outgoing]) -> OutBlock:
        block = self._new_block(kind)
        source.current = block
        if kind == source.kind and not source.used_start:
            source.used_start = True
            start = source.start
            seeded = start.event["content_block"].get(kind)
            self.blocks[block.index].update({k: v for k, v in start.event["content_block"].items() if k != kind})
            if block.index == source.index and not seeded:
                out.append(start)  # as it came
            else:
                out.append(Outgoing({**start.event, "index": block.index, "content_block": {**start.event["content_block"], kind: ""}}))
            if source.pending_signature is not None:
                block.signed = True
                self._add_signature(block.index, source.pending_signature.event["delta"].get("signature"))
                out.append(self._renumbered(source.pending_signature, block.index))
                source.pending_signature = None
        else:
            content = {"type": TEXT, "text": ""} if kind == TEXT else {"type": THINKING, "thinking": "", "signature": ""}
            out.append(Outgoing({"type": "content_block_start", "index": block.index, "content_block": content}))
        return block

    def _close_current(self, source: SourceBlock, out: list[Outgoing]) -> None:
        current = source.current
        if current is not None:
            self._sign_if_unsigned(current, out)
            out.append(Outgoing({"type": "content_block_stop", "index": current.index}))
            source.current = None

    def _add_signature(self, index: int, signature: Any) -> None:
        if isinstance(signature, str):  # a later one replaces it, as the SDKs keep it
            self.blocks[index]["signature"] = signature

    def _sign_if_unsigned(self, block: OutBlock, out: list[Outgoing]) -> None:
        if block.kind == THINKING and not block.signed and self._sign_thinking:
            block.signed = True
            self._add_signature(block.index, "")
            out.append(Outgoing({"type": "content_block_delta", "index": block.index, "delta": {"type": "signature_delta", "signature": ""}}))

    def _new_block(self, kind: str) -> OutBlock:
        block = OutBlock(self._next_index, kind)
        self._next_index += 1
        self.blocks.append({"type": kind})
        return block

    def _renumbered(self, incoming: Outgoing, index: int | None = None) -> Outgoing:
        """An event of a block passed on: as it came when its index is already ours."""
        if index is None:
            ours = self._passed.get(incoming.event.get("index"))
            if ours is None:
                return incoming
            index = ours.index
        if incoming.event.get("index") == index:
            return incoming
        return Outgoing({**incoming.event, "index": index})

    # -- upstream's own tool_use ------------------------------------------------------------------

    def _continues_split_call(self, event: dict[str, Any]) -> bool:
        """A tool_use start with the id of the call whose stop is held: one call in two blocks."""
        held = self._last_native
        block = event.get("content_block")
        return (
            held is not None
            and isinstance(block, dict)
            and block.get("type") == TOOL_USE
            and block.get("id") is not None
            and block.get("id") == held.call_id
        )

    def _start_native(self, incoming: Outgoing, out: list[Outgoing]) -> None:
        event = incoming.event
        block = event["content_block"]
        held = self._last_native
        if held is not None and self._continues_split_call(event):
            self._last_native = None
            held.stop = None
            self._native[event.get("index")] = held
            self.stats.stream_repairs[SPLIT_BLOCKS] += 1
            self._take_start_input(held, block)
            return
        ours = self._new_block(TOOL_USE)
        self.blocks[-1].update({"id": block.get("id"), "name": block.get("name")})
        call = NativeCall(ours, block.get("id"))
        call.typing = ArgumentTyping.for_tool(self._dialects.scope.tools.get(block.get("name")), self.stats.stream_repairs)
        self._native[event.get("index")] = call
        self.calls_made += 1
        self._dialects.scope.note_upstream_call()
        self._take_start_input(call, block)
        if block.get("input") == {} or "input" not in block:
            out.append(self._renumbered(incoming, ours.index))
        else:
            out.append(Outgoing({**event, "index": ours.index, "content_block": {**block, "input": {}}}))

    def _take_start_input(self, call: NativeCall, block: dict[str, Any]) -> None:
        given = block.get("input")
        if given not in (None, {}):
            self.stats.stream_repairs[INPUT_AT_START] += 1
            call.start_input = given

    def _on_native_delta(self, call: NativeCall, incoming: Outgoing, out: list[Outgoing]) -> None:
        delta = incoming.event["delta"]
        piece = delta.get("partial_json")
        if delta.get("type") != "input_json_delta" or not isinstance(piece, str):
            out.append(self._renumbered(incoming, call.out.index))
            return
        if not piece:
            self.stats.stream_repairs[EMPTY_PIECE] += 1
            return
        if call.start_input is not None:  # deltas follow: the start's input was a preview
            call.start_input = None
        typed = call.typing.feed(piece) if call.typing is not None else piece
        if typed:
            self._send_native_piece(call, typed, out, incoming if typed == piece else None)

    def _send_native_piece(self, call: NativeCall, piece: str, out: list[Outgoing], incoming: Outgoing | None) -> None:
        if call.held or not call.json.feed(piece):
            call.held.append(piece)  # the arguments broke: the rest is repaired at the end
            return
        call.deltas += 1
        self.grow(call.out.index, piece)
        if incoming is not None:
            out.append(self._renumbered(incoming, call.out.index))
        else:
            out.append(Outgoing({"type": "content_block_delta", "index": call.out.index, "delta": {"type": "input_json_delta", "partial_json": piece}}))

    def _release_held_stop(self, out: list[Outgoing]) -> None:
        call, self._last_native = self._last_native, None
        if call is not None and call.stop is not None:
            self._end_native(call, out, call.stop)

    def _end_native(self, call: NativeCall, out: list[Outgoing], stop: Outgoing | None) -> None:
        index = call.out.index
        typing, call.typing = call.typing, None
        if typing is not None:
            if typing.null:  # `null` arguments: the client's input stays {}
                self.stats.stream_repairs[EMPTY_ARGUMENTS] += 1
            elif rest := typing.finish():
                self._send_native_piece(call, rest, out, None)
        sent = self.grown(index)
        tail = ""
        if call.start_input is not None and not sent:
            tail = orjson.dumps(call.start_input).decode()
        elif call.held or not call.json.complete:
            tail = _completion(sent, "".join(call.held))
            if call.held:
                self.stats.stream_repairs[INVALID_PIECES] += 1
        if tail:
            self.grow(index, tail)
            out.append(Outgoing({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": tail}}))
        if stop is None:
            self.stats.stream_repairs[UNCLOSED_BLOCK] += 1
            out.append(Outgoing({"type": "content_block_stop", "index": index}))
        else:
            out.append(self._renumbered(stop, index))

    # -- the end ---------------------------------------------------------------------------------

    def _close_everything(self, out: list[Outgoing]) -> None:
        """Before message_delta / message_stop / the end: every lexer finished, every block closed."""
        self._release_held_stop(out)
        for index in list(self._sources):
            source = self._sources.pop(index)
            self._on_text_stop(source, Outgoing({"type": "content_block_stop", "index": index}), out)
            self.stats.stream_repairs[UNCLOSED_BLOCK] += 1
        for index in list(self._native):
            self._end_native(self._native.pop(index), out, None)
        for index in list(self._passed):
            out.append(Outgoing({"type": "content_block_stop", "index": self._passed.pop(index).index}))
            self.stats.stream_repairs[UNCLOSED_BLOCK] += 1

    def _with_stop_reason(self, incoming: Outgoing) -> Outgoing:
        delta = incoming.event.get("delta")
        if not isinstance(delta, dict) or not self.calls_made or delta.get("stop_reason") not in ("end_turn", "stop_sequence", None):
            return incoming
        if self.stats.calls:
            self.stats.finish_reasons_changed += 1
        else:
            self.stats.stream_repairs[STOP_REASON] += 1
        return Outgoing({**incoming.event, "delta": {**delta, "stop_reason": "tool_use", "stop_sequence": None}})

    def grow(self, index: int, text: str) -> None:
        pieces = self._grown.get(index)
        if pieces is None:
            pieces = self._grown[index] = TextPieces()
        pieces.append(text)

    def grown(self, index: int) -> str:
        pieces = self._grown.get(index)
        return pieces.text() if pieces is not None else ""

    def content(self) -> list[dict[str, Any]]:
        """The content blocks as a client accumulates them."""
        result = []
        for index, block in enumerate(self.blocks):
            block = dict(block)
            if block["type"] in (TEXT, THINKING) and index in self._grown:
                block[block["type"]] = self.grown(index)
            if block["type"] == TOOL_USE:
                text = self.grown(index)
                try:
                    block["input"] = orjson.loads(text) if text else {}
                except orjson.JSONDecodeError:
                    block["input"] = text
            result.append(block)
        return result


def _completion(sent: str, held: str) -> str:
    """What to add after the valid JSON prefix `sent` (and the pieces held because they broke it)
    to end with a JSON object: the repaired whole, from where `sent` ends; nothing if the repair
    no longer begins with what was sent (the client then has broken JSON, as upstream sent it)."""
    repaired = repair_json(sent + held, return_objects=False)
    if not isinstance(repaired, str) or not repaired.startswith("{"):
        repaired = "{}"
    try:
        canonical = orjson.dumps(orjson.loads(repaired)).decode()
    except orjson.JSONDecodeError:
        return ""
    for candidate in (repaired, canonical):
        if candidate.startswith(sent) and len(candidate) > len(sent):
            return candidate[len(sent):]
    return ""


class JsonPrefix:
    """Is the text fed so far the beginning of one JSON value? Each character is read once.

    A client such as the Anthropic TypeScript SDK parses every `partial_json` prefix and fails
    on the first that cannot begin valid JSON; this tells a piece that would break it apart.
    Numbers and literals are checked by their characters, not their grammar (`1-2` passes):
    what the partial parsers accept."""

    __slots__ = ("_stack", "_state", "complete", "_literal")

    def __init__(self) -> None:
        self._stack: list[str] = []  # "{" / "[" open
        self._state = "value"  # value, string, escape, unicode1..4, after, key, colon, key_string, scalar
        self.complete = False
        self._literal = ""

    def feed(self, piece: str) -> bool:
        """Read a piece; False (and nothing read) when it cannot continue a JSON prefix."""
        saved = (list(self._stack), self._state, self.complete, self._literal)
        for c in piece:
            if not self._step(c):
                self._stack, self._state, self.complete, self._literal = saved
                return False
        return True

    def _step(self, c: str) -> bool:  # noqa: C901 (a state machine reads best in one place)
        state = self._state
        if state in ("string", "key_string"):
            if c == "\\":
                self._state = "escape" if state == "string" else "key_escape"
            elif c == '"':
                self._state = "after" if state == "string" else "colon"
                self._closed_value() if state == "string" else None
            elif c < " ":
                return False
            return True
        if state in ("escape", "key_escape"):
            back = "string" if state == "escape" else "key_string"
            if c == "u":
                self._state = back + ":u4"
                return True
            if c in '"\\/bfnrt':
                self._state = back
                return True
            return False
        if ":u" in state:
            if c not in "0123456789abcdefABCDEF":
                return False
            back, count = state.split(":u")
            left = int(count) - 1
            self._state = back if left == 0 else f"{back}:u{left}"
            return True
        if state == "scalar":
            if c in "0123456789+-.eE" or c.isalpha():
                self._literal += c
                return self._literal_ok()
            self._state = "after"
            self._closed_value()
            if not self._literal_done():
                return False
            return self._step(c)
        if c in " \t\n\r":
            return True
        if state == "value":
            if c == "{":
                self._stack.append("{")
                self._state = "key_or_end"
            elif c == "[":
                self._stack.append("[")
                self._state = "value_or_end"
            elif c == '"':
                self._state = "string"
            elif c in "-0123456789tfn":
                self._literal = c
                self._state = "scalar"
            else:
                return False
            return True
        if state == "value_or_end":
            if c == "]":
                self._stack.pop()
                self._state = "after"
                self._closed_value()
                return True
            self._state = "value"
            return self._step(c)
        if state in ("key_or_end", "key"):
            if c == '"':
                self._state = "key_string"
            elif c == "}" and state == "key_or_end":
                self._stack.pop()
                self._state = "after"
                self._closed_value()
            else:
                return False
            return True
        if state == "colon":
            if c != ":":
                return False
            self._state = "value"
            return True
        if state == "after":
            if not self._stack:
                return False  # one value only
            top = self._stack[-1]
            if c == ",":
                self._state = "key" if top == "{" else "value"
            elif c == "}" and top == "{" or c == "]" and top == "[":
                self._stack.pop()
                self._closed_value()
            else:
                return False
            return True
        return False

    def _closed_value(self) -> None:
        self.complete = not self._stack

    def _literal_ok(self) -> bool:
        text = self._literal
        if text[0] in "tfn":
            return any(word.startswith(text) for word in ("true", "false", "null"))
        return all(ch in "0123456789+-.eE" for ch in text)

    def _literal_done(self) -> bool:
        text = self._literal
        if text[0] in "tfn":
            return text in ("true", "false", "null")
        try:
            float(text)
        except ValueError:
            return False
        return True


# -- SSE and whole bodies ------------------------------------------------------------------------


@dataclass(slots=True)
class BlockLane:
    """Text or thinking deltas of one upstream block whose lexer is read (`ArgsLane` in
    chat.py, for Messages): held text sends nothing; a piece of a live call's arguments one
    `input_json_delta` (`args`: the event around its JSON string's body); text of the block's
    kind the same delta (as it came when its number is upstream's, else `text`)."""

    frame: Frame
    source: SourceBlock
    leaf: Lexer
    path: list[Lexer]
    finished: bool  # the lexers around the leaf were finished last (see chat.ArgsLane)
    call_open: bool = False
    args: tuple[bytes, bytes] | None = None
    text: tuple[bytes, bytes] | None = None
    as_came: bool = False  # text as it came goes as it came (its block under upstream's number)
    quiet_if_idle: bool = False  # the block is quiet once its lexer is idle (`_find_quiet_blocks`)
    # Its text goes out renumbered (`text`) and the block's lexer is idle: text in which no
    # marker can start goes out without it. Set where the lane is armed, and after the lane
    # feeds the lexer (False where it may no longer be idle: always safe).
    quiet: bool = False
    start: int = 0  # where the string's body begins
    # The leaf's steady pieces, taken without the segments `feed` would make of them
    # (`Lexer.steady_piece`; not a chain's: the class's function, called with the leaf, as chat.py's
    # `ArgsLane` keeps it), and whether arguments made go out (`args`).
    steady: Any = None
    live: bool = False
    steady_bodies: Any = None  # (the same for a read of several events: `_block_burst`)
    # The leaf in its verbatim state (`Lexer.steady_piece`, as chat.py's `ArgsLane` keeps it).
    stop: str | None = None
    verbatim: bool = False
    # Whether it notes the text it sends, for remembering (`NotedEvents`): a lane whose block has
    # no call open, its run armed with it. (One that has notes the call's pieces of arguments.)
    notes_text: bool = False

    def __post_init__(self) -> None:
        self.start = len(self.frame.head)


class MessagesStreamRewriter(SseRewriter):
    """A Messages API SSE body in (any byte pieces), the repaired SSE body out."""

    def __init__(self, context: RequestContext, *, max_held: int = 1 << 20, sign_thinking: bool = True) -> None:
        super().__init__()
        self.core = MessagesRewriter(context, self.stats, max_held=max_held, sign_thinking=sign_thinking)
        self._passes_whole_reads = True  # reads of quiet deltas only pass unframed (`_nothing_to_read`)
        # Upstream blocks whose plain deltas pass unread: index -> kind (b"text" / b"thinking").
        # Only a parsed event changes the rewriter's state, so it is worked out after each.
        self._quiet_blocks: dict[int, bytes] = {}
        # The lanes (stream.py): a quiet block's plain deltas by their frame; the deltas of a
        # block whose lexer is read. Learned from an event read, dropped by the next parsed.
        self._quiet_frame: Frame | None = None
        self._block: BlockLane | None = None

    def _nothing_to_read(self, data: bytes) -> bool:
        """Whole events of one read, all text or thinking deltas of quiet blocks and no byte that
        may begin a marker: they go as they came, unframed and unparsed."""
        frame = self._quiet_frame
        if frame is not None and self._block is None:
            # Deltas of the quiet frame (`_quiet_read`'s, for a read at once), each a plain body
            # without a `[` (no `<`, no `\u` escape, no bare quote: `plain_bodies`); the frame's
            # own bytes began no marker when it was learned. A few calls into C, where the
            # patterns below match the frame's bytes over again for every event (a read of eight
            # text deltas: 57 K instructions, half of them in `_quiet_deltas_of`'s match).
            bodies = plain_bodies(data, frame)
            if bodies is not None and 91 not in b"".join(bodies):
                return True
        if not self._quiet_blocks:
            return False  # (no delta passes unread, nor any other event: a block's lexer is read, in bursts)
        if markup_may_start(data):
            return False
        if len(self._quiet_blocks) == 1:  # (one block open, as nearly always: one search in C)
            ((index, kind),) = self._quiet_blocks.items()
            if _quiet_deltas_of(index, kind).fullmatch(data):
                return True
        at, end = 0, len(data)
        while at < end:
            quiet = _QUIET_DELTA.match(data, at)
            if quiet is None or not self._quiet(int(quiet[1]), quiet[2]):
                return False
            at = quiet.end()
        return True

    def _passed_whole(self, data: bytes) -> None:
        # (Called while no lane is taken straight from `feed`.)
        last = data.rfind(b"\n\n", 0, len(data) - 2) + 2
        if last == 1:  # (no blank line before the read's end: one event)
            self._learn_quiet(data)  # its frame and lane (a frame learned in bursts has none)
        elif self._quiet_frame is None:
            # A read of several quiet deltas (in bursts): the frame of its last one, for the next
            # reads' `_nothing_to_read`, but no lane (it would refuse every read of several
            # before they were looked at, as in `ChatStreamRewriter._passed_among`).
            self._learn_quiet(data[last:], with_lane=False)

    def _on_block(self, raw: bytes) -> list[bytes]:
        if self._block is not None:
            out = self._block_read(raw)
            if out is not None:
                return out
        elif self._quiet_frame is not None and self._quiet_read(raw):
            return [raw]
        quiet = _QUIET_DELTA.fullmatch(raw)
        if quiet is not None and not markup_may_start(raw) and self._quiet(int(quiet[1]), quiet[2]):
            if self._quiet_frame is None and self.lanes:
                self._learn_quiet(raw)
            return [raw]  # the common case, read from the bytes alone: plain text, as it came
        read = read_event(raw)
        if read is None:
            return [raw]
        event = read[0]
        if not markup_may_start(raw) and self._passes(event):
            if self._quiet_frame is None and self.lanes:
                self._learn_quiet(raw)
            return [raw]
        return self._read_in_full(raw, event)

    def _read_in_full(self, raw: bytes, event: dict[str, Any], lexed: list[Segment] | None = None, armed: Frame | None = None) -> list[bytes]:
        """`armed`: the frame of the block lane that read `raw` (and fed its lexers: `lexed`)."""
        self._quiet_frame = self._block = self._direct = None
        core = self.core
        core.lexed, core.last_segments, core.defer_lexers = lexed, None, self.lanes
        out = [_encode(o) for o in core.on_event(event, raw)]
        core.lexed = None
        self._find_quiet_blocks()
        if core.last_segments is not None and self.lanes:
            self._arm(raw, event, armed)
        return out

    def _quiet(self, index: int, kind: bytes) -> bool:
        """May a text or thinking delta of upstream block `index` pass as it came, unread?"""
        return self._quiet_blocks.get(index) == kind

    def _find_quiet_blocks(self) -> None:
        """The blocks open under their own number, in their own kind, whose lexer holds nothing."""
        self._quiet_blocks = {
            index: source.kind.encode()
            for index, source in self.core._sources.items()
            if source.current is not None
            and source.open_call is None
            and not source.as_content
            and source.current.index == index
            and source.current.kind == source.kind
            and source.quiet
        }

    def _passes(self, event: dict[str, Any]) -> bool:
        """The common case, cheaply: a text delta without markup into a block whose lexer holds
        nothing and whose numbering is upstream's: recorded and sent as it came."""
        if event.get("type") != "content_block_delta":
            return False
        core = self.core
        source = core._sources.get(event.get("index"))
        if source is None or source.current is None or source.current.index != source.index or source.open_call is not None:
            return False
        delta = event.get("delta")
        name = DELTA_OF[source.kind][1]
        if not isinstance(delta, dict) or delta.get("type") != DELTA_OF[source.kind][0] or source.current.kind != source.kind or source.as_content:
            return False
        return isinstance(delta.get(name), str) and source.quiet

    def _at_end(self) -> list[bytes]:
        self._quiet_blocks = {}
        self._quiet_frame = self._block = self._direct = None
        return [_encode(o) for o in self.core.finish()]

    _telltales = {"call": b'"tool_use"', "args": b'"input_json_delta"'}

    @staticmethod
    def _assembled(raw: bytes) -> list[Contribution]:
        """What a client (the SDK's accumulator) assembles from one event: each block's text,
        thinking and input JSON grow; every other event counts by its type and block, its last
        version. See `EchoCheck`."""
        block = parse_block(raw)
        if block.data is None:
            return []
        if block.malformed:
            return [(("raw",), raw.decode("latin-1"), True)]
        try:
            data = orjson.loads(block.data)
        except orjson.JSONDecodeError:
            return [(("data",), block.data, True)]
        if not isinstance(data, dict):
            return [(("data",), block.data, True)]
        kind, index, delta = data.get("type"), data.get("index"), data.get("delta")
        if kind == "content_block_delta" and isinstance(delta, dict):
            name = _GROWING.get(delta.get("type"))
            # (a call's arguments: upstream's are `input_json_delta`s, see `_telltales`)
            grows = "args" if name == "partial_json" else "grows"
            if name is not None and isinstance(delta.get(name), str) and len(delta) == 2 and len(data) == 3:
                return [((grows, index, delta["type"]), delta[name], True)]
            return [(("delta", index, delta.get("type")), data, False)]
        block = data.get("content_block")
        if isinstance(block, dict) and block.get("type") == TOOL_USE:
            return [(("call", kind, index), data, False)]
        return [(("event", kind, index), data, False)]

    # -- lanes -----------------------------------------------------------------------------------

    def _learn_quiet(self, raw: bytes, with_lane: bool = True) -> None:
        """A quiet delta passed as it came: the next ones of its frame pass from their bytes (by
        the frame's lane straight from `feed` as well, `with_lane`)."""
        spans = string_spans(raw, ("text",)) or string_spans(raw, ("thinking",))
        frame = Frame.around(raw, spans) if spans is not None else None
        if frame is not None:
            self._quiet_frame = frame
            if not with_lane:
                return
            lane = quiet_lane(frame, self._echo)
            if self.laned is not None:  # (the text it passes is noted for remembering: `NotedEvents`)
                read = read_event(raw)
                lane = noting_lane(lane, frame, _quiet_text(read[0] if read is not None else None))
                self.laned.armed(*lane.noted_as)
            self._direct = lane

    def _quiet_read(self, raw: bytes) -> bool:
        body = self._quiet_frame.split(raw)
        return body is not None and plain_body(body)

    def _arm(self, raw: bytes, event: dict[str, Any], armed: Frame | None = None) -> None:
        """After a text or thinking delta read in full whose block's lexer holds markup, or whose
        text goes to a block of ours: the lane of the next deltas of that block (`BlockLane`).
        `armed`: the frame of the lane that read `raw`, one this method learned and checked: the
        event is one of it, so it holds as it did then."""
        core = self.core
        source = core._sources.get(event.get("index"))
        delta = event.get("delta")
        if source is None or core._keep_text or not isinstance(delta, dict) or delta.get("type") != DELTA_OF[source.kind][0]:
            return
        name = DELTA_OF[source.kind][1]
        text = delta.get(name)
        if not isinstance(text, str) or not text or self._quiet(source.index, source.kind.encode()):
            return
        frame = armed
        if frame is None:
            spans = string_spans(raw, (name,))
            frame = Frame.around(raw, spans) if spans is not None else None
            if frame is None or _CARRIED_FIELD.search(frame.head):
                return
            read = read_event(frame.probe(b"\\u0001"))
            if read is None or read[0] != {**event, "delta": {**delta, name: "\x01"}}:
                return
        segments = core.last_segments
        leaf, path = live_path(source.lexer)
        lane = BlockLane(frame, source, leaf, path, bool(segments) and type(segments[-1]) in (CallArgs, CallBegin))
        if source.open_call is not None:
            lane.call_open = True
            lane.args = _around(_encode(Outgoing(core.args_event(source.open_call.index, "\x00"))))
        current = source.current
        kind = THINKING if source.kind == THINKING and not source.as_content else TEXT
        if current is not None and current.kind == kind and not any(type(node) is ChainLexer for node in path):
            lane.as_came = event.get("index") == current.index and kind == source.kind
            lane.text = _around(_encode(Outgoing(core.text_event(current.index, kind, "\x00"))))
        lane.quiet_if_idle = (
            current is not None and source.open_call is None and not source.as_content and current.index == source.index and current.kind == source.kind
        )
        lane.quiet = lane.text is not None and not lane.quiet_if_idle and source.lexer.idle
        lane.steady = getattr(type(leaf), "steady_piece", None)
        lane.steady_bodies = getattr(type(leaf), "steady_bodies", None) if lane.steady is not None else None
        lane.stop = getattr(type(leaf), "verbatim_stop", None) if lane.steady is not None else None
        lane.live = lane.finished and lane.args is not None
        if (laned := self.laned) is not None:  # (see chat.py's `_arm`)
            if lane.args is not None:
                laned.armed(("args", source.open_call.index), *lane.args)
            elif lane.as_came:  # text as it came: in the event's own frame, when it holds nothing else
                if (call := _quiet_text(event)) is not None:
                    lane.notes_text = True
                    laned.armed(call, frame.head, frame.tail)
            elif lane.text is not None:  # text renumbered: the event `text_event` renders
                lane.notes_text = True
                laned.armed(("text", current.index, DELTA_OF[kind][1]), *lane.text)
        self._block = lane
        self._direct = self._lane_direct(type(self)._block_read)

    def _block_read(self, raw: bytes) -> list[bytes] | None:
        lane = self._block
        frame = lane.frame
        start, end = lane.start, len(raw) - len(frame.tail)
        # (Slices, not `startswith` and `endswith`: see sse.py.)
        if len(raw) < frame.fixed or raw[:start] != frame.head or raw[end:] != frame.tail:
            return None
        body = raw[start:end]
        if 10 in body:
            return None  # several events: no one string (told without the decoder's costly error)
        try:
            text = orjson.loads(raw[start - 1 : end + 1])
        except orjson.JSONDecodeError:
            return None
        if not text:
            return None
        if lane.quiet and not text_may_start_markup(text):
            # What the idle lexer would give back, as it came (prose after a call), renumbered.
            lane.source.produced = True
            if lane.as_came:
                event = raw
            else:
                head, tail = lane.text
                event = head + (body if 92 not in body else orjson.dumps(text)[1:-1]) + tail
            if lane.notes_text and (laned := self.laned) is not None:
                laned.append(event)
            return [event]
        if lane.verbatim and lane.stop not in text and not text[-1].isspace():
            made = text  # (what the leaf's `steady_piece` makes of it: no call)
        elif (steady := lane.steady) is None or (made := steady(lane.leaf, text, lane.live)) is None:
            made = None
        else:
            lane.verbatim = lane.stop is not None and made != "" and not text[-1].isspace()
        if made is not None:
            # The commonest event of a tool-call stream: a piece of a call's arguments.
            lane.quiet = False  # (as after any piece the lexer reads)
            if not made:
                return []
            head, tail = lane.args
            piece = head + (body if made == text and 92 not in body else orjson.dumps(made)[1:-1]) + tail
            if (laned := self.laned) is not None:
                laned.append(piece)
            return [piece]
        lane.verbatim = False  # (the leaf is fed: its state is no longer known)
        segments = lane.leaf.feed(text)
        lane.quiet = False
        if lane.quiet_if_idle and lane.leaf.idle:  # the block is quiet again (the full path works it out after each event)
            self._block = self._direct = None
            self._find_quiet_blocks()
        if not segments:
            return []
        if len(segments) == 1 and self._block is lane:
            kind = type(segments[0])
            piece = segments[0].text if kind is CallArgs or kind is Text else ""
            escaped = raw[start:end] if piece == text and 92 not in body else None
            if kind is CallArgs and piece and lane.finished:
                if not lane.call_open:
                    return []  # no call open: the arguments go nowhere (as `_place` has it)
                if lane.args is not None:
                    head, tail = lane.args
                    event = head + (escaped if escaped is not None else orjson.dumps(piece)[1:-1]) + tail
                    if (laned := self.laned) is not None:
                        laned.append(event)
                    return [event]
            elif kind is Text and piece and lane.text is not None:
                lane.source.produced = True
                lane.quiet = piece == text and not lane.quiet_if_idle and lane.source.lexer.idle
                if lane.as_came and piece == text:
                    event = raw
                else:
                    head, tail = lane.text
                    event = head + (escaped if escaped is not None else orjson.dumps(piece)[1:-1]) + tail
                    if lane.as_came:
                        return [event]  # (not in the frame of the text noted as it came: read again)
                if lane.notes_text and (laned := self.laned) is not None:
                    laned.append(event)
                return [event]
        # Anything else: what the lexers around the leaf make of it, then the full path.
        return self._read_in_full(raw, read_event(raw)[0], unwind(lane.path, segments), frame)

    def _block_burst(self, data: bytes) -> list[bytes] | None:
        """`_block_read` for a read of several events (`SseRewriter._feed_read`'s), taken at
        once when each is a plain piece of a live call's arguments (`burst_events`), or of a
        block the leaf holds whole (`stream.held_burst`: their text fed as one, nothing sent). (A quiet lane's lexer is idle, one with no call open has no arguments live:
        `steady_bodies` takes nothing then.)"""
        lane = self._block
        lane.verbatim = False  # (the leaf may take the pieces: its state after them is not told)
        if lane.steady_bodies is not None and lane.args is not None:
            return burst_events(data, lane.frame, lane.leaf.steady_bodies, lane.live, *lane.args, self.laned)
        return held_burst(data, lane.frame, lane.leaf)  # (the lane is not quiet then: its lexer holds a block)

    # (`_feed_read` offers a read of several events to the lane's `burst` first.)
    _block_read.burst = _block_burst  # type: ignore[attr-defined]


# Deltas whose field a client appends to what came before: delta type -> field.
_GROWING = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}


def _quiet_text(event: Any) -> tuple[str, Any, str] | None:
    """What the events of a frame learned from `event` (parsed) add to, for remembering
    (`NotedEvents`): ("text", the block's index, the delta's field) when the event is a text or
    thinking delta and holds nothing else; None: the lane's events are read again."""
    delta = event.get("delta") if isinstance(event, dict) and len(event) == 3 and event.get("type") == "content_block_delta" else None
    if not isinstance(delta, dict) or len(delta) != 2:
        return None
    name = _GROWING.get(delta.get("type"))
    return ("text", event.get("index"), name) if name in ("text", "thinking") and isinstance(delta.get(name), str) else None


def _around(encoded: bytes) -> tuple[bytes, bytes] | None:
    """An event rendered around the probe text `\\x00`: the bytes before and after its body."""
    if encoded.count(b"\\u0000") != 1:
        return None
    head, _, tail = encoded.partition(b"\\u0000")
    return head, tail


# A text or thinking delta as Anthropic and the servers that copy it write one: the event line,
# then the data's first keys in this order. Anything else takes the parsed path.
_QUIET_DELTA = re.compile(rb'event: content_block_delta\ndata: \{"type":\s?"content_block_delta",\s?"index":\s?(\d+),\s?"delta":\s?\{"type":\s?"(text|thinking)_delta",\s?"(?:text|thinking)":\s?"(?:[^"\\]++|\\.)*+"\}\}\n\n')


@lru_cache(maxsize=64)
def _quiet_deltas_of(index: int, kind: bytes) -> re.Pattern[bytes]:
    """One or more `_QUIET_DELTA`s, all of block `index` in `kind` (b"text" / b"thinking")."""
    one = _QUIET_DELTA.pattern.replace(rb"(\d+)", b"%d" % index).replace(rb"(text|thinking)", kind).replace(rb"(?:text|thinking)", kind)
    return re.compile(b"(?:" + one + b")+")


def _encode(outgoing: Outgoing) -> bytes:
    if outgoing.raw is not None:
        return outgoing.raw
    return encode_event(orjson.dumps(outgoing.event), outgoing.event["type"])


def body_events(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A whole message as the events that would have streamed it (text in one delta a block)."""
    events: list[dict[str, Any]] = [{"type": "message_start", "message": {**body, "content": []}}]
    for index, block in enumerate(body.get("content") or []):
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind in (TEXT, THINKING) and isinstance(block.get(kind), str):
            start = {**block, kind: ""}
            events.append({"type": "content_block_start", "index": index, "content_block": start})
            events.append({"type": "content_block_delta", "index": index, "delta": {"type": DELTA_OF[kind][0], kind: block[kind]}})
            if kind == THINKING and block.get("signature"):
                start["signature"] = ""
                events.append({"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": block["signature"]}})
        elif kind == TOOL_USE:
            given = block.get("input")
            events.append({"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}})
            if isinstance(given, str):  # a server that sent the arguments as a string
                events.append({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": given}})
            elif given not in (None, {}):
                events.append({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": orjson.dumps(given).decode()}})
        else:
            events.append({"type": "content_block_start", "index": index, "content_block": block})
        events.append({"type": "content_block_stop", "index": index})
    events.append({"type": "message_delta", "delta": {"stop_reason": body.get("stop_reason"), "stop_sequence": body.get("stop_sequence")}})
    return events


def rewrite_messages_body(body: dict[str, Any], context: RequestContext, *, max_held: int = 1 << 20, stats: RewriteStats | None = None, sign_thinking: bool = True) -> RewriteStats | None:
    """Rewrite a non-streaming Messages body in place; None when nothing changed."""
    if body.get("type") != "message" or not isinstance(body.get("content"), list):
        return None
    stats = stats if stats is not None else RewriteStats()
    core = MessagesRewriter(context, stats, max_held=max_held, sign_thinking=sign_thinking, keep_text=True)
    stop_reason = original_stop = body.get("stop_reason")
    for event in body_events(body):
        for outgoing in core.on_event(event):
            delta = outgoing.event.get("delta")
            if outgoing.event.get("type") == "message_delta" and isinstance(delta, dict):
                stop_reason = delta.get("stop_reason")
    changed = stats.calls or stats.stream_repairs or stats.reasoning_moved or stop_reason != original_stop
    if not changed:
        return None
    body["content"] = core.content()
    body["stop_reason"] = stop_reason
    return stats
