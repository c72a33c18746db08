"""toolshim with its stream callable timed: the mitmproxy script `bench/inside.py` runs.

`mitmdump -s bench/timed_addon.py` loads toolshim from the `addon/` directory named by
TOOLSHIM_INSIDE_ADDON (another version's, for an A/B; empty: the baseline, bench/passthrough.py,
whose garbage collector alone is counted), times each call of the stream callable,
of remembering the turn and of the flow hooks (HOOKS) in CPU time of the thread that runs them
(`time.thread_time`: what the proxy's CPU rows count, without the other processes), and at
shutdown (`done`) appends one JSON line of totals to TOOLSHIM_INSIDE_OUT. Flows and behaviour
are toolshim's own.

The garbage collector's pauses are left out of the call they fall in and counted apart: a full
collection of mitmdump's heap takes tens of milliseconds, and which read it lands in is chance
(with it, the first reads of two proxies running the same code read 0.56 and 0.80 ms a flow).
"""

from __future__ import annotations

import gc
import os
import sys
import time

import orjson

ADDON = os.environ.get("TOOLSHIM_INSIDE_ADDON", "")  # empty: the baseline (bench/passthrough.py)
if ADDON:
    sys.path.insert(0, ADDON)
    from toolshim import addon as toolshim_addon

HOOKS = ("requestheaders", "request", "responseheaders", "response")
FIRST_READS = 3  # a stream's first reads, counted apart: they learn its frames and make its lanes


class Timings:
    def __init__(self) -> None:
        self.first = [0.0] * FIRST_READS  # seconds in each of a stream's first reads, all streams
        self.later: list[float] = []  # seconds of each later read (the end of the stream's too)
        self.parts = {"remembering": 0.0, "hooks": 0.0}  # seconds in remembering the turn, in the hooks
        self.flows = 0
        self._reads: dict[int, int] = {}  # reads so far, by open stream (its id: a stream may have slots)
        self.collecting = 0.0  # the garbage collector's pauses, in whichever code they fell
        self._collection_began = 0.0
        self.collections = [0, 0, 0]  # by generation

    def collected(self, phase: str, info: dict) -> None:
        """(A `gc.callbacks` entry.)"""
        if phase == "start":
            self._collection_began = time.thread_time()
        else:
            self.collecting += time.thread_time() - self._collection_began
            self.collections[info["generation"]] += 1

    def clock(self) -> tuple[float, float]:
        """A mark for `since`."""
        return time.thread_time(), self.collecting

    def since(self, mark: tuple[float, float]) -> float:
        """CPU seconds of this thread since `mark`, less the garbage collector's pauses meanwhile."""
        began, collecting = mark
        return time.thread_time() - began - (self.collecting - collecting)

    def wrap(self) -> None:
        """Time the stream callable, remembering and the hooks, whichever version of toolshim is loaded."""
        call, remembering = toolshim_addon.StreamRewrite.__call__, toolshim_addon.ToolShim._remembering
        timings = self

        def timed_call(stream, data: bytes) -> list[bytes]:
            read = timings._reads.get(id(stream), 0)
            if data:
                timings._reads[id(stream)] = read + 1
            else:  # (the body's end: the stream's last call)
                timings._reads.pop(id(stream), None)
            if not read:
                timings.flows += 1
            mark = timings.clock()
            try:
                return call(stream, data)
            finally:
                spent = timings.since(mark)
                if read < FIRST_READS:
                    timings.first[read] += spent
                else:
                    timings.later.append(spent)

        def timed(function, part: str):
            def run(*args):
                mark = timings.clock()
                try:
                    return function(*args)
                finally:
                    timings.parts[part] += timings.since(mark)

            return run

        def timed_remembering(shim, flow, state):
            remember = remembering(shim, flow, state)
            return None if remember is None else timed(remember, "remembering")

        for name in HOOKS:
            setattr(toolshim_addon.ToolShim, name, timed(getattr(toolshim_addon.ToolShim, name), "hooks"))
        toolshim_addon.StreamRewrite.__call__ = timed_call
        toolshim_addon.ToolShim._remembering = timed_remembering

    def done(self) -> None:
        record = {
            "flows": self.flows, "first": self.first, "later": self.later, **self.parts,
            "collecting": self.collecting, "collections": self.collections,
        }  # fmt: skip
        with open(os.environ["TOOLSHIM_INSIDE_OUT"], "ab") as out:
            out.write(orjson.dumps(record) + b"\n")


class TimedShutdown:
    """After toolshim's own `done` (addons are told in order): the totals written."""

    def done(self) -> None:
        timings.done()


class FlowsCounted:
    """The baseline's flows (the garbage collector's figures are per flow)."""

    def responseheaders(self, flow) -> None:
        timings.flows += 1


timings = Timings()
gc.callbacks.append(timings.collected)
if ADDON:
    timings.wrap()
    addons = [toolshim_addon.ToolShim(), TimedShutdown()]
else:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from passthrough import Passthrough

    addons = [Passthrough(), FlowsCounted(), TimedShutdown()]
