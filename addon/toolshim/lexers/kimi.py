"""Kimi K2 / K2-Thinking / K2.5 tool-call markup.

    <|tool_calls_section_begin|>
    <|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>{json}<|tool_call_end|>
    <|tool_calls_section_end|>

Accepted as well: singular section tokens, calls with no section around them, calls with no
`<|tool_call_end|>` (the next call or the section end closes them), a section end missing its
final `>`, the paper's `<|tool_arguments_begin|>`, and any whitespace around the markers
(servers that keep special tokens decode them with a space on each side: padding, not text).
In a reasoning channel a `</think>` after a section ends the reasoning. Live arguments,
whitespace and `finish()` follow tokens.py; in a section and after `</think>` the lead is DROP.

States (`_state`), and what moves between them:

    TEXT     --section begin-->  SECTION   --call begin-->  HEADER --argument begin--> ARGS
    TEXT     --call begin----->  HEADER                      HEADER --call end/section end--> (call with {})
    ARGS     --call end-------->  SECTION   ARGS --call begin--> HEADER   ARGS --section end--> TEXT
    SECTION  --section end---->  TEXT
    HEADER   --argument begin, header names no tool directly--> INFER (arguments held, name from keys)
    HEADER   --argument begin, header unusable--------------> VISIBLE (the call stays text)
"""

from __future__ import annotations

import re

import orjson

from ..calls import UNKNOWN_NAME, CallScope
from ..schema import _properties
from ..tools import TOOL_NAME
from .base import CallArgs, CallBegin, CallEnd, Marker, Match, ReasoningEnd, Segment, Text, excerpt, is_marker_fragment
from .tokens import ARGS, DROP, HOLD, KEEP, MAX_HEADER, TEXT, THINK_END, VISIBLE, TokenLexer

SECTION_BEGIN, SECTION_END = "section_begin", "section_end"
CALL_BEGIN, ARGUMENT_BEGIN, CALL_END = "call_begin", "argument_begin", "call_end"

_KIMI_MARKERS = (
    Marker("<|tool_calls_section_begin|>", SECTION_BEGIN),
    Marker("<|tool_call_section_begin|>", SECTION_BEGIN),
    Marker("<|tool_calls_section_end|>", SECTION_END),
    Marker("<|tool_call_section_end|>", SECTION_END),
    Marker("<|tool_calls_section_end|", SECTION_END),  # truncated spelling seen in the wild
    Marker("<|tool_call_section_end|", SECTION_END),
    Marker("<|tool_call_begin|>", CALL_BEGIN),
    Marker("<|tool_call_argument_begin|>", ARGUMENT_BEGIN),
    Marker("<|tool_arguments_begin|>", ARGUMENT_BEGIN),  # the K2 tech report's spelling
    Marker("<|tool_call_end|>", CALL_END),
)

# The markers a piece may be whole (each is one token of Kimi's vocabulary, so it nearly always
# comes as a piece of its own): all but the truncated spellings, which begin a longer marker and
# are read only when no `>` follows (`find_marker`).
_WHOLE_MARKERS = {m.text: m for m in _KIMI_MARKERS if not any(o.text != m.text and o.text.startswith(m.text) for o in _KIMI_MARKERS)}

SECTION, HEADER, INFER = "section", "header", "infer"

_CANONICAL_HEADER = re.compile(r"(?:functions\.)?(?P<name>[A-Za-z0-9_-]{1,64}):(?P<n>\d+)")
_ODD_PREFIX = re.compile(r"^(?:functions|call)[._]?")
_ODD_COUNTER = re.compile(r"[:._]?\d+$")


def _header_core(header: str) -> str:
    """What is left of an odd header once its prefix and counter are gone."""
    return _ODD_COUNTER.sub("", _ODD_PREFIX.sub("", header)).strip()


