"""What toolshim tells people about its work: a flow's comment and mark, and the session's counters.

Sans-IO: the addon hands in each flow's `RewriteStats` and prints what comes out (the flow's
comment in mitmweb, `toolshim.stats`, the summary line at shutdown).

The counters are kept per dialect and per category. A category says what went wrong upstream:

    LeakedMarkup       tool-call markup in the text, turned into a call
    InvalidJson        a call's JSON was broken (repaired once for non-strict tools, else text)
    UnknownName        markup called a tool the request did not declare (stays text)
    SchemaMismatch     arguments that do not fit the tool's schema (strict: stays text;
                       otherwise the call is made), or a declared schema that is no JSON Schema
    BrokenStreamShape  upstream's own `tool_calls` stream broke the wire rules, repaired
    NotAllowed         markup the request forbade (tool_choice none, parallel_tool_calls false)

Upstream's own calls are counted under the dialect `native`.

Request repairs (history.py) are counted by repair, with the turns whose reasoning was wanted and
not known (misses) and the shared state's failures beside them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .calls import (
    INVALID_JSON,
    INVALID_SCHEMA,
    NOT_ALLOWED,
    REPAIRED_JSON,
    SCHEMA_MISMATCH,
    STRICT_FAILURE,
    UNKNOWN_NAME,
    RewriteStats,
)

LEAKED_MARKUP = "LeakedMarkup"
BROKEN_STREAM_SHAPE = "BrokenStreamShape"
CATEGORY_OF_PROBLEM = {
    INVALID_JSON: "InvalidJson",
    REPAIRED_JSON: "InvalidJson",
    UNKNOWN_NAME: "UnknownName",
    SCHEMA_MISMATCH: "SchemaMismatch",
    STRICT_FAILURE: "SchemaMismatch",
    INVALID_SCHEMA: "SchemaMismatch",
    NOT_ALLOWED: "NotAllowed",
}
CATEGORIES = (LEAKED_MARKUP, "InvalidJson", "UnknownName", "SchemaMismatch", BROKEN_STREAM_SHAPE, "NotAllowed")
NATIVE = "native"  # upstream's own tool_calls, not markup

# Problems after which the markup stayed text: the model tried to call and the client saw none.
_LEFT_AS_TEXT = {INVALID_JSON: "invalid JSON", UNKNOWN_NAME: "unknown tool", STRICT_FAILURE: "strict schema", NOT_ALLOWED: "not allowed"}
# Problems after which the call was made all the same.
_REPAIRED = {REPAIRED_JSON: "JSON repaired", SCHEMA_MISMATCH: "schema mismatch"}

MARK_REWRITTEN = ":wrench:"  # 🔧 markup became calls, or a stream was repaired
MARK_ATTENTION = ":warning:"  # markup stayed text, a required call is missing, or rewriting failed


def tally(stats: RewriteStats) -> dict[str, dict[str, int]]:
    """dialect -> category -> count, for one flow (plain dicts: it goes into flow.metadata)."""
    table: dict[str, dict[str, int]] = {}

    def add(dialect: str, category: str, count: int) -> None:
        if count:
            row = table.setdefault(dialect or "unknown", {})
            row[category] = row.get(category, 0) + count

    for dialect, count in stats.dialect_calls.items():
        add(dialect, LEAKED_MARKUP, count)
    for (dialect, problem), count in stats.dialect_problems.items():
        add(dialect, CATEGORY_OF_PROBLEM.get(problem, problem), count)
    add(NATIVE, BROKEN_STREAM_SHAPE, sum(stats.stream_repairs.values()))
    return table


@dataclass(frozen=True, slots=True)
class FlowOutcome:
    """What happened to one flow, as the addon saw it."""

    stats: RewriteStats
    changed: bool  # the client got something else than upstream sent
    emulated: bool = False
    required_call_missing: bool = False
    failed: bool = False  # the rewrite raised; the rest of the flow passed unchanged

    @property
    def needs_attention(self) -> bool:
        left_as_text = any(self.stats.problems[problem] for problem in _LEFT_AS_TEXT)
        return self.failed or self.required_call_missing or left_as_text

    @property
    def worth_noting(self) -> bool:
        """Does the flow get a comment, a mark and counters of its own?"""
        return self.changed or self.emulated or self.failed or bool(self.stats.problems)

    def mark(self) -> str:
        if self.needs_attention:
            return MARK_ATTENTION
        return MARK_REWRITTEN if self.changed else ""

    def comment(self) -> str:
        """One line for mitmweb's flow list, e.g.
        `toolshim: kimi → 2 calls (bash ×2) · repaired: JSON repaired ×1 · left as text: unknown tool ×1`."""
        stats = self.stats
        parts = []
        if stats.calls:
            dialects = ", ".join(f"{dialect or 'markup'}" for dialect in stats.dialect_calls)
            plural = "s" if stats.calls > 1 else ""
            parts.append(f"{dialects} → {stats.calls} call{plural} ({_counted(stats.names)})")
        else:
            parts.append("no call from markup")
        repaired = [f"{label} ×{stats.problems[p]}" for p, label in _REPAIRED.items() if stats.problems[p]]
        if stats.stream_repairs:
            repaired.append(f"upstream's own calls ({_counted(stats.stream_repairs.elements())})")
        if stats.reasoning_moved:
            repaired.append("reasoning split from content")
        if repaired:
            parts.append("repaired: " + ", ".join(repaired))
        left = [f"{label} ×{stats.problems[p]}" for p, label in _LEFT_AS_TEXT.items() if stats.problems[p]]
        if left:
            parts.append("left as text: " + ", ".join(left))
        if self.emulated:
            parts.append("tools emulated")
        if self.required_call_missing:
            parts.append("required call missing")
        if self.failed:
            parts.append("rewrite failed, the rest passed unchanged")
        return "toolshim: " + " · ".join(parts)


REQUEST_REPAIR_LABELS = {
    "reasoning": "reasoning restored",
    "kimi_ids": "Kimi ids",
    "orphan_results": "results added",
    "tool_content": "tool content as text",
    "developer_role": "developer → system",
    "strip_strict": "strict removed",
    "strip_parallel_tool_calls": "parallel_tool_calls removed",
}


def _repair_label(change: dict) -> str:
    if change.get("placeholder"):
        return "reasoning placeholder"
    return REQUEST_REPAIR_LABELS.get(change["repair"], change["repair"])


def request_comment(changes: list[dict], misses: list[str]) -> str:
    """What was done to a request, e.g. `reasoning restored ×2, Kimi ids ×3 · reasoning not known ×1`."""
    parts = []
    if changes:
        parts.append(_counted(_repair_label(change) for change in changes))
    if misses:
        parts.append(f"reasoning not known ×{len(misses)}")
    return " · ".join(parts)


def _counted(names) -> str:
    counts = Counter(names)
    return ", ".join(name if n == 1 else f"{name} ×{n}" for name, n in counts.items())


@dataclass
class SessionCounters:
    """Everything toolshim did since mitmproxy started: `toolshim.stats` and the shutdown line."""

    flows: Counter[str] = field(default_factory=Counter)  # LLM flows seen, by API
    rewritten: int = 0
    failed: int = 0
    calls: int = 0
    table: Counter[tuple[str, str]] = field(default_factory=Counter)  # (dialect, category)
    requests_repaired: int = 0
    request_repairs: Counter[str] = field(default_factory=Counter)  # repair -> changes made
    reasoning_misses: int = 0
    state_unreachable: int = 0  # set by the addon from its state before printing

    def add_request(self, changes: list[dict], misses: int) -> None:
        self.requests_repaired += bool(changes)
        for change in changes:
            self.request_repairs["reasoning_placeholder" if change.get("placeholder") else change["repair"]] += 1
        self.reasoning_misses += misses

    def count_flow(self, api: str) -> None:
        self.flows[api] += 1

    def add(self, outcome: FlowOutcome) -> None:
        self.rewritten += outcome.changed
        self.failed += outcome.failed
        self.calls += outcome.stats.calls
        for dialect, row in tally(outcome.stats).items():
            for category, count in row.items():
                self.table[dialect, category] += count

    def summary_line(self) -> str:
        seen = sum(self.flows.values())
        by_category = Counter()
        for (_, category), count in self.table.items():
            by_category[category] += count
        categories = ", ".join(f"{c} {by_category[c]}" for c in CATEGORIES if by_category[c])
        return (
            f"toolshim: {seen} LLM flow{'s' if seen != 1 else ''}, {self.rewritten} rewritten, "
            f"{self.calls} call{'s' if self.calls != 1 else ''} from markup, {self.failed} failed"
            + (f"; {categories}" if categories else "")
            + self._request_summary()
        )

    def _request_summary(self) -> str:
        """`; requests: 3 repaired (reasoning 2, kimi_ids 4), reasoning not known 1, state unreachable 2`,
        or nothing when no request needed anything."""
        parts = []
        if self.requests_repaired:
            repairs = ", ".join(f"{name} {count}" for name, count in sorted(self.request_repairs.items()))
            parts.append(f"{self.requests_repaired} repaired ({repairs})")
        if self.reasoning_misses:
            parts.append(f"reasoning not known {self.reasoning_misses}")
        if self.state_unreachable:
            parts.append(f"state unreachable {self.state_unreachable}")
        return "; requests: " + ", ".join(parts) if parts else ""

    def render(self) -> str:
        """The `toolshim.stats` table: one row per dialect, one column per category."""
        lines = [self.summary_line()]
        apis = ", ".join(f"{api} {n}" for api, n in sorted(self.flows.items()))
        lines.append(f"flows by API: {apis or 'none yet'}")
        dialects = sorted({dialect for dialect, _ in self.table})
        if not dialects:
            lines.append("nothing repaired or noted yet")
            return "\n".join(lines)
        width = max(len("dialect"), *(len(d) for d in dialects))
        lines.append("  ".join(["dialect".ljust(width), *CATEGORIES]))
        for dialect in dialects:
            cells = [str(self.table[dialect, c]).rjust(len(c)) for c in CATEGORIES]
            lines.append("  ".join([dialect.ljust(width), *cells]))
        return "\n".join(lines)
