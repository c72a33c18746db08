"""Shared fixtures: one scripted upstream and one real-addon proxy per session.

Tests isolate themselves by registering scripts under `unique_model`, so the
expensive mitmdump process can be shared.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

# Make `import harness` work under any pytest import mode.
_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from harness import Mitmdump, ScriptedUpstream  # noqa: E402
from hypothesis import settings  # noqa: E402

# CI runs the property tests with a fixed seed, so a run is repeatable; HYPOTHESIS_PROFILE=explore
# draws fresh examples each run (what to use while developing, to find new cases).
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
# HYPOTHESIS_PROFILE=fuzz: the long fuzzing run (tests/test_fuzz.py scales each of its targets'
# budgets by max_examples / 100, so 30x here; the README has the figures of a run).
settings.register_profile("fuzz", derandomize=False, max_examples=3000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture(scope="session")
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as server:
        yield server


@pytest.fixture(scope="session")
def proxy(upstream: ScriptedUpstream) -> Iterator[Mitmdump]:
    """mitmdump with the real toolshim addon, reverse-proxying to `upstream`."""
    with Mitmdump(upstream.url) as proc:
        yield proc


@pytest.fixture
def openai_client(proxy: Mitmdump) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=proxy.base_url, api_key="test-key", max_retries=0, timeout=30)
    with client:
        yield client


@pytest.fixture
def unique_model(request: pytest.FixtureRequest) -> str:
    """A model name unique to this test, readable in logs, used as routing key."""
    nodeid = request.node.nodeid
    slug = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name).strip("-")[:48]
    digest = hashlib.sha1(nodeid.encode()).hexdigest()[:8]
    return f"test-{slug}-{digest}"