class KimiCallNamer:
    """Turns call headers into (id, name), per choice: ids stay unique within the response. The
    id is the header verbatim (the model copies ids from the history, and rewritten ids make it
    degrade); an id is minted as `functions.NAME:N` only when the header is unusable."""

    def __init__(self, scope: CallScope) -> None:
        self.scope = scope
        self._tools = scope.tools
        self._next_counter = scope.context.next_kimi_counter

    def name_for(self, header: str) -> str | None:
        """The tool a header names, or None when only the arguments can tell (or nothing can).

        Order (research: parsers.md section 5): strip `functions.` and `:N`; a declared name
        wins. Odd spellings (`functionsexec5`, `functions_NAME_3`, `call00003`) lose a leading
        `functions`/`call` and a trailing counter: a declared name left is the name; nothing left
        (a bare counter) means the only declared tool, or the arguments tell. A name that is
        left but not declared stays visible: `functions.invalid_get_weather.0` is no call to
        `valid_get_weather`. Without declared tools only the canonical spellings are trusted.
        """
        header = header.strip()
        canonical = _CANONICAL_HEADER.fullmatch(header)
        if canonical:
            self._next_counter = max(self._next_counter, int(canonical.group("n")) + 1)
            name = canonical.group("name")
            if not self._tools or name in self._tools:
                return name
            return None  # a tool the client never declared: keep it visible
        if not self._tools:
            bare = header.removeprefix("functions.")
            return bare if header.startswith("functions.") and TOOL_NAME.fullmatch(bare) else None
        core = _header_core(header)
        if core in self._tools:
            return core
        if not core and len(self._tools) == 1:
            return next(iter(self._tools))
        return None

    def can_infer(self, header: str) -> bool:
        """Only a header naming nothing (a bare counter) leaves the name to the arguments."""
        return len(self._tools) > 1 and bool(header.strip()) and not _header_core(header.strip())

    def name_from_arguments(self, arguments: str) -> str | None:
        """Pick the declared tool whose parameters best fit the argument keys (unique best)."""
        try:
            parsed = orjson.loads(arguments) if arguments.strip() else {}
        except orjson.JSONDecodeError:
            return None
        if not isinstance(parsed, dict):
            return None
        keys = set(parsed)
        scored = []
        for name, spec in self._tools.items():
            params = set(_properties(spec) or ())
            if keys & params or not keys:
                scored.append((len(keys & params) - len(keys - params), name))
        scored.sort(reverse=True)
        if not scored or (len(scored) > 1 and scored[0][0] == scored[1][0]):
            return None
        return scored[0][1]

    def id_for(self, header: str, name: str) -> str:
        header = header.strip()
        usable = 0 < len(header) <= 128 and not header.isdigit() and len(header.split()) == 1  # (no space within)
        if usable and not self.scope.id_taken(header):
            call_id = header
        else:
            call_id = f"functions.{name}:{self._next_counter}"
            self._next_counter += 1
        return self.scope.claim_id(call_id)


