"""The markup dialects, which of them a response runs, and how they share one text channel.

A channel runs a chain of lexers (`ChainLexer`): each reads the text the one before it left.
First the reasoning split of a content channel (`<think>…</think>`), then the dialects with
special tokens (they cannot occur in prose), then the tag dialects. Which dialects run is picked
from the model name (the table below, in the README too), or forced with `toolshim_dialects`;
a model the table does not know runs them all. That is safe because no dialect turns prose into
a call: each needs its structured markup, and a declared tool's name.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from ..backends import THINKING_TEMPLATES
from ..calls import CallScope
from .base import ChainLexer, Lexer, PlainText, Reporting
from . import engine, specs
from .deepseek import DeepSeekLexer
from .harmony import HarmonyLexer
from .kimi import KimiCallNamer, KimiLexer
from .think import REASONING_TAGS, ReasoningSplit, ThinkLexer


@dataclass(frozen=True, slots=True, eq=False)  # (compared by identity: module constants)
class Dialect:
    name: str
    models: re.Pattern[str]  # searched in the request's model name, case-insensitively
    make: Callable[[ScopeLexers, bool], Lexer]  # (the scope's lexers, reasoning channel?)
    starts: tuple[str, ...]  # the markers that may begin its markup (the SSE layer's fast path looks for them)
    # Special-token dialects do not run inside `<think>`; tag dialects do (see ReasoningSplit).
    special_tokens: bool = False
    # A call beginning inside `<think>` ends the reasoning (vLLM's kimi_k2 reasoning parser and
    # SGLang treat the section begin as an implicit `</think>`).
    ends_reasoning: bool = False
    # Reasoning tags of the family's own, split like `<think>` where the dialect runs; markers
    # its thought keeps as text (a call written inside the tags is thought, not a call).
    reasoning_tags: tuple[tuple[str, str], ...] = ()
    thought_keeps: tuple[str, ...] = ()
    # Does its markup in a reasoning field make calls? (Not Mistral's: see its entry.)
    calls_in_reasoning: bool = True


def _spec(spec: specs.Spec) -> Callable[[ScopeLexers, bool], Lexer]:
    def make(lexers: ScopeLexers, reasoning: bool) -> Lexer:
        return engine.lexer(spec, lexers.scope.for_dialect(spec.name), max_held=lexers.max_held)

    return make


def _kimi(lexers: ScopeLexers, reasoning: bool) -> Lexer:
    return KimiLexer(lexers.kimi_namer, reasoning=reasoning, max_held=lexers.max_held)


def _deepseek(lexers: ScopeLexers, reasoning: bool) -> Lexer:
    return DeepSeekLexer(lexers.scope.for_dialect("deepseek"), max_held=lexers.max_held, reasoning=reasoning)


def _harmony(lexers: ScopeLexers, reasoning: bool) -> Lexer:
    return HarmonyLexer(lexers.scope.for_dialect("harmony"), max_held=lexers.max_held, lead_recipient=not reasoning and lexers.harmony_start)


def _llama(lexers: ScopeLexers, reasoning: bool) -> Lexer:
    return engine.lexer(specs.LLAMA, lexers.scope.for_dialect("llama"), max_held=lexers.max_held, bare_json=not reasoning and lexers.llama_bare_json)


_KIMI_STARTS = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>", "<|tool_call_begin|>")
_DEEPSEEK_STARTS = ("<\uff5ctool\u2581calls\u2581begin\uff5c>", "<\uff5ctool\u2581call\u2581begin\uff5c>", "<\uff5cDSML\uff5cfunction_calls>", "<\uff5cDSML\uff5ctool_calls>")

# In chain order: special tokens first, then tags.
DIALECTS: tuple[Dialect, ...] = (
    Dialect("kimi", re.compile(r"kimi|moonshot|k2", re.I), _kimi, _KIMI_STARTS, special_tokens=True, ends_reasoning=True),
    Dialect("deepseek", re.compile(r"deepseek", re.I), _deepseek, _DEEPSEEK_STARTS, special_tokens=True, ends_reasoning=True),
    Dialect("harmony", re.compile(r"gpt-oss|gpt_oss", re.I), _harmony, ("<|start|>", "<|channel|>"), special_tokens=True),
    Dialect("mistral", re.compile(r"mistral|magistral|ministral|devstral|codestral|mixtral|pixtral", re.I), _spec(specs.MISTRAL), specs.MISTRAL.starts, special_tokens=True, ends_reasoning=True, calls_in_reasoning=False,
            # v13+ thinks in `[THINK]…[/THINK]`, one chunk before any `[TOOL_CALLS]`: a
            # `[TOOL_CALLS]` inside, in content or a reasoning field, is the thought's (vLLM's
            # Mistral reasoning parser hands the tool parser only what follows `[/THINK]`).
            reasoning_tags=(("[THINK]", "[/THINK]"),), thought_keeps=("[TOOL_CALLS]",)),
    # Hermes before the XML dialects: they share `<tool_call>`, and each takes only what follows
    # it in its own form (`{`, `<function=`, a name), releasing the rest at once.
    # Granite 4 writes Hermes blocks.
    Dialect("hermes", re.compile(r"qwen|qwq|hermes|nous|granite", re.I), _spec(specs.HERMES), specs.HERMES.starts),
    # Seed-OSS before Qwen XML: its wrapper holds Qwen's elements, and where both run (a model the
    # table does not know) the wrapper must be read with its call, not left around a bare one.
    Dialect("seed_oss", re.compile(r"seed-oss|seed_oss", re.I), _spec(specs.SEED_OSS), specs.SEED_OSS.starts, reasoning_tags=(("<seed:think>", "</seed:think>"),)),
    # Nemotron 3 writes Qwen3-Coder XML.
    Dialect("qwen_xml", re.compile(r"qwen|nemotron", re.I), _spec(specs.QWEN_XML), specs.QWEN_XML.starts),
    Dialect("glm", re.compile(r"glm|zhipu|z-ai", re.I), _spec(specs.GLM), specs.GLM.starts),
    Dialect("minimax", re.compile(r"minimax", re.I), _spec(specs.MINIMAX), specs.MINIMAX.starts),
    Dialect("llama", re.compile(r"llama|functionary", re.I), _llama, specs.LLAMA.starts),
    Dialect("granite", re.compile(r"granite", re.I), _spec(specs.GRANITE), specs.GRANITE.starts),
    Dialect("nemotron", re.compile(r"nemotron", re.I), _spec(specs.NEMOTRON), specs.NEMOTRON.starts),
    Dialect("command", re.compile(r"command-a|command-r7b|c4ai-command|cohere", re.I), _spec(specs.COMMAND), specs.COMMAND.starts, reasoning_tags=(("<|START_THINKING|>", "<|END_THINKING|>"),)),
)
DIALECT_NAMES = tuple(d.name for d in DIALECTS)
# Every marker that may begin markup in some dialect or the reasoning split: the SSE layer's fast
# path and the reasoning split derive what they look for from it.
MARKUP_STARTS = tuple(dict.fromkeys([t for d in DIALECTS for t in d.starts] + list(REASONING_TAGS) + [t for d in DIALECTS for pair in d.reasoning_tags for t in pair]))

# Chat templates that open the reasoning block in the prompt: the output starts inside it and
# only `</think>` appears (research: parsers.md 1.10).
PREOPENED_MODELS = re.compile(r"deepseek-r1|qwq|qwen3-[\w.-]*thinking|qwen3\.[56]", re.I)


def starts_in_reasoning(context) -> bool:
    """Does the output start inside a pre-opened reasoning block (by option, else by model)?"""
    if context.reasoning_preopened is not None:
        return context.reasoning_preopened
    return bool(PREOPENED_MODELS.search(context.model))


def _reads_own_start(context, name: str) -> bool:
    """Does dialect `name` read the start of the content with no marker in it? Only where it runs,
    for a model its own pattern names: Llama 3.x's JSON calls without their tag (prose holds
    JSON); the rest of gpt-oss's first role header (see harmony.py)."""
    dialect = next(d for d in DIALECTS if d.name == name)
    return dialect in dialects_for(context.model, context.dialects) and bool(dialect.models.search(context.model))


