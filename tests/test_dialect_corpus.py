"""Golden expectations for the dialects: a corpus of every dialect's markup and what the lexers
make of it, recorded when the lexers the dialect engine replaced were deleted (every dialect had
matched them on the differential test this corpus comes from, or had changed on purpose since).

`data/dialect_corpus.json` holds the inputs (the model, the dialects forced, the tools: declared,
none, strict, or the called tool undeclared; reasoning or content; the cap; the text and where
it is cut) and what the lexers gave for them: the segments (adjacent text and arguments
joined), notes, problems, calls per dialect, and the idle answer after each piece (1: idle). Every case is
read whole and cut. After a deliberate change of behaviour, record what the lexers now give

    TOOLSHIM_REGENERATE_GOLDEN=1 .venv/bin/pytest tests/test_dialect_corpus.py

and read the diff of the data file before committing it. For a new dialect, draw the inputs
anew (test_fuzz's strategies): `.venv/bin/python tests/test_dialect_corpus.py --draw`.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import os
import random
import sys
from pathlib import Path

import pytest

import toolshim.calls as calls_module
from toolshim.calls import CallScope, RewriteStats
from toolshim.lexers import DIALECT_NAMES, ScopeLexers
from toolshim.lexers.base import CallArgs, CallBegin, CallEnd, ReasoningEnd, ReasoningText, Text
from toolshim.tools import RequestContext, ToolSpec

DATA = Path(__file__).resolve().parent / "data" / "dialect_corpus.json"
REGENERATE = os.environ.get("TOOLSHIM_REGENERATE_GOLDEN") == "1"
PARAMETERS = {
    "bash": {"type": "object", "properties": {"command": {"type": "string"}, "path": {"type": "string"}}},
    "get_weather": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
    "search": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"], "additionalProperties": False},
}
TOOL_SETS = {
    "declared": {name: ToolSpec(name, parameters, strict=name == "search") for name, parameters in PARAMETERS.items()},
    "none": {},
    "strict": {name: ToolSpec(name, parameters, strict=True) for name, parameters in PARAMETERS.items()},
    "undeclared": {"other": ToolSpec("other", {"type": "object"})},
}


def encode(segments) -> list[list]:
    """Segments as JSON: adjacent text (and adjacent arguments) joined."""
    out: list[list] = []
    for seg in segments:
        kind = type(seg)
        if kind in (Text, CallArgs, ReasoningText):
            tag = {Text: "text", CallArgs: "args", ReasoningText: "reasoning"}[kind]
            if out and out[-1][0] == tag:
                out[-1][1] += seg.text
            else:
                out.append([tag, seg.text])
        elif kind is CallBegin:
            out.append(["call", seg.id, seg.name])
        elif kind is CallEnd:
            out.append(["end"])
        else:
            assert kind is ReasoningEnd, seg
            out.append(["reasoning_end"])
    return out


def read(case: dict, pieces: list[str]) -> dict:
    """What the lexers of one channel give for `pieces`; minted ids are counted, not random."""
    context = RequestContext(
        tools=dict(TOOL_SETS[case["tools"]]),
        model=case["model"],
        dialects=tuple(case["dialects"]) if case["dialects"] is not None else None,
        reasoning_preopened=case["preopened"],
        parallel_tool_calls=case["parallel"],
        tool_choice_none=case["tool_choice_none"],
    )
    counter = itertools.count()
    original = calls_module.random_id
    calls_module.random_id = lambda prefix, length=24: f"{prefix}{next(counter):0{length}d}"
    try:
        stats = RewriteStats()
        lexer = ScopeLexers(CallScope(copy.deepcopy(context), stats), max_held=case["max_held"]).new_lexer(reasoning=case["reasoning"])
        segments, idle = [], []
        for piece in pieces:
            segments += lexer.feed(piece)
            idle.append(lexer.idle)
        segments += lexer.finish()
        idle.append(lexer.idle)
    finally:
        calls_module.random_id = original
    idle_bits = "".join("1" if answer else "0" for answer in idle)
    return {"segments": encode(segments), "notes": list(stats.notes), "problems": dict(stats.problems), "calls": dict(stats.dialect_calls), "idle": idle_bits}


def pieces_of(case: dict) -> list[str]:
    text, points = case["text"], case["cuts"]
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]


@functools.cache
def cases() -> list[dict]:
    corpus = json.loads(DATA.read_text())["cases"]
    if REGENERATE:
        corpus = [record(case) for case in corpus]
        save(corpus)
    return corpus


def record(case: dict) -> dict:
    """The case's inputs with what the lexers give for them, whole and cut."""
    inputs = {key: value for key, value in case.items() if key not in ("whole", "cut", "cut_idle")}
    whole = read(inputs, [inputs["text"]])
    cut = read(inputs, pieces_of(inputs))
    if {**cut, "idle": ""} == {**whole, "idle": ""}:
        return {**inputs, "whole": whole, "cut_idle": cut["idle"]}
    return {**inputs, "whole": whole, "cut": cut}


