"""The dialect engine's shortcuts read text exactly as its generic steps do.

`BlockLexer.feed` holds a marker's or tag's beginning that a piece extends into a longer
beginning without running the steps (a tag in token-sized pieces: an opener in text, a tag a
block's step holds, the closer inside a JSON block), counting the look-ahead the step would
count, and `BlockLexer.finish` returns at once when the lexer is idle (a chain finishes its idle
second stage before every segment of a call). Here they are all switched off (every piece read
by the steps, `finish` the full one; the JSON lexer's bulk too) and every dialect's random texts
are read both ways, in token-sized pieces and in the fuzz cases' own: the same segments, the
same idle answer after every piece, the same calls and notes, the same characters examined.
"""

from __future__ import annotations

import copy
import itertools

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import toolshim.calls as calls_module
from test_fuzz import TOOLS as FUZZ_TOOLS
from test_fuzz import dialect_text, lexer_case
from toolshim.calls import CallScope, RewriteStats
from toolshim.lexers import DIALECT_NAMES, ScopeLexers
from toolshim.lexers import specs
from toolshim.lexers.base import CallBegin, JsonScanner, Text, TextPieces
from toolshim.lexers.engine import BlockLexer, JsonCallsLexer, Spec
from toolshim.lexers.engine import lexer as engine_lexer
from toolshim.lexers.specs import LLAMA
from toolshim.tools import RequestContext, ToolSpec

SPECS = [value for value in vars(specs).values() if isinstance(value, Spec)]


