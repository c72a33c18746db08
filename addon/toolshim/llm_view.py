"""The "LLM stream" content view, sans-IO: a Chat Completions, Responses or Anthropic Messages
body as lines.

`render` turns a response body (and, when toolshim rewrote the flow, the original upstream body
it kept) into lines of `(style, text)` segments, the form mitmproxy 11 content views yield;
`plain_text` joins them, for mitmproxy 12 and for golden tests. `contentview.py` is the
mitmproxy adapter: this module imports nothing of mitmproxy.

What is shown, top to bottom:

    toolshim: kimi → 2 calls (bash, read_file)       the flow's comment, when it has one
    request repaired by toolshim                     when toolshim repaired the request:
      reasoning  messages[1]                         one line per change (history.py), then
      kimi_ids   messages[1].tool_calls[0]  id=…     the turns whose reasoning was not known
    client got (rewritten by toolshim)               the two titles only when the original
      events                                         upstream body was kept
            1  chunk   role=assistant  content ''
            2  chunk   reasoning_content/reasoning 'I will list the headers.'
            3  chunk   tool_calls[0] name=bash id=functions.bash:15
            4  chunk   tool_calls[0].arguments '{"'
            …
           15  [DONE]
      result
        reasoning_content/reasoning: 'I will list the headers.'
        tool_calls[0]: bash  id=functions.bash:15
          {
            "command": "ls -la /usr/include | grep asm"
          }
        tool_calls[1]: read_file  id=functions.read_file:16
          …
        finish_reason: tool_calls
        usage: {"prompt_tokens":43206,"completion_tokens":133,"total_tokens":43339}

    upstream sent (original)
      events
            …
            3  chunk   reasoning_content/reasoning ' <|tool_calls_section_begin|>'
      result
        …

Events: one line per SSE event, numbered: the event's type (`chunk`, `[DONE]`, a Responses or
Messages event's `type`, `comment`, or `data` for data that is no JSON object), then what it carries:
`label 'text'` for model text and arguments (escaped, so that one event stays one line, and cut
after `MAX_EVENT_TEXT` characters), `key=value` for the rest. Fields carrying the same text
(mirrored `reasoning` and `reasoning_content`) are shown once, their names joined by `/`. Only
the first `MAX_EVENT_LINES` events are listed; the result always reads them all.

Result: what a client builds from the events (for a JSON body, from the body): per choice the
text fields, the tool calls with their arguments pretty-printed when they are JSON, the
finish_reason, and the usage. For the Responses API: the output items as the item events and
deltas build them (an item's `output_item.done` fills what no delta sent; the terminal event's
`response.output` is read only when no item event came), the status and the usage. Chat calls
are gathered by `index`; an entry without one joins the call with its id, else the last call.
For the Messages API: each event names its block (`[1] tool_use bash`) and what its delta
carries (text, thinking, a signature, a `partial_json` piece); the result is the content blocks
as a client accumulates them (text; thinking and its signature; tool_use with its name, id and
input pretty-printed, the input being the pieces joined, or the start's `input` when no piece
came), the stop_reason and the usage (message_start's, updated by message_delta's).

Leaked markup is looked for in the whole text of each channel (a Chat field of one choice, a
call's arguments, a Responses item's text), so a marker the model streamed in pieces (`<`,
`function`, `=`) is highlighted in every event carrying a piece of it. Rendering never raises:
what cannot be read becomes an error line, and everything before it is still shown.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from .apis import CHAT, MESSAGES, RESPONSES

Segment = tuple[str, str]
Line = list[Segment]

# Styles: names that both mitmproxy 11's console palette (tools/console/palettes.py) and
# mitmweb's stylesheet (`.contentview .NAME`) define, so that each looks distinct in both.
TITLE = "header"  # the comment and section titles (bold)
NUMBER = "offset"  # an event's running number (blue, like the hex view's offsets)
EVENT = "Token_Name_Tag"  # an event's type (green)
TOOL_NAME = "Token_Name_Tag"  # a call's tool name in the result
FIELD = "key"  # what an event or a result line carries
MODEL_TEXT = "Token_Literal_String"  # model text and arguments, quoted (red in mitmweb)
MARKUP = "highlight"  # leaked tool-call markup inside model text (bold)
PLAIN = "text"  # ids, finish reasons, usage, punctuation
NOTE = "warn"  # comments, data that is no event, what was left out
ERROR = "error"
JSON_KEY = "Token_Name_Tag"  # pretty-printed arguments, styled as mitmproxy's JSON view does
JSON_NUMBER = "Token_Literal_Number"
JSON_CONSTANT = "Token_Keyword_Constant"

MAX_EVENT_LINES = 2000
MAX_EVENT_TEXT = 1000  # characters of text one event line shows

# The marker tokens of every dialect toolshim reads (see lexers/*.py), for highlighting only: it
# may also mark a look-alike in prose. Every repetition is bounded, so a search is linear.
LEAKED_MARKUP = re.compile(
    # Kimi, gpt-oss Harmony and Llama special tokens (<|tool_call_begin|>, <|channel|>,
    # <|python_tag|>); Kimi's section end is also seen without its ">"
    r"<\|[A-Za-z_]{1,40}\|>?"
    # DeepSeek's fullwidth-bar tokens (<｜tool▁calls▁begin｜>) and DSML tags (<｜DSML｜invoke name="f">)
    r"|</?\uff5c[^\uff5c<>\n]{1,40}\uff5c(?:[^<>\n]{0,200}>)?"
    # Hermes, Qwen3-Coder, GLM, MiniMax and Seed-OSS tags, and reasoning tags
    r"|</?(?:tool_call|minimax:tool_call|seed:tool_call|arg_key|arg_value|function|parameter"
    r"|invoke|think|reasoning|thought|seed:think)>"
    # Qwen3-Coder and Llama <function=NAME>, <parameter=NAME>; MiniMax and Llama name attributes
    r"|<(?:function|parameter)=[^<>\n]{0,200}>"
    r'|<(?:function|parameter|invoke) name="[^"<>\n]{0,200}">'
    # Mistral
    r"|\[(?:TOOL_CALLS|ARGS|CALL_ID|/?THINK)\]"
)

# Escaped everywhere, so that a line of the view is one line of text; in quoted text, the
# backslash and the quote too, so that the text shows exactly what it holds.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_IN_QUOTES = re.compile(r"[\\'\"\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_SSE_LINE_END = re.compile(r"\r\n|\r|\n")
# In indented JSON as orjson writes it: a string (a key when a colon follows), a number, a constant.
_JSON_TOKEN = re.compile(r'("(?:[^"\\]|\\.)*")(\s*:)?|(-?\d[\d.eE+-]*)|\b(true|false|null)\b')

_TEXT_FIELDS = ("reasoning_content", "reasoning", "content", "refusal")  # in reading order: thought, then answer
_TERMINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")
_DELTA_CHANNELS = {
    "response.output_text.delta": "text",
    "response.refusal.delta": "refusal",
    "response.reasoning_text.delta": "reasoning",
    "response.reasoning_summary_text.delta": "summary",
    "response.function_call_arguments.delta": "arguments",
}
_ITEM_TEXT_CHANNELS = ("summary", "reasoning", "text", "refusal")  # in the order a result shows them
_PART_CHANNELS = {"output_text": "text", "refusal": "refusal", "reasoning_text": "reasoning", "summary_text": "summary"}


def render(
    body: bytes,
    api: str | None,
    upstream: bytes | None = None,
    comment: str | None = None,
    *,
    max_events: int = MAX_EVENT_LINES,
    request_repairs: Any = None,
) -> list[Line]:
    """The view of a response body of `api` (CHAT, RESPONSES or MESSAGES); with `upstream`, the original
    body follows in a section of its own; with `request_repairs` (flow.metadata's "request"),
    what was changed in the request comes first. Never raises."""
    lines: list[Line] = [[(TITLE, row)] for row in (comment or "").splitlines()]  # a comment may have several lines
    lines += _request_lines(request_repairs)
    if api not in (CHAT, RESPONSES, MESSAGES):
        api = _api_by_look(body)
        what = {RESPONSES: "a Responses API", MESSAGES: "an Anthropic Messages"}.get(api, "a Chat Completions")
        lines.append([(NOTE, f"not the response of an LLM call toolshim reads: shown as {what} body")])
    if upstream is None:
        lines += _body_lines(body, api, max_events, indent="")
    else:
        lines += [
            [(TITLE, "client got (rewritten by toolshim)")],
            *_body_lines(body, api, max_events, indent="  "),
            [],
            [(TITLE, "upstream sent (original)")],
            *_body_lines(upstream, api, max_events, indent="  "),
        ]
    # Names, ids and event types come from the body too: none may break a line.
    return [[(style, _CONTROL.sub(_escaped_char, text)) for style, text in line] for line in lines]


def _api_by_look(body: bytes) -> str:
    """The API a body of no known request looks like."""
    if b'"response.' in body or b'"object":"response"' in body:
        return RESPONSES
    if b'"message_start"' in body or re.match(rb'\s*\{\s*"(?:id|type)":\s*"(?:msg_|message")', body):
        return MESSAGES
    return CHAT


def _request_lines(info: Any) -> list[Line]:
    """The request's repairs as flow.metadata keeps them: one line per change, then the misses."""
    if not isinstance(info, dict):
        return []
    changes = [change for change in info.get("repairs") or () if isinstance(change, dict)]
    missing = [at for at in info.get("reasoning_missing") or () if isinstance(at, str)]
    if not changes and not missing:
        return []
    lines: list[Line] = [[(TITLE, "request repaired by toolshim")]]
    for change in changes:
        detail = [(FIELD, f"  {name}={value}") for name, value in change.items() if name not in ("repair", "at")]
        lines.append([(EVENT, f"  {change.get('repair')}"), (FIELD, f"  {change.get('at')}"), *detail])
    for at in missing:
        lines.append([(NOTE, f"  reasoning not known for {at}: left as the client sent it")])
    lines.append([])
    return lines


def plain_text(lines: Iterable[Line]) -> str:
    """The lines without their styles, one text line each."""
    return "\n".join("".join(text for _, text in line) for line in lines)


# -- one body ----------------------------------------------------------------------------------------


def _body_lines(body: bytes, api: str, max_events: int, indent: str) -> list[Line]:
    """The events and the result of one body, or its result only when it is JSON."""
    reading: Reading = ResponsesReading() if api == RESPONSES else MessagesReading() if api == MESSAGES else ChatReading()
    inner = indent + "  "
    out: list[Line] = []
    try:
        if not body.strip():
            out.append([(NOTE, indent + "(empty body)")])
        elif body.lstrip()[:1] in (b"{", b"["):
            out.append([(TITLE, indent + "result (JSON body, not streamed)")])
            document = orjson.loads(body.decode("utf-8", "replace"))
            if not isinstance(document, dict):
                raise ValueError(f"the body is a JSON {_json_kind(document)}, not an object")
            reading.read_document(document)
            out += _indented(reading.result(), inner)
        else:
            out.append([(TITLE, indent + "events")])
            out += _indented(_event_lines(body.decode("utf-8", "replace"), reading, max_events), inner)
            out.append([(TITLE, indent + "result")])
            out += _indented(reading.result(), inner)
    except Exception as exc:  # a content view must not raise: keep what was shown, say why it stopped
        out.append([(ERROR, f"{inner}error: {exc}")])
    return out


def _indented(lines: Iterable[Line], indent: str) -> list[Line]:
    return [[(PLAIN, indent), *line] if indent else line for line in lines]


# -- SSE events --------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Block:
    """One SSE event as written: data lines joined with "\\n" (None without any), its `event:`
    name, and its comment lines."""

    data: str | None = None
    event: str | None = None
    comments: list[str] = field(default_factory=list)


def _sse_blocks(text: str) -> Iterator[_Block]:
    block, data, seen = _Block(), [], False
    for line in _SSE_LINE_END.split(text):
        if not line:
            if seen:
                block.data = "\n".join(data) if data else None
                yield block
                block, data, seen = _Block(), [], False
            continue
        seen = True
        if line.startswith(":"):
            block.comments.append(line[1:].strip())
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            block.event = value
    if seen:  # a body cut inside its last event
        block.data = "\n".join(data) if data else None
        yield block


@dataclass(slots=True)
class Quoted:
    """Text to show quoted. `channel` and `offset` place it in its channel's whole text, where
    leaked markup is looked for; without a channel, the text is searched on its own."""

    text: str
    channel: Hashable | None = None
    offset: int = 0


Piece = Segment | Quoted  # of an event line whose markup is not yet resolved


class Reading(Protocol):
    """What the events or the JSON body of one API are read into: ChatReading, ResponsesReading,
    MessagesReading."""

    channels: Channels

    def read_event(self, payload: dict[str, Any], sse_event: str | None) -> tuple[str, list[Piece]]:
        """Take one event (its JSON and its SSE `event:` name); return its type and its line."""

    def read_document(self, body: dict[str, Any]) -> None:
        """Take a whole JSON answer."""

    def result(self) -> list[Line]:
        """What a client has built from everything taken."""


def _event_lines(text: str, reading: Reading, max_events: int) -> list[Line]:
    """One line per event (the first `max_events`); every event is read into `reading`."""
    rows: list[tuple[int, str, str, list[Piece]]] = []
    total = 0
    for block in _sse_blocks(text):
        total += 1
        try:
            kind, kind_style, pieces = _read_block(block, reading)
        except Exception as exc:  # one unreadable event does not hide the others
            kind, kind_style, pieces = "error", ERROR, [(ERROR, f"could not read this event: {exc!r}")]
        if total <= max_events:
            rows.append((total, kind, kind_style, pieces))
    if not rows:
        return [[(NOTE, "(no events)")]]
    width = min(max(len(kind) for _, kind, _, _ in rows), 40)
    lines = [
        [(NUMBER, f"{number:>5}"), (PLAIN, "  "), (kind_style, kind.ljust(width)), (PLAIN, "  "), *_resolve(pieces, reading.channels)]
        if pieces
        else [(NUMBER, f"{number:>5}"), (PLAIN, "  "), (kind_style, kind)]
        for number, kind, kind_style, pieces in rows
    ]
    if total > max_events:
        lines.append([(NOTE, f"… {total - max_events} more events (the result reads them all)")])
    return lines


def _read_block(block: _Block, reading: Reading) -> tuple[str, str, list[Piece]]:
    """An event's type, the style of its type, and what its line shows."""
    if block.data is None:
        if block.comments:
            return "comment", NOTE, [(NOTE, "".join(f": {comment}" for comment in block.comments))]
        return block.event or "(no data)", NOTE, []
    if block.data.strip() == "[DONE]":
        return "[DONE]", EVENT, []
    try:
        payload = orjson.loads(block.data)
    except orjson.JSONDecodeError:
        return "data", NOTE, [(NOTE, "not JSON: "), Quoted(block.data)]
    if not isinstance(payload, dict):
        return "data", NOTE, [(NOTE, f"a JSON {_json_kind(payload)}, not an event: "), Quoted(block.data)]
    kind, pieces = reading.read_event(payload, block.event)
    return kind, EVENT, pieces


def _joined(parts: list[list[Piece]]) -> list[Piece]:
    out: list[Piece] = []
    for part in parts:
        if out:
            out.append((PLAIN, "  "))
        out += part
    return out


def _scalar(label: str, value: Any) -> list[Piece]:
    return [(FIELD, label), (PLAIN, "=" + _shown(value))]


def _shown(value: Any) -> str:
    """A string as it is, None as `(none)` (a stream cut before its end), else compact JSON."""
    if value is None:
        return "(none)"
    return value if isinstance(value, str) else _compact(value)


def _compact(value: Any) -> str:
    return orjson.dumps(value).decode()


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {list: "array", str: "string", dict: "object"}.get(type(value), "null")


# -- channels and markup -----------------------------------------------------------------------------


Spans = tuple[list[int], list[int]]  # starts and ends of the markup found in a text, in order


def _markup_spans(text: str) -> Spans:
    starts, ends = [], []
    for match in LEAKED_MARKUP.finditer(text):
        starts.append(match.start())
        ends.append(match.end())
    return starts, ends


class Channels:
    """The whole text of each channel, gathered piece by piece, and where markup sits in it."""

    def __init__(self) -> None:
        self._pieces: dict[Hashable, list[str]] = {}
        self._lengths: dict[Hashable, int] = {}
        self._spans: dict[Hashable, Spans] = {}

    def append(self, channel: Hashable, text: str) -> Quoted:
        """Add a piece; return it placed in the channel, for an event line."""
        offset = self._lengths.get(channel, 0)
        self._pieces.setdefault(channel, []).append(text)
        self._lengths[channel] = offset + len(text)
        self._spans.pop(channel, None)
        return Quoted(text, channel, offset)

    def __contains__(self, channel: Hashable) -> bool:
        return channel in self._pieces

    def text(self, channel: Hashable) -> str:
        pieces = self._pieces.get(channel, [])
        if len(pieces) > 1:  # joined once, then kept joined
            pieces[:] = ["".join(pieces)]
        return pieces[0] if pieces else ""

    def spans(self, channel: Hashable) -> Spans:
        if channel not in self._spans:
            self._spans[channel] = _markup_spans(self.text(channel))
        return self._spans[channel]


def _resolve(pieces: list[Piece], channels: Channels) -> Line:
    line: Line = []
    for piece in pieces:
        if isinstance(piece, Quoted):
            spans = channels.spans(piece.channel) if piece.channel is not None else _markup_spans(piece.text)
            line += _quoted(piece.text, piece.offset, spans)
        else:
            line.append(piece)
    return line


def _quoted(text: str, offset: int, spans: Spans) -> Line:
    """An event's `text` quoted and escaped, its markup highlighted, cut after MAX_EVENT_TEXT
    characters."""
    left_out = max(len(text) - MAX_EVENT_TEXT, 0)
    text = text[:MAX_EVENT_TEXT]
    quote = _quote_for(text)
    line = [(MODEL_TEXT, quote), *_marked(text, offset, spans, quote), (MODEL_TEXT, quote)]
    if left_out:
        line.append((NOTE, f" …+{left_out} characters"))
    return line


def _quote_for(text: str) -> str:
    """Python's choice: single quotes, unless only they occur in the text."""
    return '"' if "'" in text and '"' not in text else "'"


def _marked(text: str, offset: int, spans: Spans, quote: str | None) -> Line:
    """`text`, which starts at `offset` of a channel with markup at `spans`, as model text and
    highlighted markup; escaped for quoting with `quote`, or shown as it is when None (a string
    of JSON, escaped already)."""
    shown = (lambda piece: piece) if quote is None else (lambda piece: _escape(piece, quote))
    starts, ends = spans
    line: Line = []
    position = 0  # in `text`
    index = bisect_right(ends, offset)  # the first span ending after the text starts
    while index < len(starts) and starts[index] < offset + len(text):
        begin = max(starts[index] - offset, 0)
        end = min(ends[index] - offset, len(text))
        if begin > position:
            line.append((MODEL_TEXT, shown(text[position:begin])))
        line.append((MARKUP, shown(text[begin:end])))
        position = end
        index += 1
    if position < len(text):
        line.append((MODEL_TEXT, shown(text[position:])))
    return line


def _escape(text: str, quote: str) -> str:
    """`text` as it shows between `quote`s, as Python writes a string."""
    return _IN_QUOTES.sub(lambda match: "\\" + quote if match.group() == quote else _escaped_char(match), text)


def _escaped_char(match: re.Match[str]) -> str:
    char = match.group()
    if char in _ESCAPES:
        return _ESCAPES[char]
    if char in "'\"":  # the quote not in use
        return char
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


# -- result lines ------------------------------------------------------------------------------------


def _text_lines(label: str, text: str) -> list[Line]:
    """`label: 'text'`, the text broken after each newline (as `\\n`), so a long answer reads
    as lines; continuation lines start under the opening quote."""
    spans = _markup_spans(text)
    quote = _quote_for(text)
    rows = text.split("\n")
    chunks = [row + "\n" for row in rows[:-1]] + ([rows[-1]] if rows[-1] or len(rows) == 1 else [])
    lines: list[Line] = []
    offset = 0
    for n, chunk in enumerate(chunks):
        head: Line = [(FIELD, label + ":"), (PLAIN, " "), (MODEL_TEXT, quote)] if n == 0 else [(PLAIN, " " * (len(label) + 3))]
        tail: Line = [(MODEL_TEXT, quote)] if n == len(chunks) - 1 else []
        lines.append(head + _marked(chunk, offset, spans, quote) + tail)
        offset += len(chunk)
    return lines


def _argument_lines(arguments: str) -> list[Line]:
    """Arguments as indented JSON, styled like mitmproxy's JSON view; as sent when no JSON."""
    if not arguments:
        return [[(NOTE, "(no arguments)")]]
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return [[(NOTE, "(not JSON; as sent:)")], *_text_lines("arguments", arguments)]
    return [_json_line(row) for row in orjson.dumps(value, option=orjson.OPT_INDENT_2).decode().split("\n")]


def _json_line(row: str) -> Line:
    line: Line = []
    position = 0
    for match in _JSON_TOKEN.finditer(row):
        if match.start() > position:
            line.append((PLAIN, row[position : match.start()]))
        string, colon, number, constant = match.groups()
        if string is not None and colon is not None:
            line += [(JSON_KEY, string), (PLAIN, colon)]
        elif string is not None:
            line += _marked(string, 0, _markup_spans(string), None)
        elif number is not None:
            line.append((JSON_NUMBER, number))
        else:
            line.append((JSON_CONSTANT, constant))
        position = match.end()
    if position < len(row):
        line.append((PLAIN, row[position:]))
    return line


def _call_lines(label: str, name: str, ids: str, arguments: str) -> list[Line]:
    head = [(FIELD, label + ":"), (PLAIN, " "), (TOOL_NAME, name or "(no name)"), (PLAIN, "  " + ids)]
    return [head, *_indented(_argument_lines(arguments), "  ")]


def _document_error(body: dict[str, Any]) -> Any:
    """The error a JSON body reports: OpenAI's `{"error": {...}}`, or vLLM's `{"object": "error", …}`."""
    return body if body.get("object") == "error" else body.get("error")


def _error_lines(errors: list[Any]) -> list[Line]:
    return [[(ERROR, "error: "), (PLAIN, _compact(error))] for error in errors]


# -- Chat Completions --------------------------------------------------------------------------------


@dataclass(slots=True)
class ChatCall:
    label: str  # tool_calls[N], or tool_calls[?] for entries without an index
    arguments: Hashable  # its channel
    id: str = ""
    name: str = ""


@dataclass(slots=True)
class ChatChoice:
    index: int
    fields: list[str] = field(default_factory=list)  # text fields seen, in order
    calls: dict[Hashable, ChatCall] = field(default_factory=dict)  # by index, or by id
    last_call: Hashable | None = None
    finish_reason: Any = None


class ChatReading:
    """What a Chat Completions stream or body says, gathered for its result."""

    def __init__(self) -> None:
        self.channels = Channels()
        self.choices: dict[int, ChatChoice] = {}
        self.usage: Any = None
        self.errors: list[Any] = []

    def read_event(self, chunk: dict[str, Any], sse_event: str | None) -> tuple[str, list[Piece]]:
        parts: list[list[Piece]] = []
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if isinstance(choice, dict):
                parts += self._delta(choice)
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
            parts.append(_scalar("usage", self.usage))
        if chunk.get("error") is not None:
            self.errors.append(chunk["error"])
            parts.append(_scalar("error", chunk["error"]))
        if not parts:
            parts.append([(NOTE, "(no choices)")])
        return ("error" if "error" in chunk and not choices else "chunk"), _joined(parts)

    def _delta(self, choice: dict[str, Any]) -> list[list[Piece]]:
        state = self._choice(choice.get("index", 0))
        prefix = "" if state.index == 0 else f"choices[{state.index}]."
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        parts: list[list[Piece]] = []
        if "role" in delta:
            parts.append(_scalar(prefix + "role", delta["role"]))
        texts = {name: delta[name] for name in _TEXT_FIELDS if isinstance(delta.get(name), str)}
        for text in dict.fromkeys(texts.values()):  # mirrored fields: one part
            names = [name for name, value in texts.items() if value == text]
            placed = [self._add_text(state, name, text) for name in names]
            parts.append([(FIELD, prefix + "/".join(names)), (PLAIN, " "), placed[0]])
        entries = delta.get("tool_calls")
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict):
                parts += self._call_entry(state, entry, prefix)
        if choice.get("finish_reason") is not None:
            state.finish_reason = choice["finish_reason"]
            parts.append(_scalar(prefix + "finish_reason", state.finish_reason))
        if choice.get("error") is not None:
            self.errors.append(choice["error"])
            parts.append(_scalar(prefix + "error", choice["error"]))
        return parts or [[(FIELD, prefix + "delta"), (PLAIN, "={}")]]

    def _call_entry(self, state: ChatChoice, entry: dict[str, Any], prefix: str) -> list[list[Piece]]:
        function = entry.get("function") if isinstance(entry.get("function"), dict) else {}
        call = self._call(state, entry.get("index"), entry.get("id"))
        header: list[Piece] = []
        if isinstance(function.get("name"), str) and function["name"]:
            call.name = call.name or function["name"]
            header += [(PLAIN, " "), *_scalar("name", function["name"])]
        if isinstance(entry.get("id"), str) and entry["id"]:
            call.id = call.id or entry["id"]
            header += [(PLAIN, " "), *_scalar("id", entry["id"])]
        parts = [[(FIELD, prefix + call.label), *header]] if header else []
        arguments = function.get("arguments")
        if arguments is not None and (arguments != "" or not header):
            label = prefix + call.label + ".arguments"
            if not isinstance(arguments, str):  # a broken upstream's object: shown, and kept, as JSON
                label, arguments = label + " (not a string)", _compact(arguments)
            parts.append([(FIELD, label), (PLAIN, " "), self.channels.append(call.arguments, arguments)])
        return parts

    def _choice(self, index: Any) -> ChatChoice:
        index = index if isinstance(index, int) else 0
        if index not in self.choices:
            self.choices[index] = ChatChoice(index)
        return self.choices[index]

    def _add_text(self, state: ChatChoice, name: str, text: str) -> Quoted:
        if name not in state.fields:
            state.fields.append(name)
        return self.channels.append((state.index, name), text)

    def _call(self, state: ChatChoice, index: Any, call_id: Any) -> ChatCall:
        """The call an entry belongs to: by its index; without one, by its id, else the last."""
        if isinstance(index, int) and not isinstance(index, bool):
            key, label = index, f"tool_calls[{index}]"
        else:
            key = ("id", call_id) if isinstance(call_id, str) and call_id else state.last_call
            label = "tool_calls[?]"
        if key not in state.calls:
            state.calls[key] = ChatCall(label, (state.index, "tool_calls", len(state.calls)))
        state.last_call = key
        return state.calls[key]

    def read_document(self, body: dict[str, Any]) -> None:
        choices = body.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict):
                continue
            state = self._choice(choice.get("index", 0))
            message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
            for name in _TEXT_FIELDS:
                if isinstance(message.get(name), str):
                    self._add_text(state, name, message[name])
            calls = message.get("tool_calls")
            for n, entry in enumerate(calls if isinstance(calls, list) else []):
                if not isinstance(entry, dict):
                    continue
                function = entry.get("function") if isinstance(entry.get("function"), dict) else {}
                call = self._call(state, n, None)
                call.id, call.name = str(entry.get("id") or ""), str(function.get("name") or "")
                arguments = function.get("arguments")
                self.channels.append(call.arguments, arguments if isinstance(arguments, str) else _compact(arguments))
            state.finish_reason = choice.get("finish_reason")
        self.usage = body.get("usage")
        if _document_error(body) is not None:
            self.errors.append(_document_error(body))

    def result(self) -> list[Line]:
        lines: list[Line] = []
        several = len(self.choices) > 1 or any(index != 0 for index in self.choices)
        for index in sorted(self.choices):
            choice_lines = self._choice_lines(self.choices[index])
            if several:
                lines += [[(FIELD, f"choices[{index}]")], *_indented(choice_lines, "  ")]
            else:
                lines += choice_lines
        if self.usage is not None:
            lines.append([(FIELD, "usage:"), (PLAIN, " " + _compact(self.usage))])
        lines += _error_lines(self.errors)
        return lines or [[(NOTE, "(no choices)")]]

    def _choice_lines(self, state: ChatChoice) -> list[Line]:
        lines: list[Line] = []
        texts = {name: self.channels.text((state.index, name)) for name in _TEXT_FIELDS if name in state.fields}
        for text in dict.fromkeys(text for text in texts.values() if text):
            lines += _text_lines("/".join(name for name, value in texts.items() if value == text), text)
        for call in state.calls.values():
            lines += _call_lines(call.label, call.name, f"id={call.id}", self.channels.text(call.arguments))
        if not lines:
            lines.append([(NOTE, "(no text, no tool calls)")])
        lines.append([(FIELD, "finish_reason:"), (PLAIN, " " + _shown(state.finish_reason))])
        return lines


