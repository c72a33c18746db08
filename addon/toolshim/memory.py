"""Conversation state: what the client was sent with its tool calls, kept for the next request.

A thinking backend wants the reasoning of its earlier turns back; many clients drop it. When a
response reaches the client, `turns_given` reads what the client got (after toolshim's rewrite;
`turns_given_pieces` takes the events a lane noted instead of reading them again) and `KeyMaker`
names each turn; the next request's assistant turns are looked up by the same names
(history.py). The state is the only thing that outlives a flow; losing it loses a repair,
never a byte.

Keys. Kimi ids repeat in every conversation (`functions.bash:0`), so a key made of the id alone
would hand one conversation's reasoning to another, or to another user. A key is a hash of:
the credential the client presented (hashed on its own first), the conversation's first user
message, and the call's id, name and arguments (arguments compared as JSON, since clients
re-serialise them). No credential, header or text is ever stored as such: keys are digests and
values are what the client itself was sent.

Stores. `LocalStore` (in-process, the default) is bounded by entries, bytes and age, least
recently used evicted first. `RedisStore` shares the state between mitmdump workers; every call
is bounded by a timeout and fails open (the caller counts and logs).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from operator import getitem, is_
from typing import Any

import orjson

from .apis import MESSAGES, RESPONSES
from .stream import Frame, NotedEvents, each_string, string_spans

CHAT_REASONING_FIELDS = ("reasoning_content", "reasoning", "reasoning_details")
_CREDENTIAL_HEADERS = ("authorization", "x-api-key", "api-key", "x-goog-api-key")
KEY_PREFIX = "toolshim:reasoning:"


def credential_scope(headers: Mapping[str, str]) -> bytes:
    """A digest of the credential the request carries (empty without one): conversations of
    different keys never share state, and the credential itself goes nowhere."""
    fields = getattr(headers, "fields", None)
    if fields is not None:
        # mitmproxy's `Headers`: its raw fields read in one pass (its `get` converts the name of
        # every field, and the one asked for, each time: four names asked for on every request),
        # a name's values joined as its `get` joins them.
        found: dict[bytes, list[bytes]] = {}
        for key, value in fields:
            name = key.lower()
            if name in _CREDENTIAL_FIELDS:
                found.setdefault(name, []).append(value)
        credentials = (b", ".join(found.get(name, ())) for name in _CREDENTIAL_FIELDS)
    else:
        credentials = ((headers.get(name) or "").encode("utf-8", "surrogateescape") for name in _CREDENTIAL_HEADERS)
    for credential in credentials:
        if credential:
            return hashlib.blake2b(credential, digest_size=16, person=b"toolshim-cred").digest()
    return b""


_CREDENTIAL_FIELDS = tuple(name.encode() for name in _CREDENTIAL_HEADERS)


def message_text(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list, joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def first_user_text(request: Mapping[str, Any]) -> str:
    """The conversation's first user message (Chat `messages` or Responses `input`)."""
    items = request.get("messages")
    if items is None:
        items = request.get("input")
        if isinstance(items, str):
            return items
    if not isinstance(items, list):
        return ""
    for item in items:
        if isinstance(item, dict) and item.get("role") == "user":
            return message_text(item.get("content"))
    return ""


def _parsed_arguments(arguments: Any) -> Any:
    """Arguments as JSON values (LangChain and others re-serialise what they got: other spacing,
    other key order); text that is not JSON stays text."""
    if isinstance(arguments, str):
        try:
            return orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
    return arguments


class KeyMaker:
    """The keys of one conversation's turns, as one request sees the conversation."""

    def __init__(self, scope: bytes, anchor: str) -> None:
        self._base = hashlib.blake2b(digest_size=20, person=b"toolshim-turn")
        # Length-prefixed: no scope and anchor pair can spell another's.
        self._base.update(len(scope).to_bytes(4, "big") + scope + anchor.encode("utf-8", "surrogateescape"))
        self._identity = self._base.digest()  # the conversation, as `_CALL_KEYS` knows it

    @classmethod
    def for_request(cls, request: Mapping[str, Any], headers: Mapping[str, str]) -> KeyMaker:
        return cls(credential_scope(headers), first_user_text(request))

    def _key(self, parts: list[Any]) -> str:
        digest = self._base.copy()  # the anchor, however long, is hashed once per request
        try:
            digest.update(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS))  # a JSON array: unambiguous
        except TypeError:  # not JSON (a stray float NaN, a huge integer): its repr names it
            digest.update(repr(parts).encode("utf-8", "surrogateescape"))
        return KEY_PREFIX + digest.hexdigest()

    def call(self, call_id: Any, name: Any, arguments: Any) -> str:
        """A tool-call turn, by one of its calls."""
        if type(call_id) is not str or type(name) is not str or type(arguments) is not str or len(arguments) > 4096:
            return self._key(["call", call_id, name, _parsed_arguments(arguments)])
        # A conversation sends its whole history on every turn: the same calls are named again
        # and again, and a lookup costs less than parsing and hashing them.
        remembered = (self._identity, call_id, name, arguments)
        key = _CALL_KEYS.get(remembered)
        if key is None:
            if len(_CALL_KEYS) >= _CALL_KEYS_KEPT:
                _CALL_KEYS.clear()
            key = _CALL_KEYS[remembered] = self._key(["call", call_id, name, _parsed_arguments(arguments)])
        return key

    def answer(self, text: str) -> str:
        """A turn without calls, by its text."""
        return self._key(["answer", text.strip()])