class KimiLexer(TokenLexer):
    """Incremental lexer for one channel of one choice (see the module docstring)."""
    def __init__(self, namer: KimiCallNamer, *, reasoning: bool = False, max_held: int = 1 << 20) -> None:
        super().__init__(namer.scope, max_held=max_held)
        self._namer = namer
        self._reasoning = reasoning
        self._reset()
        self._seen_section = False

    def feed(self, text: str) -> list[Segment]:
        if "<" not in text and text and not self._buf and self._lead != HOLD:
            # No marker can begin in it (each starts with `<`), none is held unread, and no
            # whitespace at its end waits unread (`_text_end`): `_run` would `_take` it whole.
            if self._state == ARGS and self._args_sent:
                # The bulk of a tool-call stream, as `_take` passes it to `_args_text` (written out
                # here: each call a read runs costs its cache misses inside a busy proxy). The
                # lexer stays busy in ARGS: no idle state to report.
                if not self._ws and not text[-1].isspace():
                    return [CallArgs(text)]
                made = self._args_spaced(text)  # (a piece of prose arguments ends in a space one time in three)
                out: list[Segment] = [CallArgs(made)] if made else []
                if self._ws_len > self._max_held:
                    out.append(CallArgs(self._take_ws()))  # a flood of whitespace inside the arguments
                return out
            out = []
            self._take(text, out)
            self._report_idle()
            return out
        if not self._buf and (marker := _WHOLE_MARKERS.get(text)) is not None:
            # A whole marker and nothing unread before it (the commonest piece with a `<`): what
            # `_run` makes of it (no text before it, none after), without searching for it.
            out = []
            self._on_marker(marker, out)
            self._report_idle()
            return out
        return super().feed(text)

    # (`Lexer.steady_piece`'s verbatim state: live arguments with no whitespace held, as after
    # arguments made of a text that ends in none; only a `<` may begin a marker.)
    verbatim_stop = "<"

    def steady_piece(self, text: str, live: bool) -> str | None:
        """`Lexer.steady_piece`: a piece of a call's arguments streamed live (`feed`'s own
        commonest case), or of a call's header (held: ""), unless it may begin a marker, would
        hold more whitespace than the cap or make the header too long."""
        if self._buf or self._lead == HOLD or "<" in text or not text:
            return None
        state = self._state
        if state == ARGS and live and self._args_sent:
            if not self._ws and not text[-1].isspace():
                return text
            if self._ws_len + len(text) > self._max_held:
                return None  # (`feed` releases a flood of whitespace)
            return self._args_spaced(text)
        if state == HEADER and len(self._header) + len(text) <= MAX_HEADER:
            self._raw_add(text)  # (`_markup_add` of a header that stays short enough)
            self._header += text
            return ""
        return None

    def steady_bodies(self, bodies: list[bytes], live: bool) -> list[bytes] | None:
        """`steady_piece` for the pieces of a read at once, each given as its JSON string body
        (plain: printable ASCII, no `<`, escapes as orjson writes them; `bodies.plain_bodies`):
        the arguments made, as string bodies, one for each piece that holds more than whitespace.
        None: not all pieces of live arguments, or so much whitespace that `feed` might release
        it (nothing taken)."""
        if self._buf or self._lead == HOLD or self._state != ARGS or not live or not self._args_sent:
            return None
        if self._ws_len + sum(map(len, bodies)) > self._max_held:
            return None  # (a body is no shorter than its text: however the pieces end, the cap holds)
        # `_args_spaced` piece by piece: whitespace held goes in front of the next piece that
        # holds more, whitespace at a piece's end is held.
        held = orjson.dumps("".join(self._ws))[1:-1] if self._ws else b""
        made = []
        for body in bodies:
            if body[-1] != 32 and body[-2:-1] != b"\\":
                made.append(held + body if held else body)  # (no whitespace at its end, nor an escape)
                held = b""
                continue
            # Spaces at its end, the commonest whitespace there, are cut off as bytes (the only
            # whitespace a plain body holds raw); before them, an escape may end it (a `\n` is
            # whitespace too, a `\\n` is not): then it is decoded.
            solid = body.rstrip(b" ")
            if solid[-2:-1] == b"\\":
                text = orjson.loads(b'"' + body + b'"')
                stripped = text.rstrip()
                solid = body if stripped == text else orjson.dumps(stripped)[1:-1] if stripped else b""
            if solid:
                made.append(held + solid if held else solid)
                held = body[len(solid) :]  # (a plain body is orjson's encoding of its text)
            else:
                held += body
        if held:
            ws = orjson.loads(b'"' + held + b'"')
            self._ws.clear()
            self._ws.append(ws)
            self._ws_len = len(ws)
        elif self._ws:
            self._ws.clear()
            self._ws_len = 0
        return made

    def _args_spaced(self, text: str) -> str:
        """The arguments a piece in ARGS makes when whitespace is held or it ends in some:
        whitespace held goes in front of the next piece that is not only whitespace, and
        whitespace at a piece's end is held until more arguments come ("": nothing made)."""
        body = text.rstrip()
        made = ""
        if body:
            made = "".join(self._ws) + body if self._ws else body
            self._ws.clear()
            self._ws_len = 0
        if len(body) < len(text):
            end = text[len(body) :]
            self._ws.append(end)
            self._ws_len += len(end)
        return made

    def finish(self) -> list[Segment]:
        if self._state != TEXT:
            # A marker cut in half inside markup is markup, not text.
            cut = self._buf.rfind("<")
            if cut != -1 and is_marker_fragment(self._buf[cut:], _KIMI_MARKERS):
                self._buf = self._buf[:cut]
        out = self._run(final=True)
        if self._state == HEADER:  # cut off before the arguments began: the markup stays text
            self._release(out)
        elif self._state in (ARGS, INFER):
            self._close_call(out, "")
        self._report_idle()
        return out

    def _markers(self) -> tuple[Marker, ...]:
        if self._reasoning and self._seen_section and self._state in (TEXT, SECTION):
            return _KIMI_MARKERS + (THINK_END,)
        return _KIMI_MARKERS

    def _text_end(self, buf: str, pos: int, match: Match | None, final: bool) -> int:
        end = len(buf) if match is None else match.pos
        if match is not None and match.marker is not None:
            if self._state != TEXT or match.marker.kind not in (SECTION_BEGIN, CALL_BEGIN):
                return end
            # The space decoded before a section or call begin is its padding (module docstring).
            return pos + len(buf[pos:end].rstrip())
        if final or not (self._lead == HOLD or (match is not None and self._state == TEXT)):
            return end
        # Whitespace at the end may be padding before the next marker: left unread until more
        # arrives (bounded: a flood of spaces still flows). Also before a possible marker, as in
        # the other dialects: sent early, it would stay where one piece with the marker drops it.
        text_end = pos + len(buf[pos:end].rstrip())
        return text_end if end - text_end < self._max_held else end

    def _take(self, text: str, out: list[Segment]) -> None:
        state = self._state
        if state in (TEXT, SECTION):
            # In a section only the whitespace right after a marker is padding (DROP): stripping
            # every piece would lose spaces between words sent as tokens (" world"; fuzzing).
            if self._lead == DROP:
                text = text.lstrip()
            elif self._lead == HOLD and text.isspace():
                return  # whitespace-only between markup and markup or the end: padding
            if not text:
                return
            self._lead = KEEP
            out.append(Text(text))
        elif state == ARGS:
            self._args_text(text, out)
        elif state == HEADER:
            self._markup_add(text, out, header=True)
        elif state == INFER:
            self._raw_add(text)
            if self._raw_len - self._args_from > self._max_held:
                self._release(out)
        else:  # VISIBLE
            out.append(Text(text))

    def _on_marker(self, marker: Marker, out: list[Segment]) -> None:
        kind, state = marker.kind, self._state
        self._take_ws()  # whitespace at the end of live arguments: any marker drops it
        if state in (HEADER, ARGS, INFER):
            if kind == ARGUMENT_BEGIN and state == HEADER:
                self._raw_add(marker.text)
                self._open_call(out)
                return
            if kind not in (CALL_BEGIN, CALL_END, SECTION_END):
                return  # a stray marker inside a call is dropped
            if state == HEADER:  # a call with no arguments at all
                self._open_call(out)
            # A call begin is not part of the call it closes: it opens the next one.
            self._close_call(out, "" if kind == CALL_BEGIN else marker.text)
        elif state == VISIBLE:
            if kind != CALL_BEGIN:  # a new call gets its own chance
                out.append(Text(marker.text))  # the call stays text, markers and all
        elif marker is THINK_END:  # in TEXT or SECTION
            out.append(ReasoningEnd())
            self._state, self._lead = TEXT, DROP
            return
        elif kind == SECTION_BEGIN:  # in TEXT or SECTION
            self._seen_section = True
            self._state, self._lead = SECTION, DROP
            return
        if kind == CALL_BEGIN:
            self._seen_section = True
            self._reset_call()
            self._raw_add(marker.text)
            self._state = HEADER
        elif kind == SECTION_END:
            self._state, self._lead = TEXT, HOLD
        elif kind == CALL_END and state not in (TEXT, SECTION):
            self._state, self._lead = SECTION, DROP
        elif state == TEXT:
            self._lead = HOLD  # a stray marker: dropped with its padding

    def _open_call(self, out: list[Segment]) -> None:
        name = self._namer.name_for(self._header)
        if name is not None and self._scope.admit(name):
            out.append(CallBegin(self._namer.id_for(self._header, name), name))
            self._state = ARGS
        elif name is None and self._namer.can_infer(self._header):
            self._state = INFER
            self._body_start, self._args_from = len(self._raw), self._raw_len  # the held arguments: in parts, in characters
        else:
            if name is None:
                self._scope.note(UNKNOWN_NAME, f"{excerpt(self._header)} names no declared tool")
            self._release(out)

    def _close_call(self, out: list[Segment], closing_marker: str) -> None:
        if self._state == ARGS:
            self._close_args(out)
        elif self._state == INFER:
            arguments = self._raw_text(self._body_start).strip()
            name = self._namer.name_from_arguments(arguments)
            if name is None:
                self._scope.note(UNKNOWN_NAME, f"{excerpt(self._header)}: its arguments fit no declared tool")
            if name is None or not self._scope.admit(name):
                out.append(Text(self._raw_text() + closing_marker))
            else:
                out.extend((CallBegin(self._namer.id_for(self._header, name), name), CallArgs(arguments or "{}"), CallEnd()))
        elif self._state == VISIBLE and closing_marker:
            out.append(Text(closing_marker))
        self._reset_call()
        self._state, self._lead = SECTION, DROP