def reads_the_start(context) -> bool:
    """Must the start of the content be read even without a marker in it (pre-opened reasoning,
    `_reads_own_start`)? Then no fast path may skip it."""
    return starts_in_reasoning(context) or _reads_own_start(context, "llama") or _reads_own_start(context, "harmony")


@lru_cache(maxsize=256)  # every flow asks, three times, of a model its clients name again and again
def dialects_for(model: str, forced: tuple[str, ...] | None) -> tuple[Dialect, ...]:
    if forced is not None:
        return tuple(d for d in DIALECTS if d.name in forced)
    matched = tuple(d for d in DIALECTS if d.models.search(model))
    return matched or DIALECTS


class ScopeLexers:
    """Makes the lexers of every channel of one scope (a Chat choice, a Responses response)."""

    def __init__(self, scope: CallScope, *, max_held: int) -> None:
        self.scope = scope
        self.max_held = max_held
        self.kimi_namer = KimiCallNamer(scope.for_dialect("kimi"))  # shared: Kimi ids stay unique across channels
        self.busy = 0  # lexers made here that hold something: each reports its own changes
        context = scope.context
        self._dialects = dialects_for(context.model, context.dialects)
        self.preopened = starts_in_reasoning(context)
        # A family whose template opens the block when thinking is on (backends.py), and a request
        # that does not say: the output may still start inside it, and a bare closer may come.
        self.may_be_preopened = not self.preopened and context.reasoning_preopened is None and bool(THINKING_TEMPLATES.search(context.model))
        self._call_starts = tuple(dict.fromkeys(t for d in self._dialects for t in d.starts))
        self.llama_bare_json = _reads_own_start(context, "llama")
        self.harmony_start = _reads_own_start(context, "harmony")
        self.bare_json = self.llama_bare_json or self.harmony_start  # the rewriters must read the start

    @property
    def idle(self) -> bool:
        """No lexer of this scope holds anything (each reports its own changes)."""
        return self.busy == 0

    def _watched(self, lexer: Lexer) -> Lexer:
        if isinstance(lexer, Reporting):
            lexer.watched_by(self)
        return lexer

    def new_lexer(self, *, reasoning: bool, preopened: bool = True, started: bool = False) -> Lexer:
        """The lexer of a reasoning channel, or of a content channel (which may hold `<think>`).
        `preopened=False`: upstream splits reasoning itself, so content never starts inside it;
        `started`: content was already sent, so no reasoning block can open any more."""
        if reasoning:
            return self._calls(reasoning=True, field=True)
        tool_starts = tuple(t for d in self._dialects if d.ends_reasoning for t in d.starts)
        pairs = dict(pair for d in self._dialects for pair in d.reasoning_tags)
        keeps = {opener: d.thought_keeps for d in self._dialects if d.thought_keeps for opener, _ in d.reasoning_tags}
        # No call begins without declared tools: nothing ends the watch (ThinkLexer) early.
        bare_close = (self._call_starts if self.scope.tools else ()) if self.may_be_preopened and preopened else None
        think = ThinkLexer(preopened=self.preopened and preopened and not started, tool_starts=tool_starts, started=started, pairs=pairs, keeps=keeps, bare_close=bare_close)
        self._watched(think)
        return ReasoningSplit(think, self._tag_calls_in_reasoning, self._calls(reasoning=False))

    def _tag_calls_in_reasoning(self) -> Lexer:
        """The chain of a `<think>` block's text: tag dialects only (`ReasoningSplit`)."""
        return self._calls(reasoning=True, tags_only=True)

    def _calls(self, *, reasoning: bool, tags_only: bool = False, field: bool = False) -> Lexer:
        """The chain of call dialects (`field`: of a reasoning field); none at all when no call may
        be made (tool_choice none)."""
        if self.scope.context.tool_choice_none:
            return PlainText()
        stages = [self._watched(d.make(self, reasoning)) for d in self._dialects if not (tags_only and d.special_tokens) and not (field and not d.calls_in_reasoning)]
        return chain(stages) if stages else PlainText()


def chain(stages: list[Lexer]) -> Lexer:
    return stages[0] if len(stages) == 1 else ChainLexer(stages[0], chain(stages[1:]))
