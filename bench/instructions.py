"""Instructions per flow of the sans-IO rewrite, counted by valgrind's callgrind: a figure that
does not move with the machine's load, for comparing two versions of the code (this shared VM's
timings move by a third from run to run; an instruction count moves by about 1%, with Python's
hash seed). Not a target row: an A/B tool.

    .venv/bin/python bench/instructions.py [KIND ...] [--reads N] [--hooks] [--cold] [--set NAME=VALUE] [--no-gc]

KIND: the end-to-end bench's streams (bench/e2e.py): plain, kimi, sentinel, xml, responses,
messages-plain, messages-kimi (default: all). `--reads N`: events per network read (default 8, as
in bursts; 1 as paced). `--hooks`: each flow goes through the addon's mitmproxy hooks as well
(mitmproxy's test flows: request headers, request, response headers, the stream callable,
response), which adds what a flow costs the addon besides its events (and the making of those test
flows, the same for any version). `--set NAME=VALUE` (with `--hooks` or `--cold`; again for more):
an option of the addon for the flows, e.g. `toolshim_request_repairs=off`, which leaves remembering
the turn out (a quarter of the Kimi flows' `--cold` cycles). `--no-gc`: the garbage collector
off in the runs counted: where it runs moves with every allocation a change adds or takes away,
and a full collection in one version's passes and not the other's moves the count by 1-3%. Each
stream is 8 flows of about 200 events, fed through a fresh rewriter each and closed; the count is
that of two passes less that of none (start-up, imports and a warm-up pass cancel out), per
flow. Needs valgrind (Debian's package). To compare an older version, point PYTHONPATH at its
`addon/` (`git worktree add /tmp/old REV`).

`--cold`: what a flow's reads cost when each begins with cold caches, as inside a busy mitmdump,
where each read of a stream comes after mitmproxy's own work for other reads (about 0.5 ms, bursts
of 40 streams). There the addon's stream callable took 2.5-3x its in-process time, and compiling
it with Cython, 1.2-1.5x faster in process, took no less: the cost is the cache misses of the
code and data a read touches, more than its instructions. Each read of the flows (through the
hooks) comes after a copy of 1 MB and a parse of a few lines of Python source (which runs a
large part of the interpreter), with callgrind simulating 32 KB first-level caches and a 512 KB
last level; only the stream callable's calls are counted (`--toggle-collect` on
`operator.call`, through which the reads go), less those of an identity callable in its place.
The figure is callgrind's cycle estimate: instructions + 10 per first-level miss + 100 per
last-level miss (about a minute a stream on two cores).
"""

from __future__ import annotations

import gc
import operator
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
FLOWS, PASSES = 8, 2
COLD_FLOWS = 4  # (each read simulated cold costs about a millisecond of valgrind's time)
CACHES = ["--cache-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64", "--LL=524288,8,64"]
COLD_EVENTS = ("Ir", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")
OPTIONS = "TOOLSHIM_INSTRUCTIONS_SET"  # (`--set`, to the runs under valgrind: one NAME=VALUE a line)
NO_GC = "TOOLSHIM_INSTRUCTIONS_NO_GC"  # (`--no-gc`, to the runs under valgrind)


def feed(kind_name: str, reads: int, passes: int, hooks: bool, cold: str = "") -> None:
    """(Run under valgrind.) Rewrite the kind's flows: one warm-up pass, then `passes`. `cold`:
    "addon" or "identity" (the stream callable replaced), each read of the passes cold."""
    if os.environ.get(NO_GC):
        gc.disable()
    sys.path.insert(0, str(BENCH))
    import core
    import e2e
    import messages

    kind = kinds(e2e)[kind_name]
    flows = []
    for seed in range(COLD_FLOWS if cold else FLOWS):
        events, _ = kind.stream(200, seed)
        flows.append([b"".join(events[at : at + reads]) for at in range(0, len(events), reads)])
    if hooks or cold:
        through_hooks(kind, e2e.BODY_PATHS, flows, passes, cold)
        return
    if kind.api == e2e.MESSAGES:
        make = messages.rewriter(kind.model)
    elif kind.api == e2e.RESPONSES:
        make = core.responses_rewriter(kind.model)
    else:
        make = core.chat_rewriter(kind.model)
    for _ in range(1 + passes):
        for flow in flows:
            rewriter = make()
            for read in flow:
                rewriter.feed(read)
            rewriter.close()


def through_hooks(kind, paths: dict[bytes, str], flows: list[list[bytes]], passes: int, cold: str) -> None:
    """`feed`, each flow through the addon's hooks (mitmproxy's test flows and context)."""
    import ast
    import logging

    from mitmproxy.test import taddons

    from toolshim.addon import ToolShim

    logging.disable(logging.CRITICAL)
    body = kind.request_body()
    path = paths.get(body, "/v1/chat/completions")
    shim = ToolShim()
    lines = bytes(1 << 20)
    source = "\n".join(f"def f{n}(a, b=2, *c, **d):\n    return [x async for x in a if x > {n}] or {{'k': b}}" for n in range(4))

    def evict() -> None:
        bytes(lines)  # every line of the simulated last level replaced
        ast.parse(source)  # the interpreter's parser and compiler run: the code caches replaced

    with taddons.context(shim) as tctx:
        tctx.configure(shim)
        if os.environ.get(OPTIONS):
            tctx.options.set(*os.environ[OPTIONS].split("\n"))
        for done in range(1 + passes):
            for reads in flows:
                flow = streaming_flow(shim, body, path)
                if not (cold and done):
                    for read in reads:
                        flow.response.stream(read)
                    flow.response.stream(b"")
                else:
                    stream = flow.response.stream if cold == "addon" else (lambda data: [data])
                    for read in [*reads, b""]:
                        evict()
                        operator.call(stream, read)  # (what callgrind counts: --toggle-collect)
                shim.response(flow)


def streaming_flow(shim, body: bytes, path: str):
    """A flow (mitmproxy's test flow) of `body` to `path` through the addon's hooks up to its
    streamed response's headers: its `response.stream` is the addon's stream callable."""
    from mitmproxy.test import tflow, tutils

    flow = tflow.tflow()
    flow.request.method, flow.request.path = "POST", path
    flow.request.headers["content-type"] = "application/json"
    flow.request.content = body
    shim.requestheaders(flow)
    shim.request(flow)
    flow.response = tutils.tresp(headers=((b"content-type", b"text/event-stream"), (b"transfer-encoding", b"chunked")))
    flow.response.raw_content = None
    shim.responseheaders(flow)
    return flow


def kinds(e2e) -> dict:
    """The end-to-end bench's streams (`e2e`, the module), by a short name."""
    return {
        "plain": e2e.PLAIN, "kimi": e2e.KIMI, "sentinel": e2e.SENTINEL, "xml": e2e.XML, "responses": e2e.RESPONSES_SENTINEL,
        "messages-plain": e2e.MESSAGES_PLAIN, "messages-kimi": e2e.MESSAGES_KIMI,
    }  # fmt: skip


def instructions(kind: str, reads: int, passes: int, hooks: bool) -> int:
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__, "--feed", kind, str(reads), str(passes), str(int(hooks))]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"}, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no count from callgrind: {done.stderr[-500:]}")
    return int(found[1])


