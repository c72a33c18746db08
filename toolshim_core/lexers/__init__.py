"""The markup dialects, and how they share one text channel.

A channel runs every dialect in a chain: Kimi first (its special tokens cannot occur in prose),
then the `<tool_call>` sentinel blocks on the text Kimi leaves. Dialects are picked per model in
a later step; running both costs one scan per dialect and cannot misfire, because each only
turns structured markup naming a declared tool into a call.
"""

from __future__ import annotations

from ..calls import CallScope
from .base import ChainLexer, Lexer, PlainText
from .kimi import KimiCallNamer, KimiLexer
from .sentinel import SentinelLexer


class ScopeLexers:
    """Makes the lexers of every channel of one scope (a Chat choice, a Responses response)."""

    def __init__(self, scope: CallScope, *, max_held: int) -> None:
        self.scope = scope
        self._kimi_namer = KimiCallNamer(scope)  # shared: Kimi ids stay unique across channels
        self._max_held = max_held

    def new_lexer(self, *, reasoning: bool) -> Lexer:
        if self.scope.context.tool_choice_none:
            return PlainText()  # no call may be made: the markup is the model's text, verbatim
        return ChainLexer(
            KimiLexer(self._kimi_namer, reasoning=reasoning, max_held=self._max_held),
            SentinelLexer(self.scope, max_held=self._max_held),
        )