# -- Responses API -----------------------------------------------------------------------------------


@dataclass(slots=True)
class OutputItem:
    kind: str  # its type: message, reasoning, function_call, …
    id: str = ""
    name: str = ""
    call_id: str = ""


def _item_texts(item: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(channel, text) of what an output item holds, its content parts joined by channel."""
    gathered: dict[str, str] = {}
    for key in ("content", "summary"):
        parts = item.get(key)
        for part in parts if isinstance(parts, list) else []:
            if isinstance(part, dict) and part.get("type") in _PART_CHANNELS:
                text = part.get("text", part.get("refusal"))
                if isinstance(text, str):
                    channel = _PART_CHANNELS[part["type"]]
                    gathered[channel] = gathered.get(channel, "") + text
    if isinstance(item.get("arguments"), str):
        gathered["arguments"] = item["arguments"]
    yield from gathered.items()


class ResponsesReading:
    """What a Responses API stream or body says, gathered for its result."""

    def __init__(self) -> None:
        self.channels = Channels()
        self.items: dict[int, OutputItem] = {}
        self.status: Any = None
        self.usage: Any = None
        self.errors: list[Any] = []

    def read_event(self, event: dict[str, Any], sse_event: str | None) -> tuple[str, list[Piece]]:
        kind = event.get("type") if isinstance(event.get("type"), str) else sse_event or "data"
        parts: list[list[Piece]] = []
        index = event.get("output_index")
        if isinstance(index, int):
            item = event.get("item")
            if kind in ("response.output_item.added", "response.output_item.done") and isinstance(item, dict):
                self._note_item(index, item, done=kind.endswith(".done"))
            parts.append(self._where(index, with_call_id=kind.startswith("response.output_item.")))
        delta = event.get("delta")
        if isinstance(delta, str):
            channel = _DELTA_CHANNELS.get(kind)
            if channel is not None and isinstance(index, int):
                parts.append([self.channels.append((index, channel), delta)])
            else:
                parts.append([Quoted(delta)])
        for key in ("text", "arguments", "refusal"):
            if isinstance(event.get(key), str):
                parts.append([(FIELD, key), (PLAIN, " "), Quoted(event[key])])
        part = event.get("part")
        if isinstance(part, dict):
            parts.append([(FIELD, str(part.get("type"))), *([(PLAIN, " "), Quoted(part["text"])] if part.get("text") else [])])
        response = event.get("response")
        if isinstance(response, dict):
            parts += self._read_response(response, terminal=kind in _TERMINAL_EVENTS)
        if kind == "error":
            self.errors.append({key: event[key] for key in ("code", "message", "param") if key in event})
            parts.append(_scalar("message", event.get("message")))
        return kind, _joined(parts)

    def _where(self, index: int, with_call_id: bool) -> list[Piece]:
        """`[N] type name` of the output item an event is about."""
        item = self.items.get(index)
        if item is None:
            return [(FIELD, f"[{index}]")]
        shown = [(FIELD, f"[{index}] {item.kind}")]
        if item.name:
            shown.append((PLAIN, " " + item.name))
        if with_call_id and item.call_id:
            shown.append((PLAIN, f" call_id={item.call_id}"))
        return shown

    def _note_item(self, index: int, item: dict[str, Any], done: bool) -> None:
        known = self.items.setdefault(index, OutputItem(str(item.get("type") or "?")))
        known.id = known.id or str(item.get("id") or "")
        known.name = known.name or str(item.get("name") or "")
        known.call_id = known.call_id or str(item.get("call_id") or "")
        if done:  # what no delta sent
            for channel, text in _item_texts(item):
                if (index, channel) not in self.channels:
                    self.channels.append((index, channel), text)

    def _read_response(self, response: dict[str, Any], terminal: bool) -> list[list[Piece]]:
        parts: list[list[Piece]] = []
        if response.get("status") is not None:
            self.status = response["status"]
            parts.append(_scalar("status", self.status))
        if response.get("usage") is not None:
            self.usage = response["usage"]
            parts.append(_scalar("usage", self.usage))
        if response.get("error") is not None:
            self.errors.append(response["error"])
            parts.append(_scalar("error", response["error"]))
        output = response.get("output")
        if terminal and not self.items and isinstance(output, list):
            for index, item in enumerate(output):
                if isinstance(item, dict):
                    self._note_item(index, item, done=True)
        return parts

    def read_document(self, body: dict[str, Any]) -> None:
        self._read_response(body, terminal=True)
        if body.get("object") == "error":  # a response object's own `error` was read just now
            self.errors.append(body)

    def result(self) -> list[Line]:
        lines: list[Line] = []
        for index in sorted(self.items):
            item = self.items[index]
            label = f"[{index}] {item.kind}"
            if item.kind == "function_call":
                ids = f"call_id={item.call_id}  id={item.id}"
                lines += _call_lines(label, item.name, ids, self.channels.text((index, "arguments")))
                continue
            channels = [channel for channel in _ITEM_TEXT_CHANNELS if (index, channel) in self.channels]
            for channel in channels:
                shown = label if channel in ("text", "reasoning") else f"{label} {channel}"
                lines += _text_lines(shown, self.channels.text((index, channel)))
            if not channels:
                lines.append([(FIELD, label)])
        if not self.items:
            lines.append([(NOTE, "(no output items)")])
        lines.append([(FIELD, "status:"), (PLAIN, " " + _shown(self.status))])
        if self.usage is not None:
            lines.append([(FIELD, "usage:"), (PLAIN, " " + _compact(self.usage))])
        return lines + _error_lines(self.errors)


# -- Anthropic Messages API --------------------------------------------------------------------------

_BLOCK_TEXT = {"text_delta": "text", "thinking_delta": "thinking"}  # delta type -> the field it adds to


@dataclass(slots=True)
class ContentBlock:
    kind: str  # its type: text, thinking, tool_use, redacted_thinking, server_tool_use, …
    id: str = ""
    name: str = ""
    signature: str | None = None  # a thinking block's; None: none was given
    start_input: Any = None  # a tool_use start's `input`, the input when no piece follows
    pieces: bool = False  # a tool_use got input_json_delta pieces
    other: dict[str, Any] = field(default_factory=dict)  # a block this view does not read: as it came


class MessagesReading:
    """What an Anthropic Messages stream or body says, gathered for its result."""

    def __init__(self) -> None:
        self.channels = Channels()
        self.blocks: dict[int, ContentBlock] = {}
        self.stop_reason: Any = None
        self.stop_sequence: Any = None
        self.usage: Any = None
        self.errors: list[Any] = []
        self.error_body = False  # a JSON answer that is an error, not a message

    def read_event(self, event: dict[str, Any], sse_event: str | None) -> tuple[str, list[Piece]]:
        kind = event.get("type") if isinstance(event.get("type"), str) else sse_event or "data"
        parts: list[list[Piece]] = []
        index = event.get("index")
        if isinstance(index, int) and not isinstance(index, bool):
            block = event.get("content_block")
            if kind == "content_block_start" and isinstance(block, dict):
                parts += self._start(index, block)
            else:
                parts.append(self._where(index))
                delta = event.get("delta")
                if isinstance(delta, dict):
                    parts.append(self._delta(index, delta))
        message = event.get("message")
        if kind == "message_start" and isinstance(message, dict):
            for key in ("id", "model"):
                if isinstance(message.get(key), str):
                    parts.append(_scalar(key, message[key]))
            if isinstance(message.get("usage"), dict):
                self.usage = dict(message["usage"])
                parts.append(_scalar("usage", message["usage"]))
        if kind == "message_delta":
            delta = event.get("delta") if isinstance(event.get("delta"), dict) else {}
            if "stop_reason" in delta:
                self.stop_reason = delta["stop_reason"]
                parts.append(_scalar("stop_reason", self.stop_reason))
            if delta.get("stop_sequence") is not None:
                self.stop_sequence = delta["stop_sequence"]
                parts.append(_scalar("stop_sequence", self.stop_sequence))
            if isinstance(event.get("usage"), dict):
                usage = {key: value for key, value in event["usage"].items() if value is not None}
                self.usage = {**(self.usage if isinstance(self.usage, dict) else {}), **usage}  # totals: they replace
                parts.append(_scalar("usage", event["usage"]))
        if kind == "error":
            self.errors.append(event.get("error"))
            parts.append(_scalar("error", event.get("error")))
        return kind, _joined(parts)

    def _where(self, index: int) -> list[Piece]:
        """`[N] type name` of the block an event is about."""
        block = self.blocks.get(index)
        if block is None:
            return [(FIELD, f"[{index}]")]
        return [(FIELD, f"[{index}] {block.kind}"), *([(PLAIN, " " + block.name)] if block.name else [])]

    def _start(self, index: int, start: dict[str, Any]) -> list[list[Piece]]:
        kind = str(start.get("type") or "?")
        block = ContentBlock(kind, id=str(start.get("id") or ""), name=str(start.get("name") or ""))
        self.blocks[index] = block
        parts = [self._where(index)]
        if kind == "tool_use" or "id" in start:
            parts.append(_scalar("id", block.id))
        for field_name in ("text", "thinking"):
            if isinstance(start.get(field_name), str) and kind == field_name:
                if start[field_name]:  # text given at the start (a non-streamed body's, say)
                    parts.append([self.channels.append((index, field_name), start[field_name])])
        if kind == "thinking" and isinstance(start.get("signature"), str):
            block.signature = start["signature"]
            if start["signature"]:
                parts.append([(FIELD, "signature"), (PLAIN, " "), Quoted(start["signature"])])
        if kind == "tool_use":
            block.start_input = start.get("input")
            if block.start_input not in (None, {}):
                parts.append(_scalar("input", block.start_input))
        elif kind not in ("text", "thinking"):
            block.other = {key: value for key, value in start.items() if key != "type"}
        return parts

    def _delta(self, index: int, delta: dict[str, Any]) -> list[Piece]:
        kind = delta.get("type")
        block = self.blocks.get(index)
        if kind in _BLOCK_TEXT and isinstance(delta.get(_BLOCK_TEXT[kind]), str):
            return [self.channels.append((index, _BLOCK_TEXT[kind]), delta[_BLOCK_TEXT[kind]])]
        if kind == "signature_delta":
            signature = delta.get("signature")
            if block is not None and isinstance(signature, str):
                block.signature = signature  # replaces, as the anthropic SDK does
            return [(FIELD, "signature"), (PLAIN, " "), Quoted(str(signature))]
        if kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            if block is not None:
                block.pieces = True
            return [self.channels.append((index, "input"), delta["partial_json"])]
        return [(FIELD, str(kind)), (PLAIN, " " + _compact({key: value for key, value in delta.items() if key != "type"}))]

    def read_document(self, body: dict[str, Any]) -> None:
        if body.get("type") == "error":
            self.errors.append(body.get("error"))
            self.error_body = True
            return
        content = body.get("content")
        for index, item in enumerate(content if isinstance(content, list) else []):
            if not isinstance(item, dict):
                continue
            self._start(index, {**item, "input": None} if item.get("type") == "tool_use" else item)
            if item.get("type") == "tool_use" and "input" in item:
                given = item["input"]
                self.channels.append((index, "input"), given if isinstance(given, str) else _compact(given))
        self.stop_reason, self.stop_sequence = body.get("stop_reason"), body.get("stop_sequence")
        self.usage = body.get("usage")

    def result(self) -> list[Line]:
        lines: list[Line] = []
        for index in sorted(self.blocks):
            block = self.blocks[index]
            label = f"[{index}] {block.kind}"
            if block.kind == "tool_use":
                if (index, "input") in self.channels:
                    arguments = self.channels.text((index, "input"))
                else:
                    arguments = "" if block.start_input is None else _compact(block.start_input)
                lines += _call_lines(label, block.name, f"id={block.id}", arguments)
            elif block.kind in ("text", "thinking"):
                lines += _text_lines(label, self.channels.text((index, block.kind)))
                if block.kind == "thinking":
                    lines.append([(FIELD, f"{label} signature:"), (PLAIN, " "), *_signature(block.signature)])
            else:
                lines.append([(FIELD, label), *([(PLAIN, " " + _compact(block.other))] if block.other else [])])
        if self.error_body:
            return _error_lines(self.errors)
        if not self.blocks:
            lines.append([(NOTE, "(no content blocks)")])
        lines.append([(FIELD, "stop_reason:"), (PLAIN, " " + _shown(self.stop_reason))])
        if self.stop_sequence is not None:
            lines.append([(FIELD, "stop_sequence:"), (PLAIN, " " + _shown(self.stop_sequence))])
        if self.usage is not None:
            lines.append([(FIELD, "usage:"), (PLAIN, " " + _compact(self.usage))])
        return lines + _error_lines(self.errors)


def _signature(signature: str | None) -> Line:
    """A thinking block's signature, quoted, or `(none)` when it has none at all."""
    if signature is None:
        return [(NOTE, "(none)")]
    quote = _quote_for(signature)
    return [(MODEL_TEXT, quote + _escape(signature, quote) + quote)]