# Call keys already computed, by (conversation, id, name, arguments of at most 4 KB); cleared
# when full: at most about 8,192 x 4 KB held.
_CALL_KEYS: dict[tuple[bytes, str, str, str], str] = {}
_CALL_KEYS_KEPT = 8192


# -- what the client was given ---------------------------------------------------------------------


@dataclass(slots=True)
class GivenTurn:
    """One assistant turn as the client received it: its reasoning (Chat fields, or Responses
    reasoning items), its calls (id, name, arguments) and its text."""

    reasoning: dict[str, Any] = field(default_factory=dict)
    calls: list[tuple[Any, Any, Any]] = field(default_factory=list)
    text: str = ""

    def records(self, keys: KeyMaker, all_turns: bool) -> dict[str, bytes]:
        """key -> stored value, for every name the next request may know this turn by."""
        if not self.reasoning:
            return {}
        value = orjson.dumps(self.reasoning)
        names = [keys.call(*call) for call in self.calls]
        if not self.calls and all_turns and self.text.strip():
            names.append(keys.answer(self.text))
        return dict.fromkeys(names, value)


def turns_given(api: str, body: bytes) -> list[GivenTurn]:
    """The assistant turns in a response body as the client got it (an SSE stream or JSON).
    Unreadable pieces are skipped: a turn not understood is only a repair not made later."""
    if body.lstrip()[:1] == b"{":
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            return []
        if not isinstance(parsed, dict):
            return []
        if api == RESPONSES:
            return _responses_turns(parsed.get("output"))
        if api == MESSAGES:
            return [_messages_turn(parsed.get("content"))]
        return [_chat_message_turn(choice.get("message")) for choice in _dicts(parsed.get("choices"))]
    if api == RESPONSES:
        return _responses_turns(_responses_stream_output(_sse_data(body, _RESPONSES_OUTPUT)))
    if api == MESSAGES:
        return [_messages_turn(_messages_stream_content(body))]
    return _chat_stream_turns(body)


def turns_given_pieces(api: str, pieces: list[bytes], noted: NotedEvents | None) -> list[GivenTurn]:
    """`turns_given` of the body `pieces` make, where the pieces that are (by identity) events a
    lane sent and noted (`noted`, stream.py's `NotedEvents`) are not read again: their string
    bodies are taken, a run of them decoded at once. The pieces between are read as ever, in
    order, so the pieces of a call's arguments keep the order the client got them in."""
    if not noted or api == RESPONSES:
        return turns_given(api, b"".join(pieces))
    turns = _MessagesContent() if api == MESSAGES else _ChatTurns()
    for call, stretch in _noted_stretches(pieces, noted):
        if call is None:
            # (Between a lane's events: most often a call's start or end, a role, a finish, whose
            # frames are worth learning only where a long run may follow: remembering
            # bench/e2e.py's Kimi flow took 111 us learning them all, 93 us learning them only in
            # stretches of 16 events or more.)
            body = b"".join(stretch)
            turns.read(body, learn=body.count(b"\n\n") >= _LEARNED_FROM)
        else:
            turns.add(call, stretch)
    return turns.turns()


# A stretch of this many events or more, between the events the lanes noted, learns their frames.
_LEARNED_FROM = 16


def _noted_stretches(pieces: list[bytes], noted: NotedEvents) -> Iterator[tuple[tuple[Any, ...] | None, list[bytes]]]:
    """`pieces` in stretches, in order: (what they add to, their string bodies) for events of one
    run of `noted` in a row, (None, the pieces) for the rest. (A run's events are most often all
    in a row: told at once, in C.)"""
    notes = list(noted)  # (a list subclass indexes through a slower path)
    runs, several = noted.runs, noted.several
    ends = [first for first, *_ in runs[1:]]
    ends.append(len(notes))
    at, count = 0, len(pieces)
    for (first, call, head, tail, mid), end in zip(runs, ends):
        k = first
        while k < end:
            note, found = notes[k], at
            while found < count and pieces[found] is not note:
                found += 1
            if found == count:  # not sent (a read that failed): the rest is read
                break
            if found > at:
                yield None, pieces[at:found]
            size = end - k
            if not all(map(is_, pieces[found : found + size], notes[k:end])):
                size = 1
                while k + size < end and found + size < count and pieces[found + size] is notes[k + size]:
                    size += 1
            events = pieces[found : found + size]
            if call is None:
                yield None, events
            elif several and not several.keys().isdisjoint(range(k, k + size)):
                yield call, _bodies_with_several(events, k, several, head, tail, mid)
            else:
                yield call, _bodies(events, head, tail, mid)
            at, k = found + size, k + size
        else:
            continue
        break  # (a note that was not sent: no later one is looked for)
    if at < count:
        yield None, pieces[at:]