def cold_cycles(kind: str, reads: int) -> tuple[float, dict[str, float]]:
    """The `--cold` figure of a flow: callgrind's cycle estimate, and its events, per flow."""
    running = {}
    for stream in ("addon", "identity"):  # (side by side: one core each)
        command = [
            "valgrind", "--tool=callgrind", *CACHES, "--toggle-collect=_operator_call", "--callgrind-out-file=/dev/null",
            sys.executable, __file__, "--feed", kind, str(reads), str(PASSES), "1", stream,
        ]  # fmt: skip
        running[stream] = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    counts = {}
    for stream, process in running.items():
        stderr = process.communicate()[1]
        names, found = re.search(r"Events\s*:\s*(.*)", stderr), re.search(r"Collected : (.*)", stderr)
        if process.returncode or names is None or found is None or not found[1].split() or int(found[1].split()[0]) == 0:
            raise RuntimeError(f"callgrind counted nothing in operator.call (is libpython's symbol table there?): {stderr[-500:]}")
        values = [int(value) for value in found[1].split()]  # (trailing zeros are left off)
        counts[stream] = {name: values[at] if at < len(values) else 0 for at, name in enumerate(names[1].split())}
    flow = {name: (counts["addon"][name] - counts["identity"][name]) / (PASSES * COLD_FLOWS) for name in COLD_EVENTS}
    first = flow["I1mr"] + flow["D1mr"] + flow["D1mw"]
    last = flow["ILmr"] + flow["DLmr"] + flow["DLmw"]
    return flow["Ir"] + 10 * first + 100 * last, {"Ir": flow["Ir"], "L1 misses": first, "LL misses": last}


def unknown_kinds(unknown: list[str], known: dict) -> int:
    """A clear error for arguments that are neither a stream nor an option (exit status 2)."""
    print(f"not a stream nor an option: {' '.join(unknown)} (streams: {', '.join(known)}; --help for the options)", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    if "--help" in argv or "-h" in argv:
        print(__doc__)
        return 0
    if argv[:1] == ["--feed"]:
        feed(argv[1], int(argv[2]), int(argv[3]), argv[4] == "1", argv[5] if len(argv) > 5 else "")
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    reads = 8
    if "--reads" in argv:
        at = argv.index("--reads")
        reads = int(argv[at + 1])
        del argv[at : at + 2]
    hooks = "--hooks" in argv
    if hooks:
        argv.remove("--hooks")
    if "--no-gc" in argv:
        argv.remove("--no-gc")
        os.environ[NO_GC] = "1"
    cold = "--cold" in argv
    if cold:
        argv.remove("--cold")
    settings = []
    while "--set" in argv:
        at = argv.index("--set")
        settings.append(argv[at + 1])
        del argv[at : at + 2]
    if settings:
        if not (hooks or cold):
            print("--set needs --hooks or --cold (the addon's options reach the flows through its hooks)", file=sys.stderr)
            return 2
        os.environ[OPTIONS] = "\n".join(settings)
    sys.path.insert(0, str(BENCH))
    import e2e

    if unknown := [name for name in argv if name not in kinds(e2e)]:
        return unknown_kinds(unknown, kinds(e2e))
    for kind in argv or list(kinds(e2e)):
        if cold:
            cycles, parts = cold_cycles(kind, reads)
            detail = ", ".join(f"{name} {value / 1e6:.2f} M" if name == "Ir" else f"{name} {value / 1e3:.1f} K" for name, value in parts.items())
            print(f"{kind}, {reads} event(s) a read, each read cold: {cycles / 1e6:.2f} M cycles (estimated) a flow ({detail})")
            continue
        count = (instructions(kind, reads, PASSES, hooks) - instructions(kind, reads, 0, hooks)) / (PASSES * FLOWS)
        print(f"{kind}, {reads} event(s) a read{', through the hooks' if hooks else ''}: {count / 1e6:.2f} M instructions a flow")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
