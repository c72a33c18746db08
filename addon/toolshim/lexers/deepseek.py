"""DeepSeek tool-call markup: V3 / R1-0528, V3.1+, and the V3.2 / V4 DSML blocks.

    V3, R1-0528 (a type word, the name after the separator, fenced arguments):
    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {...}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
    V3.1+ (the name before the separator, bare JSON after it):
    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜><｜tool▁calls▁end｜>
    V3.2 (`function_calls`) and V4 (`tool_calls`), "DSML":
    <｜DSML｜function_calls>
    <｜DSML｜invoke name="NAME">
    <｜DSML｜parameter name="P" string="true">text, as is</｜DSML｜parameter>
    <｜DSML｜parameter name="Q" string="false">JSON value</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

The bars are U+FF5C and `▁` is U+2581, matched exactly (an ASCII `|` or `_` is text). Accepted
as well: calls with no section around them, a call missing its end (the next call or the
section end closes it), V3 arguments without the fence, a DSML invoke whose body is a JSON
object (SGLang's "format 2"), a DSML parameter without `string=` (values: `_parameter_value`).
DeepSeek-V4 with thinking on writes its DSML block inside the reasoning, then `</think>` (vLLM
#46079): in a reasoning channel a `</think>` after a section ends the reasoning; in content, one
right after a section that made calls (whitespace aside) is markup, dropped like an end token.

V3.1 calls stream live (the name is final at the separator). Held until the call ends, then
judged: V3 fenced arguments (the fence comes off both ends; a torn call is shown as written)
and each DSML invoke (its parameters rebuilt as one JSON object; a call as soon as it closes).

States (`_state`), and what moves between them:

    TEXT    --section begin--> SECTION, --DSML begin--> BLOCK, --call begin--> HEADER (no section)
    TEXT    --`</think>` (reasoning channel: after a section; content: right after calls)--> TEXT
    SECTION --call begin--> HEADER, --section end--> TEXT
    HEADER  --separator--> FENCED (the header is `function`), else ARGS, HELD or VISIBLE (`_begin`);
            over MAX_HEADER: VISIBLE
    ARGS, HELD, FENCED, VISIBLE --call end--> SECTION (TEXT for a call with no section),
            --call begin--> HEADER (the next call; the last one is closed), --section end--> TEXT
    BLOCK   --invoke begin--> INVOKE --invoke end--> BLOCK (a call, or the invoke as text)
    INVOKE  --held more than max_held--> INVOKE_VISIBLE --invoke end--> BLOCK
    BLOCK, INVOKE, INVOKE_VISIBLE --DSML end--> TEXT

Calls, whitespace and `finish()` follow tokens.py (an invoke is complete only with its end).
Text outside markup passes as it comes, whitespace in front of a section and stray closers
included. Whitespace between markup in a section or block is padding, kept aside with the
section's markup (`_pad`, which also takes whitespace held after earlier calls): dropped once a
call is made of it, shown as written if none is; other text in a section keeps its whitespace.
"""

from __future__ import annotations

import json
import re

from ..calls import CallScope
from ..schema import _properties, coerce_value, compact_json, reads_as_json, schema_types
from ..tools import ToolSpec
from .base import Marker, ReasoningEnd, Segment, Text
from .tokens import ARGS, DROP, HELD, HOLD, KEEP, TEXT, THINK_END, VISIBLE, TokenLexer

BAR, SPACE = "\uff5c", "\u2581"  # the fullwidth bar and the "lower one eighth block" space

SECTION_BEGIN, SECTION_END = "section_begin", "section_end"
CALL_BEGIN, SEPARATOR, CALL_END = "call_begin", "separator", "call_end"
DSML_BEGIN, DSML_END = "dsml_begin", "dsml_end"
INVOKE_BEGIN, INVOKE_END = "invoke_begin", "invoke_end"


def _token(name: str) -> str:
    return f"<{BAR}{name.replace(' ', SPACE)}{BAR}>"


