"""Instructions per flow of the sans-IO rewrite, counted by valgrind's callgrind: a figure that
does not move with the machine's load, for comparing two versions of the code (this shared VM's
timings move by a third from run to run; an instruction count moves by about 1%, with Python's
hash seed). Not a target row: an A/B tool.

    .venv/bin/python bench/instructions.py [KIND ...] [--reads N]

KIND: the end-to-end bench's streams (bench/e2e.py): plain, kimi, sentinel, xml, responses,
messages-plain, messages-kimi (default: all). `--reads N`: events per network read (default 8,
as in bursts; 1 as paced). `--hooks`: each flow goes through the addon's mitmproxy hooks as
well (mitmproxy's test flows: request headers, request, response headers, the stream callable,
response), which adds what a flow costs the addon besides its events (and the making of those
test flows, the same for any version). Each stream is 8 flows of about 200 events, fed through
a fresh rewriter each and closed; the count is that of two passes less that of none (start-up,
imports and a warm-up pass cancel out), per flow. Needs valgrind (Debian's package). To compare
an older version, point PYTHONPATH at its `addon/` (`git worktree add /tmp/old REV`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
FLOWS, PASSES = 8, 2


def feed(kind_name: str, reads: int, passes: int, hooks: bool) -> None:
    """(Run under valgrind.) Rewrite the kind's flows: one warm-up pass, then `passes`."""
    sys.path.insert(0, str(BENCH))
    import core
    import e2e
    import messages

    kind = kinds(e2e)[kind_name]
    flows = []
    for seed in range(FLOWS):
        events, _ = kind.stream(200, seed)
        flows.append([b"".join(events[at : at + reads]) for at in range(0, len(events), reads)])
    if hooks:
        through_hooks(kind, e2e.BODY_PATHS, flows, passes)
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


def through_hooks(kind, paths: dict[bytes, str], flows: list[list[bytes]], passes: int) -> None:
    """`feed`, each flow through the addon's hooks (mitmproxy's test flows and context)."""
    import logging

    from mitmproxy.test import taddons, tflow, tutils

    from toolshim.addon import ToolShim

    logging.disable(logging.CRITICAL)
    body = kind.request_body()
    path = paths.get(body, "/v1/chat/completions")
    shim = ToolShim()
    with taddons.context(shim) as tctx:
        tctx.configure(shim)
        for _ in range(1 + passes):
            for reads in flows:
                flow = tflow.tflow()
                flow.request.method, flow.request.path = "POST", path
                flow.request.headers["content-type"] = "application/json"
                flow.request.content = body
                shim.requestheaders(flow)
                shim.request(flow)
                flow.response = tutils.tresp(headers=((b"content-type", b"text/event-stream"), (b"transfer-encoding", b"chunked")))
                flow.response.raw_content = None
                shim.responseheaders(flow)
                for read in reads:
                    flow.response.stream(read)
                flow.response.stream(b"")
                shim.response(flow)


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


def main(argv: list[str]) -> int:
    if argv[:1] == ["--feed"]:
        feed(argv[1], int(argv[2]), int(argv[3]), argv[4] == "1")
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
    sys.path.insert(0, str(BENCH))
    import e2e

    for kind in argv or list(kinds(e2e)):
        count = (instructions(kind, reads, PASSES, hooks) - instructions(kind, reads, 0, hooks)) / (PASSES * FLOWS)
        print(f"{kind}, {reads} event(s) a read{', through the hooks' if hooks else ''}: {count / 1e6:.2f} M instructions a flow")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