def read(case: dict, pieces: list[str]) -> tuple[list, list[bool], dict, list, list[int]]:
    """Segments and the idle answer after each piece, then the finish; minted ids counted; the
    characters each engine lexer made examined (the work the complexity guards count)."""
    counter = itertools.count()
    original, init = calls_module.random_id, BlockLexer.__init__
    made: list[BlockLexer] = []

    def recording_init(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    calls_module.random_id = lambda prefix, length=24: f"{prefix}{next(counter):0{length}d}"
    BlockLexer.__init__ = recording_init
    try:
        stats = RewriteStats()
        lexer = ScopeLexers(CallScope(copy.deepcopy(case["context"]), stats), max_held=case["max_held"]).new_lexer(reasoning=case["reasoning"])
        segments, idle = [], []
        for piece in pieces:
            segments.append(lexer.feed(piece))
            idle.append(lexer.idle)
        segments.append(lexer.finish())
        idle.append(lexer.idle)
    finally:
        calls_module.random_id, BlockLexer.__init__ = original, init
    return segments, idle, dict(stats.dialect_calls), list(stats.notes), [lexer.examined for lexer in made]


def by_the_steps(self: BlockLexer, text: str) -> list:
    """`feed` without a shortcut: every piece read by the steps."""
    return ([Text(text)] if text else []) if self._pass_through else self._read(text)


def shortcuts_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every `feed` of the engine's lexers made the steps' (JSON's bulk too), `finish` the full one."""
    kinds = [BlockLexer]
    for kind in kinds:
        kinds += kind.__subclasses__()
        if "feed" in vars(kind):
            monkeypatch.setattr(kind, "feed", by_the_steps)
    assert JsonCallsLexer in kinds
    monkeypatch.setattr(BlockLexer, "finish", BlockLexer._finish_all)


def token_sized(text: str, sizes: list[int]) -> list[str]:
    pieces, at = [], 0
    for size in itertools.cycle(sizes):
        if at >= len(text):
            return pieces
        pieces.append(text[at : at + size])
        at += size
    raise AssertionError  # (unreachable: the cycle is endless)


@pytest.mark.parametrize("forced", [*DIALECT_NAMES, "all"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_the_shortcuts_read_as_the_generic_steps(forced, data):
    case = data.draw(lexer_case(forced, new=True))
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=12))
    splits = [case["pieces"], token_sized(case["text"], sizes)]
    fast = [read(case, pieces) for pieces in splits]
    with pytest.MonkeyPatch.context() as monkeypatch:
        shortcuts_off(monkeypatch)
        generic = [read(case, pieces) for pieces in splits]
    assert fast == generic


@pytest.mark.parametrize(
    "model, text, held, passed",
    [
        # `<tool_call>` and `</tool_call>` two characters a piece: 6 and 6 pieces, 5 and 5 of
        # them leave the tag cut short; the call's three segments pass the chain's idle second stage
        ("Qwen/Qwen2.5-72B-Instruct", 'Let me look. <tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call> done', 8, 3),
        # Qwen3-Coder's tags inside the block, the same; the second stage makes the call
        ("qwen3-coder-30b", "Sure.\n<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n</function>\n</tool_call> ok", 16, 0),
    ],
)
def test_the_shortcuts_are_taken(model, text, held, passed):
    """The switch above switches something: with the shortcuts no piece of a block whose tags
    come two characters a piece is read by the steps only to hold a tag cut short again (without
    them, `held` or more are), and fewer lexers are finished in full: none, where the steps
    finish the content chain's two at the end and the idle second stage for each of the `passed`
    segments the first stage made (counted; the call is the same)."""
    case = {"context": RequestContext(tools={"bash": ToolSpec("bash", {"type": "object"})}, model=model), "max_held": 1 << 20, "reasoning": False}
    pieces = token_sized(text, [2])

    def counted(shortcuts: bool) -> tuple[int, int]:
        """Pieces the steps read only to hold a tag cut short again; lexers finished in full."""
        held_again, finishes = [0], [0]
        read_by_steps, finish_all = BlockLexer._read, BlockLexer._finish_all

        def counting_read(self, piece):
            tail = self._tail
            out = read_by_steps(self, piece)
            held_again[0] += bool(tail) and not out and self._tail == tail + piece
            return out

        def counting_finish_all(self):
            finishes[0] += 1
            return finish_all(self)

        with pytest.MonkeyPatch.context() as monkeypatch:
            if not shortcuts:
                shortcuts_off(monkeypatch)
                monkeypatch.setattr(BlockLexer, "finish", counting_finish_all)
            monkeypatch.setattr(BlockLexer, "_read", counting_read)
            monkeypatch.setattr(BlockLexer, "_finish_all", counting_finish_all)
            segments, _, calls, _, _ = read(case, pieces)
        assert sum(calls.values()) == 1
        assert [seg.name for piece in segments for seg in piece if type(seg) is CallBegin] == ["bash"]
        return held_again[0], finishes[0]

    (fast_held, fast_finishes), (steps_held, finishes) = counted(True), counted(False)
    assert (fast_held, steps_held >= held) == (0, True), (fast_held, steps_held)
    assert (fast_finishes, finishes) == (0, 2 + passed)


def lexer_state(lexer: BlockLexer) -> dict:
    """What a lexer holds, by value (the held text's pieces by their text, the scanner by its
    fields; its scope and judge, shared and unchanged by `finish`, left out)."""
    state = {}
    for key, value in vars(lexer).items():
        if key in ("_scope", "judge", "watcher"):
            continue
        if isinstance(value, TextPieces):
            value = value.text()
        elif isinstance(value, JsonScanner):
            value = (value.depth, value.in_string, value.escape, value._stops)
        state[key] = value
    return state


@pytest.mark.parametrize("spec", SPECS, ids=[spec.name for spec in SPECS])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_finishing_an_idle_lexer_leaves_what_the_full_finish_leaves(spec, data):
    """At every point where a lexer of each engine dialect is idle, `finish` returns nothing and
    leaves the lexer as the full finish does (Llama's also as the lexer that reads bare JSON at
    the start of its text: a finish begins a new text)."""
    text = data.draw(dialect_text([spec.name, spec.name, "think"], new=True))
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=8))
    options = {"bare_json": data.draw(st.booleans())} if spec is LLAMA else {}
    scope = CallScope(RequestContext(tools=dict(FUZZ_TOOLS), model="m"), RewriteStats())
    reading = engine_lexer(spec, scope, **options)
    idle_points = 0
    for piece in token_sized(text, sizes):
        reading.feed(piece)
        if reading.idle:
            idle_points += 1
            shared = {id(scope): scope, id(reading.judge): reading.judge}  # (what `finish` does not touch: not copied)
            fast, full = copy.deepcopy(reading, dict(shared)), copy.deepcopy(reading, dict(shared))
            assert fast.finish() == full._finish_all() == []
            assert lexer_state(fast) == lexer_state(full)
    event(f"idle points: {min(idle_points, 3)}")


@settings(max_examples=2000, deadline=None)
@given(
    st.lists(st.sampled_from(["<", "f", "unction=", "</", "tool_call>", "a", "parameter=", " "]), max_size=6).map("".join),
    st.integers(0, 40),
    st.integers(0, 40),
    st.sampled_from([("<function=", "</tool_call>"), ("<parameter=", "</function>", "</parameter>"), ("<", "<a"), ("ab", "a")]),
)
def test_match_tag_is_the_tag_the_text_begins_with(buf, j, limit, tags):
    """`match_tag` (slices compared, not `startswith` with bounds) answers what the text from
    `j` up to `limit` begins with: the first tag of `tags` whole, else `_PARTIAL` when all that
    is left there is the beginning of one, else None."""
    from toolshim.lexers.engine import _PARTIAL, match_tag

    window = buf[j:limit] if j <= len(buf) else None
    whole = [tag for tag in tags if window is not None and window.startswith(tag)]
    cut = window is not None and limit - j >= 0 and any(len(window) == limit - j < len(tag) and tag.startswith(window) for tag in tags)
    expected = whole[0] if whole else _PARTIAL if cut else None
    assert match_tag(buf, j, limit, tags) is expected