_SECTION_BEGIN = Marker(_token("tool calls begin"), SECTION_BEGIN)
_SECTION_END = Marker(_token("tool calls end"), SECTION_END)
_CALL_BEGIN = Marker(_token("tool call begin"), CALL_BEGIN)
_SEPARATOR = Marker(_token("tool sep"), SEPARATOR)
_CALL_END = Marker(_token("tool call end"), CALL_END)
_DSML = f"{BAR}DSML{BAR}"
_DSML_BEGINS = (Marker(f"<{_DSML}function_calls>", DSML_BEGIN), Marker(f"<{_DSML}tool_calls>", DSML_BEGIN))
_DSML_ENDS = (Marker(f"</{_DSML}function_calls>", DSML_END), Marker(f"</{_DSML}tool_calls>", DSML_END))
_INVOKE_BEGIN = Marker(f"<{_DSML}invoke", INVOKE_BEGIN)  # attributes follow: read when the invoke closes
_INVOKE_END = Marker(f"</{_DSML}invoke>", INVOKE_END)

SECTION, HEADER, FENCED = "section", "header", "fenced"
BLOCK, INVOKE, INVOKE_VISIBLE = "block", "invoke", "invoke_visible"

# What each state looks for; every other marker-like text is plain text in that state.
_V3_ALL = (_SECTION_BEGIN, _SECTION_END, _CALL_BEGIN, _SEPARATOR, _CALL_END)
_TEXT_MARKERS = (_SECTION_BEGIN, _CALL_BEGIN) + _DSML_BEGINS
_TEXT_MARKERS_THINK_END = _TEXT_MARKERS + (THINK_END,)
_CALL_MARKERS = (_CALL_BEGIN, _CALL_END, _SECTION_END)  # what ends a call's arguments
_INVOKE_MARKERS = (_INVOKE_END, _INVOKE_BEGIN) + _DSML_ENDS
_MARKERS = {
    **dict.fromkeys((SECTION, HEADER), _V3_ALL),
    **dict.fromkeys((ARGS, HELD, FENCED, VISIBLE), _CALL_MARKERS),
    BLOCK: _DSML_ENDS + (_INVOKE_BEGIN,),
    **dict.fromkeys((INVOKE, INVOKE_VISIBLE), _INVOKE_MARKERS),
}

# A V3 call after its separator (`_fenced_call`): the name, then fenced or bare JSON, or nothing.
_FENCED = re.compile(r"([^\s`{]++)\s*+(?:```[A-Za-z]*+(.*)```|(\{.*)|)", re.S)  # possessive: linear however long
# A whole invoke, and each parameter in its body (whitespace before it): the attributes end at
# the first `>`, a value at the first parameter end.
_INVOKE = re.compile(rf'{re.escape(_INVOKE_BEGIN.text)}\s+name="([^">]*)"\s*>(.*){re.escape(_INVOKE_END.text)}', re.S)
_PARAMETER = re.compile(rf'\s*<{_DSML}parameter\s+name="([^">]*)"(?:\s+string="(true|false)")?\s*>(.*?)</{_DSML}parameter>', re.S)


