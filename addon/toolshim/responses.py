"""Responses API (`/v1/responses`): map lexer segments onto output items and stream events.

Upstream announces message and reasoning items and streams their text; the text may carry
leaked markup. The rewrite turns each call found in the text into a `function_call` item of
its own, in order of appearance, and splits the text item around it:

    upstream:  message msg_1 "Let me check.<tool_call>{...}</tool_call>Done."
    client:    message msg_1 "Let me check."  |  function_call fc_…  |  message msg_1_2 "Done."

Rules the real clients enforce (DESIGN.md, research/wire.md section 2):
- `sequence_number` strictly increasing over every event sent: we number every event; one
  whose number (and every other field) is unchanged leaves as its exact upstream bytes;
- `output_index` counts items in the order we announce them; every delta names an item
  already announced and not yet done, by its `item_id`;
- a message item is announced lazily, at its first visible text, so a message holding only a
  call leaves no empty message behind; a part of an item is announced at its first text;
- a call's item is announced with `arguments: ""`, its arguments streamed as deltas, then
  `function_call_arguments.done` and `output_item.done` carry the same full text; `id`
  (`fc_…`) and `call_id` are on the item only;
- the `.done` events, `output_item.done` and the terminal event's `response.output` all
  agree with the deltas sent.

Text channels are `output_text` parts of messages and `reasoning_text` parts of reasoning
items. Summaries, refusals and every other event pass through, renumbered.

Upstream's own `function_call` items pass through too, their arguments typed by the tool's
schema as they stream (native.py `ArgumentTyping`, as on the other APIs): a stringified value
the schema types otherwise is held from its opening quote and sent, typed, with the delta that
closes it; a delta goes out without what is held, empty if nothing is left (never dropped: the
numbering, and so every later event's bytes, stay upstream's). `null` or empty arguments become
`{}`, arguments sent as a JSON object its text. `.done`, `output_item.done` and the terminal
event's list get the arguments the deltas gave (`NativeCall`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from types import FunctionType
from typing import Any

import orjson

from .calls import MAX_NOTES, CallScope, RewriteStats, random_id
from .lexers import ScopeLexers
from .native import EMPTY_ARGUMENTS, OBJECT_ARGUMENTS, ArgumentTyping
from .lexers.base import CallArgs, CallBegin, CallEnd, ChainLexer, Lexer, ReasoningEnd, ReasoningText, Segment, Text, TextPieces
from .sse import encode_event, parse_block, read_event
from .stream import _CARRIED_FIELD, Contribution, Direct, SseRewriter, each_string, live_path, markup_may_start, string_spans, unwind
from .tools import RequestContext

MESSAGE, REASONING, FUNCTION_CALL = "message", "reasoning", "function_call"
TEXT_ITEM_TYPES = (MESSAGE, REASONING)
TERMINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")
# The text events of a watched part, by the item type they belong to.
TEXT_DELTA = {MESSAGE: "response.output_text.delta", REASONING: "response.reasoning_text.delta"}
TEXT_DONE = {MESSAGE: "response.output_text.done", REASONING: "response.reasoning_text.done"}
PART_TYPE = {MESSAGE: "output_text", REASONING: "reasoning_text"}
# vLLM announces the parts of reasoning items with events of its own name (vllm#35184).
PART_ADDED = ("response.content_part.added", "response.reasoning_part.added")
PART_DONE = ("response.content_part.done", "response.reasoning_part.done")
# Events held until their item's first text and then sent as they came (`_announce`).
_SENT_LATER = ("response.output_item.added", *PART_ADDED)
ARGUMENTS_DELTA, ARGUMENTS_DONE = "response.function_call_arguments.delta", "response.function_call_arguments.done"
_JSON_WHITESPACE = " \t\r\n"


def default_part(kind: str) -> dict[str, Any]:
    if kind == MESSAGE:
        return {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    return {"type": "reasoning_text", "text": ""}


@dataclass(slots=True)
class Outgoing:
    """One event to send: the raw upstream bytes when nothing in it changed."""

    event: dict[str, Any]
    name: str | None  # the SSE `event:` field
    raw: bytes | None = None


@dataclass(slots=True)
class PieceItem:
    """A text item we send: an upstream message or reasoning item, or a piece of one cut by a
    call. A message piece is announced at its first text; a part at its first text."""

    id: str
    kind: str
    base: dict[str, Any]  # the item's fields besides id, status and content
    index: int = -1  # our output_index, once announced
    parts: dict[int, dict[str, Any]] = field(default_factory=dict)  # upstream content_index -> part
    text_open: set[int] = field(default_factory=set)  # parts whose text is not done yet
    part_open: set[int] = field(default_factory=set)  # parts not done yet
    part_events: dict[int, str] = field(default_factory=dict)  # the part events' name, as upstream
    # The text of the parts we read, as it grows (`+=` on a dict's string copies it every time:
    # quadratic over a long answer); joined for the `.done` payloads.
    texts: dict[int, TextPieces] = field(default_factory=dict)

    @property
    def announced(self) -> bool:
        return self.index >= 0

    def content_index(self, upstream_index: int) -> int:
        return list(self.parts).index(upstream_index)

    def add_text(self, key: int, text: str) -> None:
        held = self.texts.get(key)
        if held is None:  # text deltas into a part of a type we do not read (`"type": "text"`)
            held = self.texts[key] = TextPieces()
            announced = self.parts[key].get("text")
            if isinstance(announced, str) and announced:
                held.append(announced)
        held.append(text)

    def text(self, key: int) -> str:
        return self.texts[key].text()

    def part(self, key: int) -> dict[str, Any]:
        """The part as it stands, its text so far included."""
        held = self.texts.get(key)
        return {**self.parts[key], "text": held.text()} if held is not None else dict(self.parts[key])

    def item(self, status: str) -> dict[str, Any]:
        return {**self.base, "id": self.id, "status": status, "content": [self.part(key) for key in self.parts]}


@dataclass(slots=True)
class SourceItem:
    """An upstream message or reasoning item whose text we read."""

    id: str
    kind: str
    added: Outgoing  # upstream's output_item.added, held until the first piece is announced
    part_added: dict[int, Outgoing] = field(default_factory=dict)  # upstream's content_part.added
    lexers: dict[int, Lexer] = field(default_factory=dict)  # content_index -> lexer
    altered: bool = False  # some text of it did not pass as it came
    reasoning_over: set[int] = field(default_factory=set)  # parts whose `</think>` leaked
    piece: PieceItem | None = None  # the piece now receiving this item's text
    # The piece of the other kind: content after a leaked `</think>` in a reasoning item, or
    # `<think>…</think>` reasoning in a message.
    other_piece: PieceItem | None = None
    pieces: int = 0
    produced: list[dict[str, Any]] = field(default_factory=list)  # our done items, in order
    unended: list[OpenCall] = field(default_factory=list)  # calls cut by their text's end


@dataclass(slots=True)
class OpenCall:
    """A function_call item announced and not yet done."""

    item: dict[str, Any]  # as announced (its `arguments` empty)
    index: int  # our output_index
    source: SourceItem  # the text item it was found in: it takes the call's place in the output
    # The arguments streamed so far (`+=` on the item's string copied it whole on every delta:
    # quadratic over long arguments); joined for the `.done` events.
    arguments: TextPieces = field(default_factory=TextPieces)


@dataclass(slots=True)
class NativeCall:
    """One of upstream's own function_call items, its arguments typed as they stream.

    Until its first full copy of the arguments (`.done`, else `output_item.done`, else the
    response's end) the pieces are typed one by one; then the call is settled: what typing held
    goes out as one more delta, and `resolved` is what the client was sent. A copy that says
    the same as upstream's pieces (`baseline`), as text or as a value, is given `resolved`; a
    copy that says something else is upstream's own disagreement: passed on, noted once."""

    index: int  # upstream's output_index
    id: str | None  # the item's `fc_…` id
    call_id: str | None
    typing: ArgumentTyping | None  # None once settled
    received: TextPieces = field(default_factory=TextPieces)  # upstream's pieces, as text
    sent: TextPieces = field(default_factory=TextPieces)  # ours
    streamed: bool = False  # pieces came (deltas, or arguments on the added item)
    visible: bool = False  # something besides whitespace was sent
    object_counted: bool = False
    settled: bool = False
    baseline: str | None = None  # upstream's whole arguments, once settled
    resolved: str | None = None  # ours (None: left as upstream sent them)
    noted: bool = False

    @property
    def repaired(self) -> bool:
        return self.resolved is not None and (self.resolved != self.baseline or self.object_counted)


class ResponsesRewriter:
    """The event-level rewrite of one response (sans-IO: dicts in, dicts or raw bytes out)."""

    def __init__(
        self,
        context: RequestContext,
        stats: RewriteStats,
        *,
        max_held: int = 1 << 20,
        required_action: bool = False,
        dialects: ScopeLexers | None = None,
    ) -> None:
        self.stats = stats
        self._dialects = dialects or ScopeLexers(CallScope(context, stats), max_held=max_held)
        self._required_action = required_action
        self._seq: int | None = None  # the next sequence_number to send
        self._next_index = 0
        self._index_map: dict[int, int] = {}  # upstream output_index -> ours, for items passed on
        self._sources: dict[int, SourceItem] = {}  # by upstream output_index
        self._sources_by_id: dict[str, SourceItem] = {}
        self._passed_done: dict[str, dict[str, Any]] = {}  # items passed on, as done, by id
        self._done_items: list[tuple[int, dict[str, Any]]] = []  # (our index, item), as closed
        # The function_call items being streamed, by the channel (item id, content_index) whose
        # lexer opened them: two channels may each be inside a call at the same time.
        self._calls: dict[tuple[str, int], OpenCall] = {}
        # The status a call gets when its end is its text's end; None: its item's, once known.
        self._closing_status: str | None = "completed"
        self._terminal_seen = False
        # Upstream's own function_call items (typed by schema), by upstream output_index and id.
        self._natives: dict[int, NativeCall] = {}
        self._natives_by_id: dict[str, NativeCall] = {}
        # What the lexer of the next text delta made of its text already (a lane fed it), and
        # what the last text delta's lexer gave (a lane may follow it).
        self.lexed: list[Segment] | None = None
        self.last_segments: list[Segment] | None = None

    # -- events ----------------------------------------------------------------------------------

    def on_event(self, event: dict[str, Any], raw: bytes | None = None, name: str | None = None) -> list[Outgoing]:
        kind = event.get("type")
        if self._seq is None:
            seq = event.get("sequence_number")
            self._seq = seq if type(seq) is int else 0
        incoming = Outgoing(event, name, raw)
        out: list[Outgoing] = []
        if kind in TERMINAL_EVENTS and isinstance(event.get("response"), dict):
            self._on_terminal(incoming, out)
        elif kind == "response.output_item.added" and isinstance(event.get("item"), dict):
            self._on_item_added(incoming, out)
        elif kind == "response.output_item.done" and isinstance(event.get("item"), dict):
            self._on_item_done(incoming, out)
        elif self._natives and kind in (ARGUMENTS_DELTA, ARGUMENTS_DONE) and (call := self._native_of(event)) is not None:
            self._on_native_arguments(call, incoming, out)
        elif (source := self._source_of(event)) is None:
            out.append(self._retarget(incoming))
        elif kind in PART_ADDED:
            self._on_part_added(source, incoming, out)
        elif kind == TEXT_DELTA[source.kind] and isinstance(event.get("delta"), str):
            self._on_text_delta(source, incoming, out)
        elif kind == TEXT_DONE[source.kind]:
            self._on_text_done(source, incoming, out)
        elif kind in PART_DONE:
            self._on_part_done(source, incoming, out)
        else:
            out.append(self._retarget(incoming))  # summaries, refusals, annotations
        return [self._numbered(o) for o in out]

    def passes_plain_delta(self, event: dict[str, Any]) -> bool:
        """The common case, cheaply: a text delta without markup into an open part whose lexer
        holds nothing, where our numbering and item ids are still upstream's. Its text is
        recorded (for the `.done` payloads) and True returned: the event goes out as it came.
        False: `on_event` must read it. The caller has checked that no marker can start in it."""
        source = self._sources.get(event.get("output_index"))
        if source is None or event.get("type") != TEXT_DELTA[source.kind]:
            return False
        content_index, delta, piece = event.get("content_index"), event.get("delta"), source.piece
        if (
            piece is None
            or not isinstance(delta, str)
            or content_index not in piece.text_open
            or content_index in source.reasoning_over
            or event.get("sequence_number") != self._seq
            or piece.index != event["output_index"]
            or piece.id != event.get("item_id")
            or piece.content_index(content_index) != content_index
        ):
            return False
        lexer = source.lexers.get(content_index)
        if lexer is None or not lexer.idle:
            return False
        piece.add_text(content_index, delta)
        self._seq += 1
        return True

    def finish(self) -> list[Outgoing]:
        """The body ended without a terminal event: release what the lexers hold."""
        out: list[Outgoing] = []
        if not self._terminal_seen:
            self._finish_lexers(out, status="incomplete")
            for call in self._natives.values():
                self._settle_native(call, None, False, out)
        return [self._numbered(o) for o in out]

    def done_items(self) -> list[dict[str, Any]]:
        return [item for _, item in sorted(self._done_items, key=lambda pair: pair[0])]

    # -- items -----------------------------------------------------------------------------------

    def _on_item_added(self, incoming: Outgoing, out: list[Outgoing]) -> None:
        event = incoming.event
        item, upstream_index = event["item"], event.get("output_index")
        if item.get("type") in TEXT_ITEM_TYPES and isinstance(item.get("id"), str) and type(upstream_index) is int:
            source = SourceItem(item["id"], item["type"], incoming)
            self._sources[upstream_index] = source
            self._sources_by_id[source.id] = source
            if source.kind == REASONING:  # reasoning is announced when upstream announces it
                self._announce(source, self._new_piece(source, REASONING), out)
            return
        if type(upstream_index) is int:
            self._index_map[upstream_index] = self._next_index
            self._next_index += 1
        if item.get("type") == FUNCTION_CALL:
            self._dialects.scope.note_upstream_call()
            if type(upstream_index) is int:
                incoming = self._start_native(incoming, upstream_index)
        out.append(self._retarget(incoming))

    def _on_item_done(self, incoming: Outgoing, out: list[Outgoing]) -> None:
        event = incoming.event
        upstream_item = event["item"]
        source = self._sources.get(event.get("output_index"))
        if source is None or source.id != upstream_item.get("id"):
            call = self._native_of({"item_id": upstream_item.get("id"), "output_index": event.get("output_index")}) if self._natives else None
            if call is not None and "arguments" in upstream_item:
                self._settle_native(call, upstream_item["arguments"], True, out)
                arguments = self._native_copy(call, upstream_item["arguments"])
                if arguments is not upstream_item["arguments"]:
                    upstream_item = {**upstream_item, "arguments": arguments}
                    incoming = Outgoing({**event, "item": upstream_item}, incoming.name)
            index = self._index_map.get(event.get("output_index"))
            if index is not None:
                self._done_items.append((index, upstream_item))
            if isinstance(upstream_item.get("id"), str):
                self._passed_done[upstream_item["id"]] = upstream_item
            out.append(self._retarget(incoming))
            return
        status = upstream_item.get("status") if isinstance(upstream_item.get("status"), str) else "completed"
        self._finish_lexers(out, source, status)
        piece = source.piece
        if not source.altered and piece is not None and piece.announced and source.other_piece is None:
            # Never cut, text as it came: upstream's own item is the truth.
            out.append(self._retarget(incoming))
            self._done_items.append((piece.index, upstream_item))
            source.produced.append(upstream_item)
        else:
            content = upstream_item.get("content") if isinstance(upstream_item.get("content"), list) else []
            for piece in (source.piece, source.other_piece):
                if piece is None:
                    continue
                if piece.kind == source.kind:
                    piece.base.update({k: v for k, v in upstream_item.items() if k not in ("id", "status", "content")})
                    for key in piece.parts:  # parts we do not read: upstream's final version
                        if piece.parts[key].get("type") != PART_TYPE[source.kind] and key < len(content):
                            piece.parts[key] = content[key]
                self._close_piece(source, piece, out, status)
        source.piece = source.other_piece = None

    def _new_piece(self, source: SourceItem, kind: str) -> PieceItem:
        if kind != source.kind:  # an item of its own, of the other kind
            if kind == MESSAGE:
                piece = PieceItem(random_id("msg_"), MESSAGE, {"type": MESSAGE, "role": "assistant"})
            else:
                piece = PieceItem(random_id("rs_"), REASONING, {"type": REASONING, "summary": []})
            source.other_piece = piece
        else:
            piece_id = source.id if source.pieces == 0 else f"{source.id}_{source.pieces + 1}"
            base = {k: v for k, v in source.added.event["item"].items() if k not in ("id", "status", "content")}
            piece = PieceItem(piece_id, kind, base)
            source.piece = piece
        source.pieces += 1
        return piece

    def _announce(self, source: SourceItem, piece: PieceItem, out: list[Outgoing]) -> None:
        piece.index = self._next_index
        self._next_index += 1
        if piece.id == source.id:  # upstream's own announcement, renumbered
            added = source.added.event
            item = {**added["item"], "content": []} if added["item"].get("content") else added["item"]
            event = {**added, "output_index": piece.index, "item": item}
            out.append(self._same_or_new(source.added, event))
        else:
            item = {**piece.base, "id": piece.id, "status": "in_progress", "content": []}
            out.append(self._new({"type": "response.output_item.added", "output_index": piece.index, "item": item}))

    def _close_piece(self, source: SourceItem, piece: PieceItem, out: list[Outgoing], status: str = "completed") -> None:
        if not piece.announced:
            return  # it never got text: it is not sent at all
        for key in list(piece.parts):
            if key in piece.part_open:
                self._close_part(piece, key, out)
        item = piece.item(status)
        out.append(self._new({"type": "response.output_item.done", "output_index": piece.index, "item": item}))
        self._done_items.append((piece.index, item))
        source.produced.append(item)

    # -- parts and text --------------------------------------------------------------------------

    def _source_of(self, event: dict[str, Any]) -> SourceItem | None:
        source = self._sources.get(event.get("output_index"))
        if source is None or event.get("item_id") not in (None, source.id):
            return None
        return source

    def _on_part_added(self, source: SourceItem, incoming: Outgoing, out: list[Outgoing]) -> None:
        content_index = incoming.event.get("content_index")
        part = incoming.event.get("part")
        if type(content_index) is not int or not isinstance(part, dict):
            out.append(self._retarget(incoming))
            return
        source.part_added[content_index] = incoming
        piece = source.piece
        if part.get("type") != PART_TYPE[source.kind]:  # a part we do not read (a refusal)
            if piece is None:
                piece = self._new_piece(source, source.kind)
            if not piece.announced:
                self._announce(source, piece, out)
            self._open_part(source, piece, content_index, out)
        elif piece is not None and piece.announced and piece.id == source.id:
            self._open_part(source, piece, content_index, out)  # reasoning: as upstream did

    def _on_text_delta(self, source: SourceItem, incoming: Outgoing, out: list[Outgoing]) -> None:
        event = incoming.event
        content_index, delta = event.get("content_index"), event["delta"]
        if type(content_index) is not int:
            out.append(self._retarget(incoming))
            return
        segments, self.lexed = self.lexed, None
        if segments is None:
            segments = self._lexer(source, content_index).feed(delta)
        self.last_segments = segments
        piece = source.piece
        if not delta and not segments and piece is not None and content_index in piece.text_open:
            out.append(self._retarget(incoming))  # an empty delta (servers send them): as it came
            return
        if (
            len(segments) == 1
            and type(segments[0]) is Text
            and segments[0].text == delta
            and content_index not in source.reasoning_over
            and piece is not None
            and content_index in piece.text_open
        ):
            # The common case: plain text into an open part, sent as it came (renumbered).
            piece.add_text(content_index, delta)
            changes = {"output_index": piece.index, "item_id": piece.id, "content_index": piece.content_index(content_index)}
            out.append(self._same_or_new(incoming, {**event, **changes}))
            return
        if segments != [Text(delta)] and delta:
            source.altered = True
        self._place(source, content_index, segments, out, incoming)

    def _on_text_done(self, source: SourceItem, incoming: Outgoing, out: list[Outgoing]) -> None:
        content_index = incoming.event.get("content_index")
        self._finish_lexer(source, content_index, out)
        piece = source.piece
        if piece is not None and content_index in piece.text_open:
            if source.altered:
                self._close_text(piece, content_index, out)
            else:
                piece.text_open.discard(content_index)
                out.append(self._retarget(incoming))

    def _on_part_done(self, source: SourceItem, incoming: Outgoing, out: list[Outgoing]) -> None:
        content_index = incoming.event.get("content_index")
        self._finish_lexer(source, content_index, out)
        piece = source.piece
        if piece is None or content_index not in piece.part_open:
            return  # the part went into pieces already done
        part = incoming.event.get("part")
        if isinstance(part, dict) and part.get("type") != PART_TYPE[source.kind]:
            piece.parts[content_index] = part  # a part we do not read: upstream's final version
            piece.texts.pop(content_index, None)
        if source.altered or piece.id != source.id:
            self._close_part(piece, content_index, out)
        else:
            piece.part_open.discard(content_index)
            piece.text_open.discard(content_index)
            out.append(self._retarget(incoming))

    def _lexer(self, source: SourceItem, content_index: int) -> Lexer:
        lexer = source.lexers.get(content_index)
        if lexer is None:
            # upstream that sends reasoning items splits reasoning itself: no pre-opened block
            upstream_reasoning = any(s.kind == REASONING for s in self._sources.values())
            lexer = source.lexers[content_index] = self._dialects.new_lexer(
                reasoning=source.kind == REASONING, preopened=not upstream_reasoning
            )
        return lexer

    def _finish_lexer(self, source: SourceItem, content_index: Any, out: list[Outgoing], status: str | None = None) -> None:
        """The part's text is over: what its lexer held is released; a call still open is
        closed with `status` ("incomplete" when upstream was cut off), or, when the status is
        not known yet (the part ended, its item not yet), at the item's end with the item's."""
        lexer = source.lexers.pop(content_index, None)
        if lexer is not None:
            segments = lexer.finish()
            if segments:
                source.altered = True
                self._closing_status = status
                self._place(source, content_index, segments, out, None)
                self._closing_status = "completed"

    def _finish_lexers(self, out: list[Outgoing], only: SourceItem | None = None, status: str = "completed") -> None:
        for source in [only] if only is not None else list(self._sources.values()):
            for content_index in list(source.lexers):
                self._finish_lexer(source, content_index, out, status)
            for call in source.unended:
                self._end_call(call, out, status)
            source.unended.clear()

    def _place(self, source: SourceItem, content_index: int, segments: list[Segment], out: list[Outgoing], incoming: Outgoing | None) -> None:
        """Segments of one part's text, from the delta `incoming` (None: from the lexer's end)."""
        for seg in segments:
            if type(seg) is Text:
                self._text(source, content_index, seg.text, out, incoming)
            elif type(seg) is CallBegin:
                self._begin_call(source, content_index, seg, out)
            elif type(seg) is CallArgs:
                call = self._calls[(source.id, content_index)]
                call.arguments.append(seg.text)
                out.append(self._new(arguments_delta(call, seg.text)))
            elif type(seg) is CallEnd:
                self._end_call(self._calls.pop((source.id, content_index)), out)
            elif type(seg) is ReasoningEnd:
                source.reasoning_over.add(content_index)
            elif type(seg) is ReasoningText:
                self.stats.reasoning_moved += len(seg.text)
                self._text(source, content_index, seg.text, out, None, kind=REASONING)

    def _text(
        self, source: SourceItem, content_index: int, text: str, out: list[Outgoing], incoming: Outgoing | None, kind: str | None = None
    ) -> None:
        if not text:
            return
        if kind is None:
            kind = MESSAGE if content_index in source.reasoning_over else source.kind
        own = kind == source.kind
        piece, key = (source.piece, content_index) if own else (source.other_piece, 0)
        other = source.other_piece if own else source.piece
        if other is not None and other.announced:
            # reasoning and content of one item alternate: one item at a time on the wire
            self._close_piece(source, other, out)
            if own:
                source.other_piece = None
            else:
                source.piece = None
        if piece is None:
            piece = self._new_piece(source, kind)
        if not piece.announced:
            self._announce(source, piece, out)
        if key not in piece.part_open:
            self._open_part(source, piece, key, out)
        piece.add_text(key, text)
        position = {"item_id": piece.id, "output_index": piece.index, "content_index": piece.content_index(key)}
        if incoming is not None and own and text == incoming.event["delta"]:
            out.append(self._same_or_new(incoming, {**incoming.event, **position}))  # as it came
            return
        delta = {
            "type": TEXT_DELTA[kind],
            "item_id": piece.id,
            "output_index": piece.index,
            "content_index": piece.content_index(key),
            "delta": text,
        }
        if kind == MESSAGE:
            delta["logprobs"] = []  # upstream's logprobs belong to the text as it came
        out.append(self._new(delta))

    def _open_part(self, source: SourceItem, piece: PieceItem, key: int, out: list[Outgoing]) -> None:
        upstream = source.part_added.get(key) if piece.kind == source.kind else None
        template = upstream.event["part"] if upstream is not None else default_part(piece.kind)
        reads_text = template.get("type") == PART_TYPE[piece.kind]
        part = {**template, "text": ""} if reads_text else dict(template)
        piece.parts[key] = part
        piece.part_open.add(key)
        if reads_text:
            piece.text_open.add(key)
            piece.texts[key] = TextPieces()
        event = {
            "type": upstream.event["type"] if upstream is not None else "response.content_part.added",
            "item_id": piece.id,
            "output_index": piece.index,
            "content_index": piece.content_index(key),
            "part": dict(part),
        }
        piece.part_events[key] = event["type"].removesuffix(".added")
        out.append(self._same_or_new(upstream, {**upstream.event, **event}) if upstream is not None else self._new(event))

    def _close_text(self, piece: PieceItem, key: int, out: list[Outgoing]) -> None:
        piece.text_open.discard(key)
        done = {
            "type": TEXT_DONE[piece.kind],
            "item_id": piece.id,
            "output_index": piece.index,
            "content_index": piece.content_index(key),
            "text": piece.text(key),
        }
        if piece.kind == MESSAGE:
            done["logprobs"] = []
        out.append(self._new(done))

    def _close_part(self, piece: PieceItem, key: int, out: list[Outgoing]) -> None:
        if key in piece.text_open:
            self._close_text(piece, key, out)
        piece.part_open.discard(key)
        out.append(self._new({
            "type": piece.part_events.get(key, "response.content_part") + ".done",
            "item_id": piece.id,
            "output_index": piece.index,
            "content_index": piece.content_index(key),
            "part": piece.part(key),
        }))

    # -- calls -----------------------------------------------------------------------------------

    def _begin_call(self, source: SourceItem, content_index: int, begin: CallBegin, out: list[Outgoing]) -> None:
        # A call's item stands alone: text items open now are done, and go on as new pieces.
        for other in self._sources.values():
            for piece in (other.piece, other.other_piece):
                if piece is not None and piece.announced:
                    other.altered = True
                    self._close_piece(other, piece, out)
                    if piece is other.piece:
                        other.piece = None
                    else:
                        other.other_piece = None
        item = {
            "id": random_id("fc_"),
            "type": FUNCTION_CALL,
            "status": "in_progress",
            "call_id": begin.id,
            "name": begin.name,
            "arguments": "",
        }
        call = self._calls[(source.id, content_index)] = OpenCall(item, self._next_index, source)
        self._next_index += 1
        out.append(self._new({"type": "response.output_item.added", "output_index": call.index, "item": dict(item)}))

    def _end_call(self, call: OpenCall, out: list[Outgoing], status: str | None = None) -> None:
        status = status or self._closing_status
        if status is None:  # cut off by its text's end: done when its item says how it ended
            call.source.unended.append(call)
            return
        item = {**call.item, "status": status, "arguments": call.arguments.text()}
        out.append(self._new({
            "type": "response.function_call_arguments.done",
            "item_id": item["id"],
            "output_index": call.index,
            "name": item["name"],
            "arguments": item["arguments"],
        }))
        out.append(self._new({"type": "response.output_item.done", "output_index": call.index, "item": item}))
        self._done_items.append((call.index, item))
        call.source.produced.append(item)

    # -- upstream's own calls --------------------------------------------------------------------

    def _native_of(self, event: dict[str, Any]) -> NativeCall | None:
        """The native call an event names: by `item_id`, else by `output_index`."""
        item_id = event.get("item_id")
        if isinstance(item_id, str):
            return self._natives_by_id.get(item_id)
        index = event.get("output_index")
        return self._natives.get(index) if type(index) is int else None

    def _start_native(self, incoming: Outgoing, upstream_index: int) -> Outgoing:
        """A function_call item of upstream's is announced: its arguments will be typed by its
        tool's schema (by none when the tool has no properties: `null` still becomes `{}`)."""
        item = incoming.event["item"]
        repairs = self.stats.stream_repairs
        spec = self._dialects.scope.tools.get(item["name"]) if isinstance(item.get("name"), str) else None
        typing = ArgumentTyping.for_tool(spec, repairs)
        item_id, call_id = item.get("id"), item.get("call_id")
        call = NativeCall(upstream_index, item_id if isinstance(item_id, str) else None, call_id if isinstance(call_id, str) else None, typing)
        self._natives[upstream_index] = call
        if call.id is not None:
            self._natives_by_id[call.id] = call
        given = item.get("arguments")
        if given is None or given == "":
            return incoming
        piece = self._native_piece(call, given)
        if piece is None:
            return incoming
        typed = self._native_feed(call, piece)
        return incoming if typed == given else Outgoing({**incoming.event, "item": {**item, "arguments": typed}}, incoming.name)

    def _on_native_arguments(self, call: NativeCall, incoming: Outgoing, out: list[Outgoing]) -> None:
        event = incoming.event
        if event["type"] == ARGUMENTS_DELTA:
            delta = event.get("delta")
            piece = None if call.settled else self._native_piece(call, delta)
            if piece is not None:
                typed = self._native_feed(call, piece)
                if typed != delta:
                    incoming = Outgoing({**event, "delta": typed}, incoming.name)
            out.append(self._retarget(incoming))
            return
        given = event.get("arguments")
        self._settle_native(call, given, "arguments" in event, out)
        if "arguments" in event:
            arguments = self._native_copy(call, given)
            if arguments is not given:
                incoming = Outgoing({**event, "arguments": arguments}, incoming.name)
        out.append(self._retarget(incoming))

    def _native_piece(self, call: NativeCall, value: Any) -> str | None:
        """Upstream's arguments (or a piece of them) as text; None, noted, when they are no text
        and no JSON object or array."""
        if isinstance(value, str):
            return value
        if isinstance(value, (dict, list)):
            if not call.object_counted:
                call.object_counted = True
                self.stats.stream_repairs[OBJECT_ARGUMENTS] += 1
            return json.dumps(value, ensure_ascii=False)
        self._note_native(call, f"arguments of type {type(value).__name__}")
        return None

    def _native_feed(self, call: NativeCall, piece: str) -> str:
        call.streamed = True
        call.received.append(piece)
        typed = call.typing.feed(piece) if call.typing is not None else piece
        call.sent.append(typed)
        if typed.strip(_JSON_WHITESPACE):
            call.visible = True
        return typed

    def _settle_native(self, call: NativeCall, given: Any, known: bool, out: list[Outgoing]) -> None:
        """The call's arguments are over (`given`: upstream's first full copy, when `known`):
        what typing held goes out as one more delta, and what the client got is known. A call
        that streamed no pieces waits for a copy, and gets a delta only when its arguments
        change (its deltas then agree with the copies)."""
        if call.settled or not (call.streamed or known):
            return
        call.settled = True
        typing, call.typing = call.typing, None
        assert typing is not None  # set until settled
        if call.streamed:
            call.baseline = call.received.text()
            tail = typing.finish()
            empty = typing.null or not call.visible and not tail.strip(_JSON_WHITESPACE)
            if empty:
                tail = "{}"
            call.sent.append(tail)
            resolved = call.sent.text()
        else:
            text = "" if given is None else self._native_piece(call, given)
            if text is None:
                return  # left as upstream sent it (noted)
            call.baseline = text
            typed = typing.whole(text)
            empty = typed is None
            resolved = "{}" if typed is None else typed
            tail = resolved if resolved != text or call.object_counted else ""
        if empty:
            self.stats.stream_repairs[EMPTY_ARGUMENTS] += 1
        if tail:
            delta = {"type": ARGUMENTS_DELTA, "item_id": call.id, "output_index": call.index, "delta": tail}
            out.append(self._retarget(self._new({k: v for k, v in delta.items() if v is not None})))
        call.resolved = resolved

    def _native_copy(self, call: NativeCall, given: Any) -> Any:
        """A full copy of a settled call's arguments, as the client is to get it."""
        if call.resolved is None or isinstance(given, str) and (given == call.resolved or not call.repaired):
            return given
        baseline = call.baseline
        if given == baseline or given is None and baseline == "" or _same_json(given, baseline):
            if not isinstance(given, str) and given is not None and not call.object_counted:
                call.object_counted = True
                self.stats.stream_repairs[OBJECT_ARGUMENTS] += 1
            return call.resolved
        self._note_native(call, "a copy of its arguments disagrees with the pieces streamed")
        return given

    def _listed_arguments(self, call: NativeCall, listed: Any) -> tuple[Any, bool]:
        """The call's arguments in the terminal event's list, and whether it lists them."""
        for item in listed if isinstance(listed, list) else ():
            if isinstance(item, dict) and item.get("type") == FUNCTION_CALL and "arguments" in item and self._native_of_item(item) is call:
                return item["arguments"], True
        return None, False

    def _native_of_item(self, item: dict[str, Any]) -> NativeCall | None:
        item_id, call_id = item.get("id"), item.get("call_id")
        if isinstance(item_id, str) and item_id in self._natives_by_id:
            return self._natives_by_id[item_id]
        if isinstance(call_id, str):  # an upstream that mints new item ids for its terminal list
            return next((call for call in self._natives.values() if call.call_id == call_id), None)
        return None

    def _typed_native_items(self, items: list[Any]) -> list[Any] | None:
        """`items` with the arguments of upstream's repaired calls as sent; None: none changed."""
        typed, changed = [], False
        for item in items:
            call = self._native_of_item(item) if isinstance(item, dict) and item.get("type") == FUNCTION_CALL and "arguments" in item else None
            if call is not None and call.settled:
                arguments = self._native_copy(call, item["arguments"])
                if arguments is not item["arguments"]:
                    item, changed = {**item, "arguments": arguments}, True
            typed.append(item)
        return typed if changed else None

    def _note_native(self, call: NativeCall, detail: str) -> None:
        """Upstream's call is left as it came: one log line (the addon logs the notes)."""
        if not call.noted and len(self.stats.notes) < MAX_NOTES:
            self.stats.notes.append(f"upstream function_call {call.id or call.call_id}: {detail}; passed on as it came")
        call.noted = True

    # -- the terminal event ----------------------------------------------------------------------

    def _on_terminal(self, incoming: Outgoing, out: list[Outgoing]) -> None:
        self._finish_lexers(out, status="completed" if incoming.event["type"] == "response.completed" else "incomplete")
        self._terminal_seen = True
        event = incoming.event
        response = event["response"]
        listed = response.get("output")
        for call in self._natives.values():
            self._settle_native(call, *self._listed_arguments(call, listed), out)
        if self._required_action and self.stats.calls and event["type"] == "response.completed":
            out.append(self._new(self._required_action_event(response)))
        output = self._final_output(listed)
        if self._natives and isinstance(listed, list):
            output = self._typed_native_items(listed if output is None else output) or output
        if output is None:
            out.append(self._retarget(incoming))
        else:
            out.append(self._same_or_new(incoming, {**event, "response": {**response, "output": output}}))

    def _final_output(self, upstream: Any) -> list[Any] | None:
        """`response.output` as the client was sent it, or None to leave upstream's as it is.

        When items were streamed one by one, they are the truth: the done items in the order we
        announced them. Upstream's list is not matched item by item, because upstreams rebuild
        it with fresh ids (vLLM mints new `msg_`/`rs_` ids for `response.completed`). When
        nothing was changed, upstream's list stays, byte for byte.
        """
        if not isinstance(upstream, list):
            return None
        if not self._sources and not self._index_map:  # nothing streamed item by item
            return rewrite_output_items(upstream, self._dialects) if upstream else None
        if not self._changed():
            return None
        return self.done_items()

    def _changed(self) -> bool:
        """Did the items sent differ from upstream's (cut, dropped, added or renumbered)?"""
        if self.stats.calls or any(source.altered or not source.produced for source in self._sources.values()):
            return True
        return any(index != upstream for upstream, index in self._index_map.items())

    def _required_action_event(self, response: dict[str, Any]) -> dict[str, Any]:
        """Seed 004's `response.required_action` (not an OpenAI event; off by default)."""
        calls = [item for item in self.done_items() if item.get("type") == FUNCTION_CALL]
        return {
            "type": "response.required_action",
            "response": {k: response.get(k) for k in ("id", "object", "created_at", "model")} | {"status": "incomplete"},
            "required_action": {
                "type": "submit_tool_outputs",
                "submit_tool_outputs": {
                    "tool_calls": [
                        {"id": c["call_id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                        for c in calls
                    ]
                },
            },
        }

    # -- numbering -------------------------------------------------------------------------------

    def _retarget(self, incoming: Outgoing) -> Outgoing:
        """An event we do not rewrite: its output_index, item_id and content_index follow ours."""
        event = incoming.event
        upstream_index = event.get("output_index")
        if type(upstream_index) is not int:
            return incoming
        source = self._sources.get(upstream_index)
        if source is None:
            return self._same_or_new(incoming, {**event, "output_index": self._index_map.get(upstream_index, upstream_index)})
        piece = source.piece if source.piece is not None else source.other_piece
        if piece is None or not piece.announced:
            return incoming  # nothing of ours to point at: leave it as it came
        changes: dict[str, Any] = {"output_index": piece.index}
        if "item_id" in event:
            changes["item_id"] = piece.id
        if type(event.get("content_index")) is int and event["content_index"] in piece.parts:
            changes["content_index"] = piece.content_index(event["content_index"])
        if event.get("type") == "response.output_item.done" and isinstance(event.get("item"), dict):
            changes["item"] = {**event["item"], "id": piece.id}
        return self._same_or_new(incoming, {**event, **changes})

    @staticmethod
    def _same_or_new(incoming: Outgoing, event: dict[str, Any]) -> Outgoing:
        """`event` replaces `incoming`; its raw bytes stay valid when nothing changed."""
        return Outgoing(event, incoming.name, incoming.raw if event == incoming.event else None)

    @staticmethod
    def _new(event: dict[str, Any]) -> Outgoing:
        return Outgoing(event, event["type"])

    def _numbered(self, outgoing: Outgoing) -> Outgoing:
        seq = self._seq
        self._seq += 1
        if outgoing.event.get("sequence_number") != seq:
            outgoing.event = {**outgoing.event, "sequence_number": seq}
            outgoing.raw = None
        return outgoing


def _same_json(given: Any, text: str | None) -> bool:
    """Does `given` (text or a parsed value) hold the same JSON value as `text`?"""
    if text is None:
        return False
    try:
        value = orjson.loads(given) if isinstance(given, str) else given
        return value == orjson.loads(text)
    except ValueError:
        return False


def arguments_delta(call: OpenCall, text: str) -> dict[str, Any]:
    """A piece of a call's arguments, as sent (before its sequence_number)."""
    return {"type": "response.function_call_arguments.delta", "item_id": call.item["id"], "output_index": call.index, "delta": text}


def rewrite_output_items(items: list[Any], dialects: ScopeLexers) -> list[Any]:
    """Rewrite finished output items whose text was not streamed (a non-streaming body, or a
    terminal event listing items never announced): the same rules, on the items whole."""
    rewriter = ResponsesRewriter(dialects.scope.context, dialects.scope.stats, dialects=dialects)
    for index, item in enumerate(items):
        if isinstance(item, dict):
            for event in item_as_events(item, index):
                rewriter.on_event(event)
    rewriter.finish()
    return rewriter.done_items()


def item_as_events(item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    """The events that would have streamed a finished item, each text part in one delta."""
    kind = item.get("type")
    if kind not in TEXT_ITEM_TYPES or not isinstance(item.get("id"), str):
        return [
            {"type": "response.output_item.added", "output_index": index, "item": item},
            {"type": "response.output_item.done", "output_index": index, "item": item},
        ]
    content = item.get("content") if isinstance(item.get("content"), list) else []
    events: list[dict[str, Any]] = [
        {"type": "response.output_item.added", "output_index": index, "item": {**item, "content": []}}
    ]
    for content_index, part in enumerate(content):
        common = {"item_id": item["id"], "output_index": index, "content_index": content_index}
        text = part.get("text") if isinstance(part, dict) else None
        if not isinstance(part, dict) or part.get("type") != PART_TYPE[kind] or not isinstance(text, str):
            events.append({"type": "response.content_part.added", **common, "part": part})
            events.append({"type": "response.content_part.done", **common, "part": part})
            continue
        events.append({"type": "response.content_part.added", **common, "part": {**part, "text": ""}})
        events.append({"type": TEXT_DELTA[kind], **common, "delta": text})
        events.append({"type": TEXT_DONE[kind], **common, "text": text})
        events.append({"type": "response.content_part.done", **common, "part": part})
    events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    return events


def rewrite_response_body(
    body: dict[str, Any], context: RequestContext, *, max_held: int = 1 << 20, stats: RewriteStats | None = None
) -> RewriteStats | None:
    """Rewrite a non-streaming Responses body in place; None when nothing changed.
    `stats`, when given, records what was found even if nothing changed (a strict failure)."""
    output = body.get("output")
    if body.get("object") != "response" or not isinstance(output, list):
        return None
    stats = stats if stats is not None else RewriteStats()
    dialects = ScopeLexers(CallScope(context, stats), max_held=max_held)
    rewritten = rewrite_output_items(output, dialects)
    if rewritten == output:
        return None
    body["output"] = rewritten
    return stats


class NumberedFrame:
    """The bytes of a Responses event around its one string that changes from event to event
    (`delta`) and its `sequence_number`: `head + body + mid + digits + tail`, or `head + digits +
    mid + body + tail` (the keys' order is upstream's). The lanes split an event by it (inline:
    the fewest calls), decode the string with its quotes (one JSON string or an error) and check
    the digits."""

    __slots__ = ("head", "mid", "tail", "number_first", "fixed", "carries_fields")

    def __init__(self, head: bytes, mid: bytes, tail: bytes, number_first: bool) -> None:
        self.head, self.mid, self.tail, self.number_first = head, mid, tail, number_first
        self.fixed = len(head) + len(mid) + len(tail)
        # `id:` or `retry:` lines: an event we send in place of one of this frame must carry them
        self.carries_fields = _CARRIED_FIELD.search(head) is not None

    @classmethod
    def of(cls, raw: bytes) -> NumberedFrame | None:
        strings = string_spans(raw, ("delta",))
        numbers = [m.span(1) for m in _SEQUENCE_NUMBER.finditer(raw)]
        if strings is None or len(numbers) != 1:
            return None
        (s0, s1), (n0, n1) = strings[0], numbers[0]
        if s1 < n0:
            return cls(raw[:s0], raw[s1:n0], raw[n1:], number_first=False)
        if n1 < s0:
            return cls(raw[:n0], raw[n1:s0], raw[s1:], number_first=True)
        return None

    def probe(self, body: bytes, digits: bytes) -> bytes:
        if self.number_first:
            return self.head + digits + self.mid + body + self.tail
        return self.head + body + self.mid + digits + self.tail


# Deltas whose text a client appends to what came before.
_GROWING = frozenset((*TEXT_DELTA.values(), "response.function_call_arguments.delta", "response.reasoning_summary_text.delta", "response.refusal.delta"))
_SEQUENCE_NUMBER = re.compile(rb'"sequence_number"\s*:\s*(\d+)')
_SENTINEL_NUMBER = 1234567890123


class QuietLane:
    """Plain text deltas into a part whose lexer is idle (`passes_plain_delta`), from their
    bytes: `quiet_read(rewriter, raw)` passes `raw` as it came (its number taken), or answers
    None (nothing done: the full path reads it); `quiet_direct`, the same straight from `feed`.
    The text is kept lazily: the string bodies as they came, one JSON string body together (each
    is one whole, checked), decoded into the part's text at once by `flush`, before anything
    else reads or adds to it.

    The lane holds the frame's bytes as the readers use them; the readers are functions of the
    module, called with the rewriter, whose `_quiet` the lane is. (Closures made for each lane
    cost a flow a cell for each value they hold: each an object the garbage collector counts
    while the flow lives, and a cache line each read touches.)"""

    __slots__ = ("bodies", "_texts", "numbered", "head", "tail", "head_size", "tail_size", "number_first")

    def __init__(self, frame: NumberedFrame, texts: TextPieces) -> None:
        self.bodies = bytearray()
        self._texts = texts
        self.head, self.tail, self.number_first = frame.head, frame.tail, frame.number_first
        self.head_size, self.tail_size = len(frame.head), len(frame.tail)
        # The frame's bytes on the number's side of the text, the number put in: the event is the
        # frame around its text and the number expected, compared in one call each side.
        before, after = (frame.head, frame.mid) if frame.number_first else (frame.mid, frame.tail)
        self.numbered = before.replace(b"%", b"%%") + b"%d" + after.replace(b"%", b"%%")

    def flush(self) -> None:
        if self.bodies:
            self._texts.append(orjson.loads(b'"' + self.bodies + b'"'))
            self.bodies.clear()


# Bytes that make a string body more than printable ASCII without markup: a quote, a
# backslash (an escape), a control character, a `<`, a `[`, DEL and anything not ASCII. A body
# without them is one valid JSON string body by itself, and no marker starts in it.
_UNUSUAL = re.compile(rb'[\x00-\x1f"<\[\\\x7f-\xff]')
_unusual = _UNUSUAL.search
_loads = orjson.loads  # (the readers' one global lookup, as chat.py's)


def _quiet_reader(checks_echo: bool) -> Direct:
    """What `passes_plain_delta` does to an event of the rewriter's `_quiet` lane's frame.
    `checks_echo`: the lane taken straight from `feed`, refused while the echo check holds
    anything. Made twice, when the module loads: `quiet_read` and `quiet_direct`."""

    def read(rewriter: ResponsesStreamRewriter, raw: bytes) -> list[bytes] | None:
        if checks_echo and ((echo := rewriter._echo)._unsent or echo._assembly is not None):
            return None
        lane, core = rewriter._quiet, rewriter._core
        expected = lane.numbered % core._seq
        size = len(raw)  # (slices, not `startswith` and `endswith`: see sse.py)
        if lane.number_first:
            start, end = len(expected), size - lane.tail_size
            if raw[:start] != expected or raw[end:] != lane.tail:
                return None
        else:
            start, end = lane.head_size, size - len(expected)
            if raw[:start] != lane.head or raw[end:] != expected:
                return None
        if end < start:
            return None
        body = raw[start:end]
        if _unusual(body) is not None:
            # What `markup_may_start` looks for: a `<`, a `[`, a `\u003.` escape; then the body
            # must be one JSON string (a quote, a line end, a bad escape fail the decoding).
            if 60 in body or 91 in body or 10 in body or (92 in body and body.find(b"\\u003") >= 0):
                return None
            try:
                _loads(raw[start - 1 : end + 1])
            except orjson.JSONDecodeError:
                return None
        lane.bodies += body
        core._seq += 1
        return [raw]

    return read


quiet_read, quiet_direct = _quiet_reader(False), _quiet_reader(True)


@dataclass(slots=True)
class Rendered:
    """An event we send, rendered by the full path's own rules around its text and its number."""

    head: bytes
    mid: bytes
    tail: bytes
    number_first: bool

    @classmethod
    def of(cls, encoded: bytes) -> Rendered | None:
        number = b"%d" % _SENTINEL_NUMBER
        if encoded.count(b"\\u0000") != 1 or encoded.count(number) != 1:
            return None
        text_at, number_at = encoded.index(b"\\u0000"), encoded.index(number)
        if text_at < number_at:
            return cls(encoded[:text_at], encoded[text_at + 6 : number_at], encoded[number_at + len(number) :], False)
        return cls(encoded[:number_at], encoded[number_at + len(number) : text_at], encoded[text_at + 6 :], True)

    def event(self, body: bytes, seq: int) -> bytes:
        if self.number_first:
            return self.head + b"%d" % seq + self.mid + body + self.tail
        return self.head + body + self.mid + b"%d" % seq + self.tail


class TextLane:
    """Text deltas of one part whose lexer is read (`ArgsLane` in chat.py, for Responses): the
    part's lexer holds markup, or its text goes to an item of ours (cut by a call before): held
    text sends nothing; a piece of a live call's arguments one delta event (`args`); text as it
    came the same delta, renumbered (`text`). Read by `held_read` (or `held_read_runs`, whose
    `run` takes a read's events that add to a block the leaf holds whole), called with the
    rewriter, whose `_held` the lane is (see `QuietLane` for why functions of the module)."""

    __slots__ = (
        "frame", "source", "key", "lexer", "leaf", "path", "finished", "quiet", "call", "args", "piece", "text",
        "head", "mid", "tail", "number_first", "fixed", "head_size", "mid_size", "tail_size", "steady", "stop", "verbatim", "live", "holder",
        "bare_tail", "bare_tail_size",
    )  # fmt: skip

    def __init__(self, frame: NumberedFrame, source: SourceItem, key: int, lexer: Lexer, leaf: Lexer, path: list[Lexer], finished: bool) -> None:
        self.frame, self.source, self.key, self.lexer, self.leaf, self.path = frame, source, key, lexer, leaf, path
        self.finished = finished  # the lexers around the leaf were finished last (see chat.ArgsLane)
        # The part's lexer is idle and its text goes out renumbered (`text`): text in which no
        # marker can start goes out without it. Set where the lane is armed, and after the lane
        # feeds the lexer (False where it may no longer be idle: always safe).
        self.quiet = False
        self.call: OpenCall | None = None  # the call open in this part, if any
        self.args: Rendered | None = None
        self.piece: PieceItem | None = None  # where text as it came goes, renumbered
        self.text: Rendered | None = None
        # (What the readers read of the frame per event, one lookup each)
        self.head, self.mid, self.tail, self.number_first, self.fixed = frame.head, frame.mid, frame.tail, frame.number_first, frame.fixed
        self.head_size, self.mid_size, self.tail_size = len(frame.head), len(frame.mid), len(frame.tail)
        # The leaf's steady pieces, taken without the segments `feed` would make of
        # them (`Lexer.steady_piece`; not a chain's), and whether arguments made go out (`live`:
        # set by `ready`, once `args` is).
        self.steady = getattr(type(leaf), "steady_piece", None)  # (the class's function: see chat.ArgsLane)
        self.live = False
        # The leaf in its verbatim state (`Lexer.steady_piece`, as chat.ArgsLane keeps it).
        self.stop = getattr(type(leaf), "verbatim_stop", None) if self.steady is not None else None
        self.verbatim = False
        # A chain's first stage holding a block makes nothing for its second to read: it takes the run.
        self.holder = leaf.first if type(leaf) is ChainLexer else leaf
        self.bare_tail = frame.tail[:-2]  # (the events of a read split at their blank lines)
        self.bare_tail_size = len(self.bare_tail)

    def ready(self) -> Direct:
        """The reader of the lane, its `call`, `args`, `piece` and `text` set: `held_read_runs`
        when its events may add to a block the leaf holds whole (a run of them taken at once)."""
        self.live = self.finished and self.args is not None
        holder = self.holder
        if self.steady is not None or not hasattr(holder, "held_bulk") or not hasattr(holder, "holds_block") or not self.tail.endswith(b"\n\n"):
            return held_read
        return held_read_runs


def held_read(rewriter: ResponsesStreamRewriter, raw: bytes) -> list[bytes] | None:
    """What the full path does to a text delta of the rewriter's `_held` lane's frame, from its
    bytes: the events to send, or None (nothing done: the full path reads it)."""
    # (Slices, `partition` and `in`, not `startswith`, `find` and the like: see sse.py.)
    lane = rewriter._held
    size = len(raw)
    head_size, tail_size = lane.head_size, lane.tail_size
    if size < lane.fixed or raw[:head_size] != lane.head or raw[size - tail_size :] != lane.tail:
        return None
    # The string's body and the number, `mid` between them (the first `mid` after the
    # number, the last before it: a string body holds none, its quotes escaped).
    if lane.number_first:
        digits, found, string = raw[head_size : size - tail_size].partition(lane.mid)
        start = head_size + len(digits) + lane.mid_size
    else:
        string, found, digits = raw[head_size : size - tail_size].rpartition(lane.mid)
        start = head_size
    end = start + len(string)
    leaf = lane.leaf
    # (the number is ours to set, but it must be a JSON number as it stands: no sign, no
    # leading zero)
    if not found or not digits.isdigit() or (digits[0] == 48 and len(digits) > 1) or (lane.text is None and leaf.idle):
        return None
    if 10 in string:
        return None  # several events: no one string (told without the decoder's costly error)
    try:
        text = _loads(raw[start - 1 : end + 1])
    except orjson.JSONDecodeError:
        return None
    if not text:
        return None
    core = rewriter._core
    if lane.quiet and not markup_may_start(raw[start - 1 : end + 1]):
        # `passes_plain_delta`'s case where the numbering is ours: the lexer, idle, would
        # give back text in which no marker can start as it came (prose after a call).
        # (The string with its quotes: a bracket marker begun at its end is told by the quote.)
        lane.piece.add_text(lane.key, text)
        seq = core._seq
        core._seq = seq + 1
        body = string if 92 not in string else orjson.dumps(text)[1:-1]
        return [lane.text.event(body, seq)]
    if lane.verbatim and lane.stop not in text and not text[-1].isspace():
        made = text  # (what the leaf's `steady_piece` makes of it: no call)
    elif (steady := lane.steady) is None or (made := steady(leaf, text, lane.live)) is None:
        made = None
    else:
        lane.verbatim = lane.stop is not None and made != "" and not text[-1].isspace()
    if made is not None:
        # The commonest event of a tool-call stream: a piece of a call's arguments, held or sent.
        lane.quiet = False  # (as after any piece the lexer reads)
        lane.source.altered = True
        if not made:
            return []
        lane.call.arguments.append(made)
        seq = core._seq
        core._seq = seq + 1
        body = string if made == text and 92 not in string else orjson.dumps(made)[1:-1]
        return [lane.args.event(body, seq)]
    lane.verbatim = False  # (the leaf is fed: its state is no longer known)
    segments = leaf.feed(text)
    lane.quiet = False
    if not segments:
        lane.source.altered = True
        if lane.text is None and leaf.idle:  # the next deltas may pass as they came: the full path decides
            rewriter._held = rewriter._direct = None
        return []
    if len(segments) == 1:
        kind = type(segments[0])
        if kind is CallArgs and lane.finished and lane.args is not None:
            piece = segments[0].text
            lane.call.arguments.append(piece)
            lane.source.altered = True
            seq = core._seq
            core._seq = seq + 1
            body = string if piece == text and 92 not in string else orjson.dumps(piece)[1:-1]
            return [lane.args.event(body, seq)]
        if kind is Text and lane.text is not None and segments[0].text == text:
            lane.quiet = lane.lexer.idle
            lane.piece.add_text(lane.key, text)
            seq = core._seq
            core._seq = seq + 1
            body = string if 92 not in string else orjson.dumps(text)[1:-1]
            return [lane.text.event(body, seq)]
    # Anything else: what the lexers around the leaf make of it, then the full path.
    event, block = read_event(raw)
    rewriter._last_type = event["type"]
    return rewriter._read_in_full(raw, event, block.event, unwind(lane.path, segments))


def _held_run(rewriter: ResponsesStreamRewriter, events: list[bytes], first: int) -> int:
    """`SseRewriter._feed_read`'s events from `first` (split at their blank lines) that add to
    the block the rewriter's `_held` lane's leaf holds, taken at once: their texts fed as one
    (the lexers read text the same however it is cut), none sent. How many: 0, none
    (`held_read` takes the next); -n, none of the next n (looked at, no run: it takes each)."""
    lane = rewriter._held
    holder = lane.holder
    if lane.quiet or not holder.holds_block():  # (quiet: the part's lexer is idle, it holds nothing)
        return 0
    head, head_size, mid, bare_tail, bare_tail_size, number_first = lane.head, lane.head_size, lane.mid, lane.bare_tail, lane.bare_tail_size, lane.number_first
    bodies = []
    for raw in events[first:]:
        # `held_read`'s checks, but the text's: one JSON string each is checked below, and one
        # with a `<` (a tag may begin) ends the run
        stop = len(raw) - bare_tail_size
        if raw[:head_size] != head or raw[stop:] != bare_tail:
            break
        if number_first:  # (head and tail overlapping: nothing between them, no `mid`)
            digits, found, body = raw[head_size:stop].partition(mid)
        else:
            body, found, digits = raw[head_size:stop].rpartition(mid)
        if not found or not digits.isdigit() or (digits[0] == 48 and len(digits) > 1) or 60 in body or not body:
            break
        bodies.append(body)
    if len(bodies) < 2:
        return 0
    texts = each_string(bodies)
    if texts is None or not holder.held_bulk("".join(texts)):  # (no string alone, a `<` escaped, the cap: nothing taken)
        return -len(bodies)
    return len(bodies)  # (the piece that opened the block marked its item altered)


# `held_read` under a second name, with a `run`: `_feed_read` picks its loop by the lane's `run`,
# so a lane that takes no runs is not offered them at all (as chat.py's `_held_read`).
held_read_runs = FunctionType(held_read.__code__, held_read.__globals__, "held_read_runs", held_read.__defaults__, held_read.__closure__)
held_read_runs.run = _held_run  # type: ignore[attr-defined]


class ResponsesStreamRewriter(SseRewriter):
    """A Responses API SSE body in (any byte pieces), the repaired SSE body out."""

    def __init__(self, context: RequestContext, *, max_held: int = 1 << 20, required_action: bool = False) -> None:
        super().__init__()
        self._core = ResponsesRewriter(context, self.stats, max_held=max_held, required_action=required_action)
        self._named: bool | None = None  # does upstream send `event:` lines? then so do we
        self._last_type: str | None = None  # of the event being read
        # The lanes (stream.py): plain text deltas while their part's lexer is idle, text
        # deltas while it holds markup. Learned from an event read in full, dropped by the next.
        self._quiet: QuietLane | None = None
        self._held: TextLane | None = None
        self._held_read: Direct | None = None  # its reader (`TextLane.ready`)
        self._frame: NumberedFrame | None = None  # the last text delta frame found (`_frame_of`)
        self._quiet_run = 0

    def _on_block(self, raw: bytes) -> list[bytes]:
        if self._held is not None:
            out = self._held_read(self, raw)
            if out is not None:
                return out
        elif self._quiet is not None:
            if quiet_read(self, raw) is not None:
                return [raw]
            self._quiet.flush()  # the full path may add to the part's text
        self._last_type = None
        read = read_event(raw)
        if read is None:
            return [raw]
        event, block = read
        if self._named is None:
            self._named = block.event is not None
        self._last_type = event["type"]
        if not markup_may_start(raw) and self._core.passes_plain_delta(event):
            if self.lanes and self._quiet is None:
                self._quiet_run += 1
                if self._quiet_run in (2, 16):
                    self._learn_quiet(raw, event)
            return [raw]  # fast path: plain text, sent as it came
        return self._read_in_full(raw, event, block.event)

    def _read_in_full(self, raw: bytes, event: dict[str, Any], name: str | None, lexed: list[Segment] | None = None) -> list[bytes]:
        self._drop_lanes()
        self._quiet_run = 0
        core = self._core
        core.lexed, core.last_segments = lexed, None
        out = [self._encode(o) for o in core.on_event(event, raw, name)]
        core.lexed = None
        if core.last_segments is not None and self.lanes:
            self._arm(raw, event, name)
        return out

    def _drop_lanes(self) -> None:
        if self._quiet is not None:
            self._quiet.flush()
        self._quiet = self._held = self._direct = None

    def _at_end(self) -> list[bytes]:
        self._drop_lanes()
        return [self._encode(o) for o in self._core.finish()]

    def _may_send_later(self, raw: bytes) -> bool:
        # An item's and a part's `added` are held until their first text, then sent as they came.
        return self._last_type in _SENT_LATER

    def _encode(self, outgoing: Outgoing) -> bytes:
        if outgoing.raw is not None:
            return outgoing.raw
        return encode_event(orjson.dumps(outgoing.event), outgoing.name if self._named else None)

    _telltales = {"call": b"function_call"}

    @staticmethod
    def _assembled(raw: bytes) -> list[Contribution]:
        """What a client assembles from one event: the text of each part and the arguments of
        each call grow; every other event counts by its type and place, its last version (its
        `sequence_number` aside: numbering, not content). See `EchoCheck`."""
        event = parse_block(raw)
        if event.data is None:
            return []
        if event.malformed:
            return [(("raw",), raw.decode("latin-1"), True)]
        try:
            data = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            return [(("data",), event.data, True)]
        if not isinstance(data, dict):
            return [(("data",), event.data, True)]
        kind = data.get("type")
        item = data.get("item")
        # (a function call's events: upstream's hold `function_call`, see `_telltales`)
        call = "call" if isinstance(kind, str) and "function_call" in kind or isinstance(item, dict) and item.get("type") == FUNCTION_CALL else ""
        place = (kind, data.get("item_id"), data.get("output_index"), data.get("content_index"))
        if kind in _GROWING and isinstance(data.get("delta"), str):
            rest = {k: v for k, v in data.items() if k not in ("delta", "sequence_number")}
            return [((call or "grows", *place), data["delta"], True), ((call or "fields", *place), rest, False)]
        return [((call or "event", *place), {k: v for k, v in data.items() if k != "sequence_number"}, False)]

    # -- lanes -----------------------------------------------------------------------------------

    def _frame_of(self, raw: bytes, event: dict[str, Any]) -> NumberedFrame | None:
        """The frame of a text delta event, checked on a probe: it holds exactly this event but
        for its delta and its number. The last one found, when it holds this event too (the
        deltas of a part share it: a call's first and last events arm a lane each)."""
        frame = self._frame
        delta, seq = event.get("delta"), event.get("sequence_number")
        if frame is not None and isinstance(delta, str) and type(seq) is int and raw == frame.probe(orjson.dumps(delta)[1:-1], b"%d" % seq):
            return frame
        frame = NumberedFrame.of(raw)
        if frame is None:
            return None
        read = read_event(frame.probe(b"\\u0001", b"7"))
        if read is None or read[0] != {**event, "delta": "\x01", "sequence_number": 7}:
            return None
        self._frame = frame
        return frame

    def _learn_quiet(self, raw: bytes, event: dict[str, Any]) -> None:
        core = self._core
        source = core._sources.get(event.get("output_index"))
        key = event.get("content_index")
        if source is None or source.piece is None or type(key) is not int:
            return
        frame = self._frame_of(raw, event)
        texts = source.piece.texts.get(key)
        if frame is not None and texts is not None:
            self._quiet = QuietLane(frame, texts)
            self._direct = quiet_direct

    def _arm(self, raw: bytes, event: dict[str, Any], name: str | None) -> None:
        """After a text delta read in full: the lane of the next deltas of its part (see
        `TextLane`), when its lexer holds markup or its text goes to an item of ours."""
        core = self._core
        segments = core.last_segments
        source = core._sources.get(event.get("output_index"))
        key = event.get("content_index")
        if source is None or type(key) is not int or event.get("type") != TEXT_DELTA[source.kind] or not event.get("delta"):
            return
        lexer = source.lexers.get(key)
        if lexer is None:
            return
        frame = self._frame_of(raw, event)
        if frame is None or frame.carries_fields:
            return
        leaf, path = live_path(lexer)
        lane = TextLane(frame, source, key, lexer, leaf, path, bool(segments) and type(segments[-1]) in (CallArgs, CallBegin))
        call = core._calls.get((source.id, key))
        if call is not None:
            probe = {**arguments_delta(call, "\x00"), "sequence_number": _SENTINEL_NUMBER}
            lane.call, lane.args = call, Rendered.of(self._encode(Outgoing(probe, probe["type"])))
        piece = source.piece
        if piece is not None and key in piece.text_open and key not in source.reasoning_over and not any(type(node) is ChainLexer for node in path):
            # `_on_text_delta`'s common case: the event as it came, renumbered. Only where the
            # numbering is ours (else `passes_plain_delta` takes it without the lexer).
            changes = {"output_index": piece.index, "item_id": piece.id, "content_index": piece.content_index(key)}
            if any(event.get(key_name) != value for key_name, value in changes.items()):
                probe = {**event, **changes, "delta": "\x00", "sequence_number": _SENTINEL_NUMBER}
                lane.piece, lane.text = piece, Rendered.of(self._encode(Outgoing(probe, name)))
        if lexer.idle:
            if lane.text is None:
                return  # the full path (`passes_plain_delta`) takes plain text
            lane.quiet = True
        self._held, self._held_read = lane, lane.ready()
        self._direct = self._lane_direct(self._held_read)
