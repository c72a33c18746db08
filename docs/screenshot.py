"""Take docs/llm-stream-view.png: mitmweb showing the "LLM stream" view of a repaired Kimi stream.

Run by hand from the project root, after `pip install -e '.[test]'`, with Chromium installed
(Debian: `apt-get install chromium fonts-dejavu-core`):

    .venv/bin/python docs/screenshot.py [--chromium chromium] [--out docs/llm-stream-view.png]

It starts mitmweb with the addon on flows/kimi_seed_000_reasoning.flow (read with -r, so
toolshim repairs the stream as it loads it; the addon registers the view), waits until mitmweb
serves the flow's view, then has headless Chromium photograph the flow's response tab, and
stops mitmweb. It is not part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOW = ROOT / "flows" / "kimi_seed_000_reasoning.flow"
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def wait_for_the_view(web: str, timeout: float = 30) -> str:
    """The id of the loaded flow, once mitmweb serves its repaired view."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            flows = get_json(f"{web}/flows")
            if flows:
                view = get_json(f"{web}/flows/{flows[0]['id']}/response/content/auto.json")
                if view["description"].startswith("LLM stream") and "rewritten" in view["description"]:
                    return flows[0]["id"]
        except OSError:  # not listening yet
            pass
        time.sleep(0.2)
    raise TimeoutError("mitmweb did not serve the LLM stream view of the flow")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chromium", default="chromium", help="the Chromium binary")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "llm-stream-view.png")
    args = parser.parse_args()

    web_port = free_port()
    web = f"http://127.0.0.1:{web_port}"
    mitmweb = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "mitmweb"),
            "--no-web-open-browser",
            "--web-port", str(web_port),
            "--listen-host", "127.0.0.1",
            "--listen-port", str(free_port()),
            "-s", str(ROOT / "addon" / "toolshim.py"),
            "-r", str(FLOW),
        ],  # fmt: skip
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    try:
        flow_id = wait_for_the_view(web)
        # The page loads its flows over a websocket and then the content view over HTTP:
        # virtual time lets those finish before the picture is taken.
        subprocess.run(
            [
                args.chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--window-size=1400,1500",
                "--virtual-time-budget=5000",
                f"--screenshot={args.out}",
                f"{web}/#/flows/{flow_id}/response",
            ],
            check=True,
            timeout=120,
        )
    finally:
        mitmweb.terminate()
        mitmweb.wait(timeout=15)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