class DeepSeekLexer(TokenLexer):
    _all_markers = _V3_ALL + _DSML_BEGINS + _DSML_ENDS + (_INVOKE_BEGIN, _INVOKE_END, THINK_END)

    def __init__(self, scope: CallScope, *, max_held: int = 1 << 20, reasoning: bool = False) -> None:
        super().__init__(scope, max_held=max_held)
        self._reasoning = reasoning
        # Without declared tools no markup can become a call: everything passes at once.
        self._pass_through = not scope.tools
        self._reset()

    def _reset(self) -> None:
        super()._reset()
        self._seen_section = False
        self._reset_section()

    def _reset_section(self) -> None:
        self._pad: list[str] = []  # the section's markup and padding, while no call came of it
        self._pad_len = 0
        self._made_call = False
        self._bare = False  # a call with no section around it

    def feed(self, text: str) -> list[Segment]:
        if self._pass_through:
            return [Text(text)] if text else []
        return super().feed(text)

    def _finish(self, fragment: str, out: list[Segment]) -> None:
        if self._state in (SECTION, BLOCK):
            self._pad_add(self._take_ws(), out)
            self._pad_add(fragment, out)
        elif self._state != TEXT:  # (in TEXT, whitespace held after calls is dropped)
            self._close_call(out, "", rest=fragment)
        if not self._made_call:
            self._show(out, "")  # a section nothing came of: its markup, as written

    def _markers(self) -> tuple[Marker, ...]:
        if self._state == TEXT:
            # HOLD in TEXT: right after calls, only whitespace since (where a late `</think>` falls).
            closer = self._lead == HOLD or self._reasoning and self._seen_section
            return _TEXT_MARKERS_THINK_END if closer else _TEXT_MARKERS
        return _MARKERS[self._state]

    def _take(self, text: str, out: list[Segment]) -> None:
        state = self._state
        if state in (TEXT, SECTION, BLOCK):
            self._lead_text(text, out)
        elif state == ARGS:
            self._args_text(text, out)
        elif state == HEADER:
            self._markup_add(text, out, header=True)
        elif state in (HELD, FENCED, INVOKE):
            self._markup_add(text, out, INVOKE_VISIBLE if state == INVOKE else VISIBLE)
        else:  # VISIBLE, INVOKE_VISIBLE
            self._show(out, text)

    def _on_marker(self, marker: Marker, out: list[Segment]) -> None:
        kind, state, after_calls = marker.kind, self._state, self._lead == HOLD
        padding = self._take_ws()
        self._lead = HOLD  # what follows a marker in a section starts a run: padding, or text
        if state == TEXT:
            if marker is THINK_END:  # DROP: the content after `</think>` starts at its first word
                if self._reasoning:
                    out.append(ReasoningEnd())
                elif not after_calls:  # text came between the calls and it: it is text too
                    self._show(out, marker.text)
                self._lead = DROP if self._reasoning or after_calls else KEEP
                return
            self._reset_section()
            self._seen_section = True
            self._pad_add(padding, out)  # whitespace after earlier calls: this section's padding
            if kind == CALL_BEGIN:
                self._bare = True
                self._start(marker)
            else:
                self._pad_add(marker.text, out)
                self._state = SECTION if kind == SECTION_BEGIN else BLOCK
        elif state in (SECTION, BLOCK):
            self._pad_add(padding, out)
            if kind in (CALL_BEGIN, INVOKE_BEGIN):
                self._start(marker)
            elif kind in (SECTION_END, DSML_END):
                self._end_section(out, marker.text)
            else:  # a stray separator, call end or section begin: markup of the section
                self._pad_add(marker.text, out)
        elif state == HEADER and kind == SEPARATOR:
            self._raw_add(marker.text)
            self._open_call(out)
        elif state == HEADER and kind == SECTION_BEGIN:
            self._raw_add(marker.text)  # nonsense inside a header: the name will not resolve
            self._header += marker.text
        else:  # the call or invoke ends, by its end, the next one's begin or the section's end
            self._close_call(out, marker.text if kind in (CALL_END, INVOKE_END) else "")
            self._reset_call()
            if kind in (CALL_BEGIN, INVOKE_BEGIN):
                self._start(marker)
            elif kind in (SECTION_END, DSML_END):
                self._end_section(out, marker.text)
            elif self._bare:
                self._end_section(out, "")
            else:
                self._state = SECTION if kind == CALL_END else BLOCK

    def _start(self, marker: Marker) -> None:
        self._reset_call()
        self._raw_add(marker.text)
        self._state = HEADER if marker.kind == CALL_BEGIN else INVOKE

    def _end_section(self, out: list[Segment], closing: str) -> None:
        if self._made_call:
            self._lead = HOLD
        else:
            self._show(out, closing)  # nothing came of it: the section stays text, as written
            self._lead = KEEP
        self._state = TEXT
        self._reset_section()

    def _open_call(self, out: list[Segment]) -> None:
        """The separator: the header names the call (V3.1), or says the name follows (V3)."""
        self._body_start = len(self._raw)
        header = self._header.strip()
        if header == "function":
            self._state = FENCED
            return
        name = header.removeprefix("functions.")
        self._state = self._begin(out, name, name)
        if self._state == ARGS:
            self._made()

    def _close_call(self, out: list[Segment], closing: str, rest: str = "") -> None:
        """The current call ends, by `closing` or by what follows it (a call cut short before
        its separator, or an invoke without its end, stays text)."""
        state = self._state
        if state == ARGS:
            self._close_args(out)
            return
        found = None  # VISIBLE, INVOKE_VISIBLE: nothing is held, the rest is shown
        if state == HELD:
            found = self._name, self._raw_text(self._body_start).strip()
        elif state == FENCED:
            found = _fenced_call(self._raw_text(self._body_start), self._scope.tools)
        elif state == INVOKE and closing:
            found = _invoke_call(self._raw_text() + closing, self._scope.tools)
        if found is not None and self._judged(out, *found):
            self._made()
        else:
            self._show(out, self._raw_text() + rest + closing)

    def _made(self) -> None:
        """A call came of the section: its markup and padding so far are markup, dropped."""
        self._made_call = True
        self._pad = []
        self._pad_len = 0

    def _pad_add(self, text: str, out: list[Segment]) -> None:
        if not text or self._made_call:
            return  # after a call, the section's markup and padding are dropped
        self._pad.append(text)
        self._pad_len += len(text)
        if self._pad_len > self._max_held:
            self._show(out, "")

    def _show(self, out: list[Segment], text: str) -> None:
        """Text that stays text; a section with no call yet shows its markup first."""
        if self._pad:
            text = "".join(self._pad) + text
            self._pad = []
            self._pad_len = 0
        if text:
            out.append(Text(text))