def _bodies(events: list[bytes], head: bytes, tail: bytes, mid: bytes | None) -> list[bytes]:
    """The string bodies of `events`, each `head`, a body, `tail` (with `mid`: the body, `mid`,
    the body again). (Cut event by event: a search for the bytes between two events, `tail +
    head`, in the run joined took ten times as long.)"""
    start = len(head)
    if mid is None:
        return list(map(getitem, events, repeat(slice(start, -len(tail)))))  # (in C)
    fixed = start + len(mid) + len(tail)
    return [event[start : start + (len(event) - fixed) // 2] for event in events]


def _bodies_with_several(events: list[bytes], first: int, several: dict[int, list[bytes]], head: bytes, tail: bytes, mid: bytes | None) -> list[bytes]:
    """`_bodies` of a run of notes from note `first` on, some of them reads of several events
    (`NotedEvents.several`: their bodies, as the lane found them)."""
    bodies: list[bytes] = []
    for at, event in enumerate(events, first):
        found = several.get(at)
        bodies += found if found is not None else _bodies([event], head, tail, mid)
    return bodies


def _dicts(value: Any) -> list[dict]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _lines(body: bytes) -> list[bytes]:
    """`body.splitlines()`; split at LF alone where there is no CR: a scan for one byte, where
    `splitlines` looks at every byte for both (0.36 M of the 2.3 M instructions it took to
    remember bench/e2e.py's Kimi flow)."""
    return body.split(b"\n") if body.find(b"\r") < 0 else body.splitlines()


def _data_lines(body: bytes) -> Iterable[bytes]:
    for window in _windows(body):
        for line in _lines(window):
            if line.startswith(b"data:") and not line[5:].lstrip().startswith(b"[DONE]"):
                yield line


def _sse_data(body: bytes, wanted: re.Pattern[bytes] | None = None) -> Iterable[Any]:
    """The JSON of each data line; with `wanted`, only of the lines it finds something in."""
    for line in _data_lines(body):
        if wanted is None or wanted.search(line):
            try:
                yield orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                continue


def _unsteady_events(body: bytes, steady: SteadyDeltas | None, learn: bool = True) -> Iterable[tuple[bytes, Any]]:
    """Each data line that `steady` did not take, with its JSON (lines that are none, `[DONE]`
    among them, are skipped). Lazy: what the caller learns from one line serves the next
    (`learn`: the caller may learn frames)."""
    if not (learn or (steady is not None and steady.knows_frames)):
        # Nothing to take nor to learn: every data line read, at once (a stretch between a
        # lane's events is most often one to three events: a generator's machinery and a look
        # for frames cost more than reading them did).
        return _data_events(body)
    return _unsteady_events_lazily(body, steady)


def _data_events(body: bytes) -> list[tuple[bytes, Any]]:
    """Each data line of `body` with its JSON, in order (not JSON, `[DONE]` among them: left out)."""
    events = []
    for window in (body,) if len(body) <= WINDOW else _windows(body):
        for line in _lines(window):
            if line[:5] == b"data:" and line != b"data: [DONE]":  # (the end told apart: an error costs a message)
                try:
                    events.append((line, orjson.loads(line[5:])))
                except orjson.JSONDecodeError:
                    continue
    return events


def _unsteady_events_lazily(body: bytes, steady: SteadyDeltas | None) -> Iterator[tuple[bytes, Any]]:
    for window in _windows(body):  # (`_windows`: a long stream's lines not all held at once)
        lines = list(filter(None, _lines(window)))  # (without the blank lines, in C)
        at, count = 0, len(lines)
        while at < count:
            if steady is not None:
                at = steady.take(lines, at)
                if at == count:
                    break
            line = lines[at]
            at += 1
            if not line.startswith(b"data:"):
                continue
            try:
                yield line, orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                continue


# A body is read in windows of about this many bytes, cut at line ends.
WINDOW = 1 << 16


def _windows(body: bytes) -> Iterator[bytes]:
    """`body` in pieces of whole lines of about `WINDOW` bytes each, cut after a LF (which never
    parts a CRLF; a body whose lines end in CR alone stays whole). A long stream's lines are then
    never all held at once: split in one go, a Kimi stream of 1 MB of reasoning in 4-character
    deltas made 262,144 line objects (30 MB) and 262,144 strings at the end of the stream, and
    its time per byte grew to 1.3-1.5 times that of 1 KB with the cache misses
    (bench/request_repairs.py's scaling row); in windows it is flat."""
    if len(body) <= WINDOW:
        yield body
        return
    start, size = 0, len(body)
    while start < size:
        cut = body.find(b"\n", start + WINDOW) + 1 or size
        yield body[start:cut]
        start = cut


# The events `_responses_stream_output` reads, by their type's bytes; a line with an escape may
# spell the type otherwise, so it is read too.
_RESPONSES_OUTPUT = re.compile(rb'"response\.(?:completed|incomplete|output_item\.done)"|\\')


class SteadyDeltas:
    """Delta events that only add a piece of text (to one field, or the same piece to two
    mirrored ones), read from their bytes: what stream.py's lanes do for the rewrite. A `Frame`
    is learned from an event read in full whose JSON equals, but for that string, what the
    frame's bytes parse to (checked once, on a probe); an event of the frame then adds its
    string to the lists the learned one added to. A stream of tokens parses a few events in
    full, not every one: remembering a Kimi stream of 200 events (bench/e2e.py's) took 2.8 us an
    event read in full, 1.7 so. The events of a run of one frame are decoded at once, as one
    JSON array of their strings (`each_string`), each checked to be one string by itself: 3.1
    -> 2.3 M instructions to remember that stream (bench/e2e.py's Kimi flow, callgrind)."""

    __slots__ = ("_frames",)

    def __init__(self) -> None:
        self._frames: list[tuple[Frame, tuple[list[str], ...]]] = []  # the newest first

    @property
    def knows_frames(self) -> bool:
        return bool(self._frames)

    def take(self, lines: list[bytes], at: int) -> int:
        """The lines from `at` on that are events of learned frames (their pieces added) or no
        data lines: where the first line that must be read in full is (`len(lines)`: none)."""
        count = len(lines)
        while at < count:
            line = lines[at]
            if not line.startswith(b"data:"):
                at += 1
                continue
            for frame, targets in self._frames:
                if frame.split(line) is not None:
                    break
            else:
                return at
            at = self._take_run(lines, at, frame, targets)
            if at < count and lines[at].startswith(b"data:") and frame.split(lines[at]) is not None:
                return at  # (a piece that is no string by itself: read in full)
        return at

    @staticmethod
    def _take_run(lines: list[bytes], at: int, frame: Frame, targets: tuple[list[str], ...]) -> int:
        """The run of events of `frame` from `at` (with the lines between them that are no data
        lines), their pieces decoded at once: where the run ends."""
        count, pieces, first = len(lines), [], at
        head, mid, tail, fixed, start = frame.head, frame.mid, frame.tail, frame.fixed, len(frame.head)
        join = b"".join
        while at < count:  # (`frame.split`, inline: a stream's commonest lines)
            line = lines[at]
            extra = len(line) - fixed
            if mid is None:
                if extra >= 0 and line.startswith(head) and line.endswith(tail):
                    pieces.append(line[start : start + extra])
                    at += 1
                    continue
            elif extra >= 0 and not extra & 1:
                body = line[start : start + (extra >> 1)]
                if join((head, body, mid, body, tail)) == line:
                    pieces.append(body)
                    at += 1
                    continue
            if line.startswith(b"data:"):
                break  # (another event: the run ends; a line of no data is skipped)
            at += 1
        texts = each_string(pieces)
        if texts is None:  # a piece that is no string by itself: the pieces before it, then its line
            texts = []
            for piece in pieces:
                if (text := _one_string(piece)) is None:
                    break
                texts.append(text)
            # (the run's data lines are its pieces, in order: the failing one's is the len(texts)-th)
            end, at, before = at, first, len(texts)
            while at < end and (before or not lines[at].startswith(b"data:")):
                before -= lines[at].startswith(b"data:")
                at += 1
        if texts:  # (joined: a run's pieces kept as one string, not one object each)
            text = "".join(texts)
            for target in targets:
                target.append(text)
        return at

    def learn(self, line: bytes, keys: tuple[str, ...], expected: dict[str, Any], targets: tuple[list[str], ...]) -> None:
        """`line` was read in full, its string of `keys` added to `targets`; `expected` is its
        JSON with that string `"\x01"`."""
        spans = string_spans(line, keys)
        frame = Frame.around(line, spans) if spans is not None else None
        if frame is None:
            return
        try:
            probe = orjson.loads(frame.probe(b"\\u0001")[5:])
        except orjson.JSONDecodeError:
            return
        if probe == expected:
            self._frames = [(frame, targets), *self._frames[:3]]

    def forget(self) -> None:
        self._frames = []


def _lane_strings(bodies: list[bytes]) -> list[str]:
    """String bodies a lane made or decoded: each is one string by itself, so none ends in an odd
    run of backslashes, and joined they parse as an array of as many."""
    return orjson.loads(b'["' + b'","'.join(bodies) + b'"]')


def _upstream_strings(bodies: list[bytes]) -> list[str]:
    """String bodies passed as they came (a quiet lane checks their bytes, not their escapes):
    each decoded, one that is no string left out, as its event would be when read."""
    texts = each_string(bodies)
    return texts if texts is not None else [text for body in bodies if (text := _one_string(body)) is not None]


def _one_string(body: bytes) -> str | None:
    """`body` decoded as a JSON string body; None when it is none by itself."""
    try:
        return orjson.loads(b'"' + body + b'"')
    except orjson.JSONDecodeError:
        return None


def _chat_message_turn(message: Any) -> GivenTurn:
    turn = GivenTurn()
    if not isinstance(message, dict):
        return turn
    turn.reasoning = {name: message[name] for name in CHAT_REASONING_FIELDS if message.get(name)}
    for call in _dicts(message.get("tool_calls")):
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        turn.calls.append((call.get("id"), function.get("name"), function.get("arguments")))
    turn.text = message_text(message.get("content"))
    return turn


def _chat_stream_turns(body: bytes) -> list[GivenTurn]:
    turns = _ChatTurns()
    turns.read(body)
    return turns.turns()


class _ChatTurns:
    """Accumulate each choice of a Chat stream the way the SDKs do, from the body's pieces in
    order (`read`), or from pieces a lane noted (`add`). Texts are kept
    as pieces and joined once at the end: adding each delta to a growing string copies the
    string every time, which is quadratic in a long reasoning (1 MB took seconds, on the
    proxy's event loop)."""

    def __init__(self) -> None:
        self.choices: dict[Any, dict[str, Any]] = {}
        self.steady = SteadyDeltas() if STEADY else None  # (its frames hold on from one read to the next)

    def _choice(self, index: Any) -> dict[str, Any]:
        acc = self.choices.get(index)
        if acc is None:
            acc = self.choices[index] = {"calls": {}, "details": [], **{name: [] for name in _CHAT_TEXTS}}
        return acc

    def read(self, body: bytes, learn: bool = True) -> None:
        """`body`'s events added; `learn`: their frames learned as well (`SteadyDeltas`)."""
        choices, steady = self.choices, self.steady
        learn = learn and steady is not None
        # (Types told by `type(...) is`: what orjson makes is never a subclass.)
        for line, chunk in _unsteady_events(body, steady, learn):
            if type(chunk) is not dict:
                continue
            if learn:
                _learn_chat(steady, line, chunk, choices)
            listed = chunk.get("choices")
            if type(listed) is not list:
                continue
            for choice in listed:
                if type(choice) is not dict or type(delta := choice.get("delta")) is not dict:
                    continue
                index = choice.get("index", 0)
                acc = choices.get(index) or self._choice(index)
                for name in _CHAT_TEXT_KEYS & delta.keys():  # (most deltas hold one or two)
                    if type(text := delta[name]) is str:
                        acc[name].append(text)
                if type(details := delta.get("reasoning_details")) is list:
                    _merge_details(acc["details"], details)
                if type(calls := delta.get("tool_calls")) is not list:
                    continue
                for entry in calls:
                    if type(entry) is not dict:
                        continue
                    call = acc["calls"].setdefault(entry.get("index", len(acc["calls"])), ([], [], []))
                    function = entry.get("function") if isinstance(entry.get("function"), dict) else {}
                    for pieces, piece in zip(call, (entry.get("id"), function.get("name"), function.get("arguments"))):
                        if isinstance(piece, str):
                            pieces.append(piece)

    def add(self, call: tuple[Any, ...], bodies: list[bytes]) -> None:
        """Pieces noted by a lane, as JSON string bodies: of a call's arguments (`("args",
        choice, index)`), or of text passed as it came (`("text", choice, fields)`)."""
        kind, choice, which = call
        acc = self._choice(choice)
        if kind == "args":
            acc["calls"].setdefault(which, ([], [], []))[2].extend(_lane_strings(bodies))
        else:
            texts = _upstream_strings(bodies)
            for name in which:
                acc[name].extend(texts)

    def turns(self) -> list[GivenTurn]:
        turns = []
        for acc in self.choices.values():
            message: dict[str, Any] = {name: "".join(acc[name]) if acc[name] else None for name in _CHAT_TEXTS}
            message["reasoning_details"] = [_joined(detail) for detail in acc["details"]]
            message["tool_calls"] = [{"id": "".join(i), "function": {"name": "".join(n), "arguments": "".join(a)}} for i, n, a in acc["calls"].values()]
            turns.append(_chat_message_turn(message))
        return turns


_CHAT_TEXTS = ("reasoning_content", "reasoning", "content")
_CHAT_TEXT_KEYS = frozenset(_CHAT_TEXTS)
# Off: every event is read in full (tests compare both).
STEADY = True


def _learn_chat(steady: SteadyDeltas, line: bytes, chunk: dict[str, Any], choices: dict[Any, dict[str, Any]]) -> None:
    """Before `chunk` is accumulated: when it only adds one piece of text (one field, or two
    mirrored ones: `_CHAT_TEXTS`) or of one call's arguments, `steady` learns its frame, with
    the lists that piece goes to (made here as the accumulation would make them)."""
    choice_list = chunk.get("choices")
    if not isinstance(choice_list, list) or len(choice_list) != 1 or not isinstance(choice := choice_list[0], dict):
        return
    delta = choice.get("delta")
    if not isinstance(delta, dict) or delta.get("reasoning_details") is not None:
        return
    texts = tuple(name for name in _CHAT_TEXTS if isinstance(delta.get(name), str))
    calls = _dicts(delta.get("tool_calls"))
    index = choice.get("index", 0)
    acc = choices.get(index)
    if acc is None:
        acc = choices[index] = {"calls": {}, "details": [], **{name: [] for name in _CHAT_TEXTS}}
    if texts and not calls and len(texts) <= 2 and len({delta[name] for name in texts}) == 1:
        expected = {**chunk, "choices": [{**choice, "delta": {**delta, **dict.fromkeys(texts, "\x01")}}]}
        steady.learn(line, texts, expected, tuple(acc[name] for name in texts))
    elif not texts and len(calls) == 1 and isinstance(delta["tool_calls"], list) and len(delta["tool_calls"]) == 1:
        entry = calls[0]
        function = entry.get("function")
        if "index" not in entry or isinstance(entry.get("id"), str) or not isinstance(function, dict):
            return
        if isinstance(function.get("name"), str) or not isinstance(function.get("arguments"), str):
            return
        call = acc["calls"].setdefault(entry["index"], ([], [], []))
        expected_entry = {**entry, "function": {**function, "arguments": "\x01"}}
        expected = {**chunk, "choices": [{**choice, "delta": {**delta, "tool_calls": [expected_entry]}}]}
        steady.learn(line, ("arguments",), expected, (call[2],))


def _merge_details(details: list[dict], pieces: list[Any]) -> None:
    """OpenRouter-style `reasoning_details` stream as pieces that share an `index`: their text
    fields are concatenated, as the clients that keep them do (as lists of pieces until
    `_joined`)."""
    for piece in pieces:
        if not isinstance(piece, dict):
            continue
        index = piece.get("index")
        same = next((d for d in details if index is not None and d.get("index") == index and d.get("type") == piece.get("type")), None)
        if same is None:
            details.append({name: _Pieces([value]) if isinstance(value, str) and name not in _DETAIL_KEYS else value for name, value in piece.items()})
            continue
        for name, value in piece.items():
            if isinstance(value, str) and type(same.get(name)) is _Pieces:
                same[name].append(value)
            elif name not in same:
                same[name] = _Pieces([value]) if isinstance(value, str) and name not in _DETAIL_KEYS else value


_DETAIL_KEYS = ("type", "id", "format")  # strings of a detail that name it rather than add to it


class _Pieces(list):
    """A text field's pieces, joined by `_joined` (a list of upstream's own stays a list)."""


def _joined(detail: dict[str, Any]) -> dict[str, Any]:
    return {name: "".join(value) if type(value) is _Pieces else value for name, value in detail.items()}


def _responses_stream_output(events: Iterable[Any]) -> list[Any]:
    done: dict[Any, Any] = {}
    for event in events:
        if not isinstance(event, dict):
            continue
        if event.get("type") in ("response.completed", "response.incomplete"):
            response = event.get("response")
            return response.get("output") if isinstance(response, dict) else []
        if event.get("type") == "response.output_item.done":  # a stream cut before its end
            done[event.get("output_index", len(done))] = event.get("item")
    return [done[i] for i in sorted(done, key=lambda i: i if isinstance(i, int) else 0)]


def _responses_turns(output: Any) -> list[GivenTurn]:
    turn = GivenTurn()
    reasoning_items = []
    for item in _dicts(output):
        kind = item.get("type")
        if kind == "reasoning":
            reasoning_items.append(item)
        elif kind == "function_call":
            turn.calls.append((item.get("call_id"), item.get("name"), item.get("arguments")))
        elif kind == "message" and item.get("role", "assistant") == "assistant":
            turn.text += message_text(item.get("content"))
    if reasoning_items:
        turn.reasoning = {"items": reasoning_items}
    return [turn]


def _messages_stream_content(body: bytes) -> list[dict[str, Any]]:
    """The content blocks of an Anthropic stream, accumulated as the SDKs do."""
    content = _MessagesContent()
    content.read(body)
    return content.blocks_given()


class _MessagesContent:
    """The content blocks of an Anthropic stream, accumulated as the SDKs do, from the body's
    pieces in order (`read`), or from pieces of a tool_use block's JSON a lane noted (`add`)."""

    def __init__(self) -> None:
        self.blocks: dict[Any, dict[str, Any]] = {}
        self.pieces: dict[Any, dict[str, list[str]]] = {}  # the deltas' texts of each block
        self.steady = SteadyDeltas() if STEADY else None

    def read(self, body: bytes, learn: bool = True) -> None:
        """`body`'s events added; `learn`: their frames learned as well (`SteadyDeltas`)."""
        blocks, pieces, steady = self.blocks, self.pieces, self.steady
        learn = learn and steady is not None
        for line, event in _unsteady_events(body, steady, learn):
            if type(event) is not dict:
                continue
            kind, index = event.get("type"), event.get("index")
            if kind == "content_block_start" and isinstance(event.get("content_block"), dict):
                blocks[index] = dict(event["content_block"])
                pieces.pop(index, None)
                if steady is not None:
                    steady.forget()  # (a learned frame may add to the lists just dropped)
            elif kind == "content_block_delta" and index in blocks and isinstance(event.get("delta"), dict):
                delta, texts = event["delta"], pieces.setdefault(index, {})
                names = [name for name in _MESSAGES_TEXTS if isinstance(delta.get(name), str)]
                for name in names:
                    texts.setdefault(name, []).append(delta[name])
                if learn and len(names) == 1:
                    steady.learn(line, (names[0],), {**event, "delta": {**delta, names[0]: "\x01"}}, (texts[names[0]],))

    def add(self, call: tuple[Any, ...], bodies: list[bytes]) -> None:
        """Pieces noted by a lane, as JSON string bodies: of block `index`'s `partial_json`
        (`("args", index)`), or of its text or thinking passed as it came (`("text", index,
        field)`)."""
        if call[0] == "args":
            name, texts = "partial_json", _lane_strings(bodies)
        else:
            name, texts = call[2], _upstream_strings(bodies)
        if call[1] in self.blocks:
            self.pieces.setdefault(call[1], {}).setdefault(name, []).extend(texts)

    def blocks_given(self) -> list[dict[str, Any]]:
        content = []
        for index, block in self.blocks.items():
            for name, texts in self.pieces.get(index, {}).items():  # joined once (see `_ChatTurns`)
                block[name] = (block.get(name) or "") + "".join(texts)
            if "partial_json" in block:
                try:
                    block["input"] = orjson.loads(block.pop("partial_json"))
                except orjson.JSONDecodeError:
                    continue  # not what the client could read
            content.append(block)
        return content

    def turns(self) -> list[GivenTurn]:
        return [_messages_turn(self.blocks_given())]


_MESSAGES_TEXTS = ("text", "thinking", "signature", "partial_json")


def _messages_turn(content: Any) -> GivenTurn:
    turn = GivenTurn()
    blocks = _dicts(content)
    thinking = [block for block in blocks if block.get("type") in ("thinking", "redacted_thinking")]
    if thinking:
        turn.reasoning = {"blocks": thinking}
    turn.calls = [(block.get("id"), block.get("name"), block.get("input")) for block in blocks if block.get("type") == "tool_use"]
    turn.text = message_text(blocks)
    return turn


# -- stores ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class StoreStats:
    entries: int = 0
    bytes: int = 0
    evicted: int = 0


class LocalStore:
    """In-process, least recently used first out, bounded by entries, bytes and age."""

    shared = False

    def __init__(self, max_entries: int, max_bytes: int, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl = ttl
        self._clock = clock
        # key -> (stored at, value as stored[, value decoded, once read])
        self._entries: OrderedDict[str, tuple] = OrderedDict()
        self.stats = StoreStats()

    def get_many(self, keys: Iterable[str]) -> dict[str, Any]:
        """The values found, decoded (each decoded once and kept: a conversation sends its whole
        history on every turn, so the same entries are read again and again). Callers must not
        change them."""
        now = self._clock()
        found = {}
        for key in keys:
            entry = self._entries.get(key)
            if entry is None:
                continue
            if now - entry[0] > self.ttl:
                self._drop(key)
                continue
            self._entries.move_to_end(key)
            if len(entry) == 2:
                try:
                    entry = self._entries[key] = (entry[0], entry[1], orjson.loads(entry[1]))
                except orjson.JSONDecodeError:
                    continue
            found[key] = entry[2]
        return found

    def put_many(self, items: Mapping[str, bytes]) -> None:
        now = self._clock()
        for key, value in items.items():
            if len(value) > self.max_bytes:
                continue  # would evict everything else and still not fit
            if key in self._entries:
                self._drop(key)
            self._entries[key] = (now, value)
            self.stats.entries += 1
            self.stats.bytes += len(value)
        while self._entries and (self.stats.entries > self.max_entries or self.stats.bytes > self.max_bytes):
            self._drop(next(iter(self._entries)))
            self.stats.evicted += 1
        # Age: the oldest entries sit at the front (a hit moves an entry back, but keeps its time).
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if now - entry[0] <= self.ttl:
                break
            self._drop(key)

    def _drop(self, key: str) -> None:
        value = self._entries.pop(key)[1]
        self.stats.entries -= 1
        self.stats.bytes -= len(value)

    def __len__(self) -> int:
        return len(self._entries)


class StoreUnreachable(Exception):
    """The shared store did not answer in time or refused; the caller fails open."""


class RedisStore:
    """A Redis or Valkey server shared by any number of mitmdump workers. Entries expire by
    age (`SET … EX`); entries and bytes are bounded by the server's own `maxmemory` policy
    (the README's "Many workers" gives a configuration)."""

    shared = True

    def __init__(self, url: str, ttl: float, timeout: float, max_value_bytes: int) -> None:
        import redis.asyncio  # only when asked for: the in-process store needs no client

        self.url = url
        self.ttl = max(1, int(ttl))
        self.timeout = timeout
        self.max_value_bytes = max_value_bytes
        self._client = redis.asyncio.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, retry_on_timeout=False
        )

    async def get_many(self, keys: list[str]) -> dict[str, bytes]:
        if not keys:
            return {}
        values = await self._bounded(self._client.mget(keys))
        return {key: value for key, value in zip(keys, values) if value is not None}

    async def put_many(self, items: Mapping[str, bytes]) -> None:
        items = {key: value for key, value in items.items() if len(value) <= self.max_value_bytes}
        if not items:
            return
        pipe = self._client.pipeline(transaction=False)
        for key, value in items.items():
            pipe.set(key, value, ex=self.ttl)
        await self._bounded(pipe.execute())

    async def _bounded(self, call):
        try:
            return await asyncio.wait_for(call, self.timeout)
        except TimeoutError:
            raise StoreUnreachable(f"no answer within {self.timeout * 1000:.0f} ms") from None
        except Exception as exc:  # refused, protocol error: all the same to the caller
            raise StoreUnreachable(f"{type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        try:
            await self._client.aclose()
        except Exception:
            pass


class ConversationState:
    """The store the addon uses, failing open: a store that cannot be reached answers "nothing
    known" (the request goes as the client sent it) and a record that cannot be written is let
    go. Counted; the first failure after a success is reported by `unreachable_news`."""

    def __init__(self, store: LocalStore | RedisStore) -> None:
        self.store = store
        self.unreachable = 0  # lookups or writes that failed
        self._down = False  # the last call failed: the next failure is no news
        self._pending: set[asyncio.Task] = set()

    @property
    def shared(self) -> bool:
        return self.store.shared

    def get_local(self, keys: list[str]) -> dict[str, bytes]:
        return self.store.get_many(keys) if keys else {}

    async def get_shared(self, keys: list[str]) -> tuple[dict[str, bytes], StoreUnreachable | None]:
        try:
            found = await self.store.get_many(keys)
        except StoreUnreachable as exc:
            return {}, self._failed(exc)
        self._down = False
        return found, None

    def put(self, items: dict[str, bytes], on_failure: Callable[[StoreUnreachable], None]) -> None:
        """Store now (in-process) or in the background (shared: the stream goes on meanwhile)."""
        if not items:
            return
        if not self.shared:
            self.store.put_many(items)
            return
        task = asyncio.get_running_loop().create_task(self._put_shared(items, on_failure))
        self._pending.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._pending.discard)

    async def _put_shared(self, items: dict[str, bytes], on_failure: Callable[[StoreUnreachable], None]) -> None:
        try:
            await self.store.put_many(items)
        except StoreUnreachable as exc:
            news = self._failed(exc)
            if news is not None:
                on_failure(news)
        else:
            self._down = False

    def _failed(self, exc: StoreUnreachable) -> StoreUnreachable | None:
        """Count a failure; return it if it is news (the store worked, or nothing was tried yet)."""
        self.unreachable += 1
        news = None if self._down else exc
        self._down = True
        return news

    async def flush(self) -> None:
        """Wait for the writes under way (tests, shutdown)."""
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