def save(corpus: list[dict]) -> None:
    DATA.write_text(json.dumps({"cases": corpus}, ensure_ascii=False, separators=(",", ":")) + "\n")


def test_the_corpus_covers_every_dialect_and_tool_set():
    corpus = cases()
    alone = {case["dialects"][0] for case in corpus if case["dialects"] is not None and len(case["dialects"]) == 1}
    assert alone == set(DIALECT_NAMES), "a dialect was added or renamed: draw the corpus again (see the docstring)"
    assert {case["tools"] for case in corpus} == set(TOOL_SETS)
    assert sum(1 for case in corpus for segment in case["whole"]["segments"] if segment[0] == "call") > 100


@pytest.mark.parametrize("chunk", range(8))
def test_every_case_reads_as_recorded_whole_and_cut(chunk):
    corpus = cases()
    for case in corpus[chunk::8]:
        whole = read(case, [case["text"]])
        assert whole == case["whole"], case
        expected = case["cut"] if "cut" in case else {**case["whole"], "idle": case["cut_idle"]}
        assert read(case, pieces_of(case)) == expected, case


# -- drawing the inputs ------------------------------------------------------------------------


def draw() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from test_fuzz import Witnesses, dialect_call, lexer_case

    inputs: list[dict] = []

    def case_of(context: RequestContext, text: str, cuts: list[int], reasoning: bool, max_held: int, tools: str) -> dict:
        return {
            "model": context.model,
            "dialects": list(context.dialects) if context.dialects is not None else None,
            "tools": tools,
            "preopened": context.reasoning_preopened,
            "parallel": context.parallel_tool_calls,
            "tool_choice_none": context.tool_choice_none,
            "reasoning": reasoning,
            "max_held": max_held,
            "text": text,
            "cuts": sorted({c for c in cuts if 0 < c < len(text)}),
        }

    quick = settings(max_examples=12, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    for forced in [*DIALECT_NAMES, "all", "by model"]:

        @quick
        @given(case=lexer_case(forced, new=True))
        def draw_case(case):
            cuts = list(itertools.accumulate(len(piece) for piece in case["pieces"]))[:-1]
            inputs.append(case_of(case["context"], case["text"], cuts, case["reasoning"], case["max_held"], "declared"))

        draw_case()

    for dialect in DIALECT_NAMES:

        @settings(max_examples=6, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(data=st.data())
        def draw_markup(data):
            witness = Witnesses()
            text = "".join(data.draw(st.lists(st.one_of(dialect_call(dialect, witness, new=True), st.sampled_from([" ", "\n", "prose "])), min_size=1, max_size=4)))
            rng = random.Random(data.draw(st.integers(0, 1 << 30)))
            for tools in TOOL_SETS:
                context = RequestContext(model="m", dialects=(dialect,), parallel_tool_calls=rng.random() < 0.8)
                cuts = rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 12))) if len(text) > 1 else []
                inputs.append(case_of(context, text, cuts, rng.random() < 0.25, 1 << 20, tools))

        draw_markup()

    save([record(case) for case in inputs])
    print(f"{len(inputs)} cases written to {DATA.name}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--draw"]:
        sys.exit("usage: python tests/test_dialect_corpus.py --draw")
    draw()
