"""What a response may call, the ids of its calls, and the record of what a rewrite did.

Every dialect asks the same `CallScope` before it turns markup into a call, so the request's
policy (`tool_choice: "none"`, `parallel_tool_calls: false`) holds whatever the dialect.
One scope spans one choice (Chat Completions) or one response (Responses API).
"""

from __future__ import annotations

import os
import secrets
import string
from collections import Counter
from dataclasses import dataclass, field

from .tools import RequestContext, ToolSpec

_ID_ALPHABET = string.ascii_letters + string.digits
MAX_NOTES = 20  # notes kept per flow: enough to explain, bounded for a flow of 10k broken calls


# Random bytes to id characters: bytes below 248 (4 x 62) map evenly onto the alphabet, the
# rest are dropped.
_ID_TABLE = bytes(_ID_ALPHABET[byte % len(_ID_ALPHABET)].encode()[0] for byte in range(256))
_ID_DROPPED = bytes(range(len(_ID_ALPHABET) * (256 // len(_ID_ALPHABET)), 256))


class IdCharacters:
    """Random id characters, read from the system's source 4 KB at a time (about 160 ids): a
    read per id was a system call per call made, 3 µs of a `<tool_call>` block's close (bench/
    HISTORY.md, the round "Block boundaries"). Each character is handed out once; a forked
    child forgets what its parent read ahead, so that two processes never hand out the same
    ones. (One thread takes ids: mitmproxy runs the addon in its event loop.)"""

    __slots__ = ("_chars", "_at")

    def __init__(self) -> None:
        self._chars = ""
        self._at = 0

    def take(self, length: int) -> str:
        at, end = self._at, self._at + length
        while end > len(self._chars):
            self._chars = self._chars[at:] + secrets.token_bytes(4096).translate(_ID_TABLE, _ID_DROPPED).decode()
            at, end = 0, length
        self._at = end
        return self._chars[at:end]

    def forget(self) -> None:
        self._chars = ""
        self._at = 0


_ID_CHARACTERS = IdCharacters()
os.register_at_fork(after_in_child=_ID_CHARACTERS.forget)


def random_id(prefix: str, length: int = 24) -> str:
    return prefix + _ID_CHARACTERS.take(length)


# Why a piece of markup did not become a call, or was changed on the way (flow annotations,
# the log, and the `toolshim.stats` counters, which group them in `report.CATEGORIES`).
INVALID_JSON = "invalid_json"  # the block's JSON could not be read, not even after repair
REPAIRED_JSON = "repaired_json"  # non-strict tool: broken JSON repaired once, call emitted
UNKNOWN_NAME = "unknown_name"  # names no declared tool
SCHEMA_MISMATCH = "schema_mismatch"  # non-strict tool: arguments do not fit, call emitted anyway
STRICT_FAILURE = "strict_failure"  # strict tool: arguments do not fit, no call
NOT_ALLOWED = "not_allowed"  # tool_choice "none", or a second call with parallel_tool_calls false
INVALID_SCHEMA = "invalid_schema"  # a declared tool's parameters are no JSON Schema: not validated


@dataclass(slots=True)
class RewriteStats:
    """What a rewrite did, for flow annotations, logs and the session's counters."""

    calls: int = 0
    names: list[str] = field(default_factory=list)
    finish_reasons_changed: int = 0
    problems: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)  # one line each, at most MAX_NOTES
    dialect_calls: Counter[str] = field(default_factory=Counter)  # calls made, by dialect
    dialect_problems: Counter[tuple[str, str]] = field(default_factory=Counter)  # (dialect, problem)
    # Upstream's own broken `tool_calls` stream, repaired (`native.py` repair kinds).
    stream_repairs: Counter[str] = field(default_factory=Counter)
    reasoning_moved: int = 0  # characters of `<think>` reasoning moved out of the content

    def note(self, problem: str, detail: str, dialect: str = "") -> None:
        self.problems[problem] += 1
        self.dialect_problems[dialect, problem] += 1
        if len(self.notes) < MAX_NOTES:
            self.notes.append(f"{problem}: {detail}")


class _Ledger:
    """What the dialects of one scope share: the calls made so far and the ids handed out."""

    __slots__ = ("made", "used_ids")

    def __init__(self) -> None:
        self.made = 0
        self.used_ids: set[str] = set()


class CallScope:
    """The calls one choice or response may still make, and the ids it has handed out.

    Each dialect gets its own view (`for_dialect`), sharing the ledger, so the calls it admits
    and the problems it notes are counted under its name (flow comments, `toolshim.stats`).
    """

    def __init__(self, context: RequestContext, stats: RewriteStats, dialect: str = "", ledger: _Ledger | None = None) -> None:
        self.context = context
        self.stats = stats
        self.dialect = dialect
        self._ledger = ledger or _Ledger()

    def for_dialect(self, dialect: str) -> CallScope:
        return CallScope(self.context, self.stats, dialect, self._ledger)

    @property
    def tools(self) -> dict[str, ToolSpec]:
        return self.context.tools

    def admit(self, name: str) -> bool:
        """Ask before emitting a call to `name`; True means emit it (and it is counted)."""
        return self.admit_all([name])

    def admit_all(self, names: list[str]) -> bool:
        """Ask before emitting several calls at once (one block listing them): all or none."""
        label = ", ".join(names)
        if self.context.tool_choice_none:
            self.note(NOT_ALLOWED, f"{label}: the request set tool_choice none")
            return False
        if (self._ledger.made or len(names) > 1) and not self.context.parallel_tool_calls:
            self.note(NOT_ALLOWED, f"{label}: only one call, parallel_tool_calls is false")
            return False
        self._ledger.made += len(names)
        self.stats.calls += len(names)
        self.stats.names.extend(names)
        self.stats.dialect_calls[self.dialect] += len(names)
        return True

    def note(self, problem: str, detail: str) -> None:
        self.stats.note(problem, detail, self.dialect)

    def note_upstream_call(self) -> None:
        """Upstream made a call of its own: with parallel_tool_calls false, none of ours follows."""
        self._ledger.made += 1

    def mint_call_id(self) -> str:
        """`call_` (`toolu_` for Anthropic) and 24 random alphanumerics, unique within the
        scope (seed 003)."""
        while True:
            call_id = random_id(self.context.call_id_prefix)
            if call_id not in self._ledger.used_ids:
                return self.claim_id(call_id)

    def claim_id(self, call_id: str) -> str:
        self._ledger.used_ids.add(call_id)
        return call_id

    def id_taken(self, call_id: str) -> bool:
        return call_id in self._ledger.used_ids


def excerpt(text: str, limit: int = 120) -> str:
    """Markup quoted in a note: enough to recognise it, bounded for a 1 MB block."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