# -- reading held calls -------------------------------------------------------------------------


def _fenced_call(body: str, tools: dict[str, ToolSpec]) -> tuple[str, str] | None:
    """(name, arguments) of a V3 call's text after the separator, or None: not a call:
    `NAME\\n```json\\n{...}\\n```` with the language word and the fence optional, or a tool really
    named `function` written the V3.1 way (`function<｜tool▁sep｜>{...}`)."""
    text = body.strip()
    if text.startswith("{"):
        return ("function", text) if "function" in tools else None
    found = _FENCED.fullmatch(text)  # None also when the fence never closed
    if found is None:
        return None
    fenced, bare = found.group(2, 3)
    return found.group(1).removeprefix("functions."), fenced.strip() if fenced is not None else bare or ""


def _invoke_call(raw: str, tools: dict[str, ToolSpec]) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of a whole DSML invoke, or None: not a call. The object is
    written from the parameters in order, each value by `_parameter_value`, one by one (so a
    value can never add keys of its own)."""
    invoke = _INVOKE.fullmatch(raw)
    if invoke is None:
        return None
    name = invoke.group(1).strip().removeprefix("functions.")
    properties = _properties(tools.get(name)) or {}
    body, members, pos = invoke.group(2), [], 0
    while param := _PARAMETER.match(body, pos):
        key, string, value = param.groups()
        members.append(compact_json(key) + ":" + _parameter_value(value, string, properties.get(key)))
        pos = param.end()
    rest = body[pos:].strip()
    if not members and rest.startswith("{"):
        return name, rest  # the arguments written as one JSON object
    return None if rest else (name, "{" + ",".join(members) + "}")  # anything else: not ours to guess


def _parameter_value(value: str, string: str | None, prop: object) -> str:
    """A DSML value as JSON text, typed by its property's schema `prop` first (`schema_types`:
    `type` names and lists, `anyOf` / `oneOf`, `enum`), then by the `string=` attribute:

    * the schema admits no string: the value is typed by it (`coerce_value`) whatever the
      markup says (`string="true"` on an integer gives the integer: the model's attribute is a
      guess, the client's schema is not); a value of no allowed type stays so, for the judge;
    * the schema admits a string: `string="true"` keeps the text as is (no trimming: the
      official encoding writes it verbatim); `string="false"` keeps the model's JSON only when
      its type is allowed, so `null`, `true`, `42` stay strings where only a string fits; no
      mark: as the XML dialects (`coerce_value`: the text, `null` is None where null is allowed);
    * no schema for the parameter: `string=` decides (none: a string; `false`: the model's JSON
      when it reads as one value, otherwise the text as a string, for the judge, as vLLM does).
    """
    types = schema_types(prop)
    stripped = value.strip()
    if types:
        allowed = types | ({"integer"} if "number" in types else set())
        said_json = string == "false" or (string is None and "string" not in types)
        # The model's own JSON, of a type the schema allows (`schema_types` of a `const` is its type).
        if said_json and reads_as_json(stripped) and schema_types({"const": json.loads(stripped)}) <= allowed:
            return stripped
        if "string" in types:  # the text, or None for `null` where null is allowed and no mark says string
            return compact_json(value if string == "true" else coerce_value(value, prop))
        typed = coerce_value(value, prop)
        if not isinstance(typed, str):
            return compact_json(typed)
    if string == "true" or (string is None and not types):
        return compact_json(value)
    return stripped if reads_as_json(stripped) else compact_json(value)
