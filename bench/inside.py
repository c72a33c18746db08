"""The stream callable's CPU inside real mitmdumps, two versions side by side: the A/B measure
for a change aimed at the end-to-end rows.

    .venv/bin/python bench/inside.py KIND[,KIND...] --a DIR [--b DIR] [--runs N] [--paced] [--baseline]

Two mitmdumps run `bench/timed_addon.py`, each with toolshim from its own `addon/` directory
(`--a`: another version's, from `git worktree add /tmp/old REV`; `--b`: this checkout's by
default), under bench/e2e.py's load (40 streams at once, 2,500 events/s a proxy, in bursts of 8
events a read; `--paced`: one event a read), sent through both at once, the proxy that connects
first changing from run to run. Each proxy times every call of its stream callable, of
remembering the turn and of the flow's hooks in its thread's CPU time. Printed per KIND (e2e's
streams: plain, kimi, sentinel, xml, responses, messages-plain, messages-kimi): the callable's
milliseconds a flow in A and in B and their ratio; remembering's share of it; the stream's first
three reads apart, and each of them (they learn its frames and make its lanes); the later reads'
median and 90th percentile in µs; the flow's hooks (request headers, request, response headers,
response: ms a flow); and the garbage collector's pauses, which are left out of the calls they
fall in (`timed_addon.py`), with its collections a flow by generation (mitmdump's whole process:
the full collections, a few a minute, are most of it); `--baseline` runs a third proxy, with
`stream = True`, for its garbage collector's figures.

Why not the CPU rows: they divide the whole process's CPU by the baseline's, and move by ±0.1
from run to run with whatever else the machine does; why not `bench/instructions.py --cold`: it
models a read's cache misses, where this times them. Two proxies running the same code (`--a` and
`--b` alike) read within 1–6% of each other over 4 runs (160 flows each), 1–2% over 8:
differences smaller than that are not told apart. A run is a few seconds (a load is 25 bursts
128 ms apart); starting the proxies and warming them up, about ten more a kind.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import e2e  # noqa: E402

KINDS = {
    "plain": e2e.PLAIN, "kimi": e2e.KIMI, "sentinel": e2e.SENTINEL, "xml": e2e.XML, "responses": e2e.RESPONSES_SENTINEL,
    "messages-plain": e2e.MESSAGES_PLAIN, "messages-kimi": e2e.MESSAGES_KIMI,
}  # fmt: skip
STREAMS, INTERVAL, EVENTS = 40, 0.016, 200  # (e2e.py's CPU rows' load)
WARM_FLOWS = 8


def measure(kind: e2e.Kind, addons: dict[str, Path | str], runs: int, burst: int, out_dir: Path) -> dict[str, dict]:
    """Each proxy's totals (`timed_addon.Timings.done`) after `runs` runs of the kind's load (an
    addon of "": the baseline)."""
    outs = {name: out_dir / f"{kind.name[:12]}-{name}.jsonl".replace(" ", "_") for name in addons}
    with e2e.Rig() as rig:
        proxies = []
        for name, addon in addons.items():
            os.environ["TOOLSHIM_INSIDE_ADDON"], os.environ["TOOLSHIM_INSIDE_OUT"] = str(addon), str(outs[name])
            proxies.append(rig.proxy(name, BENCH / "timed_addon.py"))
        load = e2e.make_load(rig, kind, STREAMS, EVENTS, INTERVAL, burst=burst)
        warm = e2e.Load(load.jobs[:WARM_FLOWS], 0, 0, load.body)
        rig.fetch_many([(proxy, warm.jobs) for proxy in proxies], WARM_FLOWS, 120)
        order = random.Random(7)
        for _ in range(runs):
            time.sleep(0.2)  # the previous run's connections are closed
            rig.fetch_many([(proxy, load.jobs) for proxy in order.sample(proxies, len(proxies))], STREAMS, EVENTS * INTERVAL * burst * 10 + 30)
    # (the proxies stopped: each wrote its totals at shutdown)
    return {name: orjson.loads(path.read_bytes().splitlines()[-1]) for name, path in outs.items()}


def summary(totals: dict) -> dict[str, Any]:
    """Per flow, in ms; the later reads' median and 90th percentile in µs."""
    flows, later = max(totals["flows"], 1), sorted(totals["later"])
    callable_ = sum(totals["first"]) + sum(later)
    return {
        "callable": callable_ / flows * 1e3,
        "remembering": totals["remembering"] / flows * 1e3,
        "first": sum(totals["first"]) / flows * 1e3,
        "each first": [spent / flows * 1e3 for spent in totals["first"]],
        "median": statistics.median(later) * 1e6 if later else 0.0,
        "p90": later[int(0.9 * (len(later) - 1))] * 1e6 if later else 0.0,
        "collecting": totals["collecting"] / flows * 1e3,
        "hooks": totals["hooks"] / flows * 1e3,
        "collections": [count / flows for count in totals["collections"]],
    }


def collector(figures: dict[str, Any]) -> str:
    collections = ", ".join(f"{count:.2f}" for count in figures["collections"])
    return f"{figures['collecting']:.3f} ms a flow (the whole process's; collections a flow by generation: {collections})"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kinds", help=f"comma-separated: {', '.join(KINDS)}")
    parser.add_argument("--a", required=True, type=Path, help="the addon/ directory of version A")
    parser.add_argument("--b", type=Path, default=BENCH.parent / "addon", help="the addon/ directory of version B (this checkout's)")
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--paced", action="store_true", help="one event a read (default: bursts of 8)")
    parser.add_argument("--baseline", action="store_true", help="a third proxy, `stream = True`: its garbage collector beside the addon's")
    args = parser.parse_args(argv)
    unknown = [name for name in args.kinds.split(",") if name not in KINDS]
    if unknown:
        parser.error(f"unknown kind(s): {', '.join(unknown)}")
    for side in (args.a, args.b):
        if not (side / "toolshim" / "addon.py").is_file():
            parser.error(f"{side} holds no toolshim package (give a version's addon/ directory)")
    burst = 1 if args.paced else e2e.BURST
    with tempfile.TemporaryDirectory(prefix="toolshim-inside-") as out_dir:
        for name in args.kinds.split(","):
            kind = KINDS[name]
            sides = {"A": args.a, "B": args.b, **({"baseline": ""} if args.baseline else {})}
            got = {side: summary(totals) for side, totals in measure(kind, sides, args.runs, burst, Path(out_dir)).items()}
            a, b = got["A"], got["B"]
            base = got.pop("baseline", None)
            print(f"{name} ({'paced' if args.paced else 'in bursts'}, {args.runs} runs of {STREAMS} flows):")
            for side, figures in got.items():
                first_reads = ", ".join(f"{each:.3f}" for each in figures["each first"])
                print(
                    f"  {side}: {figures['callable']:.3f} ms a flow (remembering {figures['remembering']:.3f}, "
                    f"first three reads {figures['first']:.3f}: {first_reads}); "
                    f"later reads: median {figures['median']:.0f} µs, p90 {figures['p90']:.0f} µs; "
                    f"the flow's hooks {figures['hooks']:.3f} ms; "
                    f"the garbage collector, left out of them all: {collector(figures)}"
                )
            print(f"  B/A: {b['callable'] / a['callable']:.3f} (later reads' median {b['median'] / a['median']:.3f})")
            if base is not None:
                print(f"  baseline (`stream = True`): the garbage collector {collector(base)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
