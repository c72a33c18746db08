"""The benchmark: `.venv/bin/python bench/run.py [--quick]` prints one table, every target beside
its figure (markdown, ready for the README), and the machine it ran on.

    core         the sans-IO rewrite's events per second against the orjson floor (bench/core.py)
    scaling      time per byte as a call's arguments or a text grow to 1 MB (bench/core.py)
    (Messages)   the same core and scaling rows for the Anthropic Messages rewriter (bench/messages.py)
    end to end   a real mitmdump with the addon against one that only streams (bench/e2e.py):
                 CPU, added latency, memory per open stream
    requests     request repairs of a long history, the cost of a request needing none, the
                 in-process state's bounds (bench/request_repairs.py)

`--quick` runs smaller sizes (a minute or so) to try a change; the README's table is a full run.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import core  # noqa: E402
import e2e  # noqa: E402
import messages  # noqa: E402
import request_repairs  # noqa: E402
from table import markdown  # noqa: E402


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()} {platform.release()}"


def main() -> int:
    quick = "--quick" in sys.argv[1:]
    rows = core.run(quick) + messages.run(quick) + e2e.run(quick) + request_repairs.run(quick)
    print(markdown(rows))
    print()
    print(f"Machine: {machine()}{' (quick run)' if quick else ''}")
    missed = [row for row in rows if row.met is False]
    print(f"Targets met: {sum(row.met is True for row in rows)} of {sum(row.met is not None for row in rows)}")
    return 0 if not missed else 1


if __name__ == "__main__":
    sys.exit(main())
