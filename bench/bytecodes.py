"""Where a flow's Python work goes: the bytecodes the addon's stream callable runs, by function
and by network read, counted by a tracer (`sys.settrace` with opcode events). Not a target row:
a map for deciding what to cut, next to bench/instructions.py (which counts what the machine
runs, C included, and `--cold` what a read costs inside a busy proxy). Fast (a few seconds a
stream) and exact: a bytecode count moves with no machine's load, only with the code.

    .venv/bin/python bench/bytecodes.py [KIND ...] [--top N] [--reads] [--lines FUNCTION]

KIND: the end-to-end bench's streams (bench/e2e.py): plain, kimi, sentinel, xml, responses,
messages-plain, messages-kimi (default: kimi). Each is 4 flows of about 200 events in reads of 8
(as in bursts) through the addon's mitmproxy hooks (mitmproxy's test flows); the second of two
passes is counted, per flow. `--top N`: the N functions that run the most bytecodes (default
25), with their calls. `--reads`: the bytecodes of each read of the first flow (its first reads
start the stream; the last but one ends it, and remembering the turn runs there). `--lines
FUNCTION`: that function's bytecodes line by line. Point PYTHONPATH at another version's
`addon/` to compare.
"""

from __future__ import annotations

import collections
import logging
import sys
from pathlib import Path
from types import FrameType
from typing import Any

BENCH = Path(__file__).resolve().parent
FLOWS, READ = 4, 8


def count(kind_name: str, lines_of: str = "") -> tuple[collections.Counter, collections.Counter, list[int], collections.Counter]:
    """Bytecodes by function (`file:line:name`), calls by function, bytecodes by read of the
    first flow, and bytecodes by line of `lines_of` (a function's name)."""
    sys.path.insert(0, str(BENCH))
    import e2e
    import instructions
    from mitmproxy.test import taddons

    from toolshim.addon import ToolShim

    kind = instructions.kinds(e2e)[kind_name]
    bytecodes: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    by_line: collections.Counter = collections.Counter()

    def tracer(frame: FrameType, event: str, _arg: Any) -> Any:
        code = frame.f_code
        name = f"{Path(code.co_filename).name}:{code.co_firstlineno}:{code.co_name}"
        if event == "call":
            calls[name] += 1
            frame.f_trace_opcodes, frame.f_trace_lines = True, False
        elif event == "opcode":
            bytecodes[name] += 1
            if code.co_name == lines_of:
                by_line[frame.f_lineno] += 1
        return tracer

    logging.disable(logging.CRITICAL)
    shim = ToolShim()
    per_read: list[int] = []
    body = kind.request_body()
    path = e2e.BODY_PATHS.get(body, "/v1/chat/completions")
    with taddons.context(shim) as tctx:
        tctx.configure(shim)
        for seed in range(FLOWS):
            events, _ = kind.stream(200, seed)
            reads = [b"".join(events[at : at + READ]) for at in range(0, len(events), READ)] + [b""]
            for counted in (False, True):  # (a warm-up pass: what a first flow alone does is not counted)
                flow = instructions.streaming_flow(shim, body, path)
                for read in reads:
                    before = sum(bytecodes.values())
                    if counted:
                        sys.settrace(tracer)
                    try:
                        flow.response.stream(read)
                    finally:
                        sys.settrace(None)
                    if counted and seed == 0:
                        per_read.append(sum(bytecodes.values()) - before)
                shim.response(flow)
    return bytecodes, calls, per_read, by_line


def main(argv: list[str]) -> int:
    if "--help" in argv or "-h" in argv:
        print(__doc__)
        return 0
    top, lines_of, show_reads = 25, "", False
    for option in ("--top", "--lines"):
        if option in argv:
            at = argv.index(option)
            value = argv[at + 1] if at + 1 < len(argv) else ""
            if not value or (option == "--top" and not value.isdigit()):
                print(f"{option} needs a value: {'--top N (a number)' if option == '--top' else '--lines FUNCTION'}", file=sys.stderr)
                return 2
            del argv[at : at + 2]
            if option == "--top":
                top = int(value)
            else:
                lines_of = value
    if "--reads" in argv:
        argv.remove("--reads")
        show_reads = True
    sys.path.insert(0, str(BENCH))
    import e2e
    import instructions

    if unknown := [name for name in argv if name not in instructions.kinds(e2e)]:
        return instructions.unknown_kinds(unknown, instructions.kinds(e2e))
    for kind in argv or ["kimi"]:
        bytecodes, calls, per_read, by_line = count(kind, lines_of)
        total = sum(bytecodes.values())
        print(f"{kind}: {total / FLOWS / 1e3:.1f} K bytecodes a flow, {sum(calls.values()) / FLOWS:.0f} Python calls")
        for name, ran in bytecodes.most_common(top):
            print(f"  {ran / FLOWS:9.0f}  {100 * ran / total:5.1f}%  {calls[name] / FLOWS:6.0f} calls  {name}")
        if show_reads:
            print("  reads of the first flow:", " ".join(f"{n}:{ran}" for n, ran in enumerate(per_read)))
        if lines_of:
            for line, ran in sorted(by_line.items(), key=lambda item: item[0] or 0):
                print(f"  {lines_of}:{line} {ran / FLOWS:9.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
