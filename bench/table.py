"""The rows every benchmark returns, and the table `bench/run.py` prints."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    section: str  # "core", "scaling", "end to end"
    measure: str  # what was measured, e.g. "fast path (plain text), events/s"
    value: str  # the figure, formatted
    target: str = ""  # e.g. ">= 3x floor"; empty: for context only
    met: bool | None = None  # None: no target


def markdown(rows: list[Row]) -> str:
    lines = ["| section | measure | value | target | met |", "|---|---|---|---|---|"]
    for row in rows:
        met = "" if row.met is None else ("yes" if row.met else "**no**")
        lines.append(f"| {row.section} | {row.measure} | {row.value} | {row.target} | {met} |")
    return "\n".join(lines)
