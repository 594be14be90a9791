"""The cluster tests' shared guard: the process's SIGTERM handler as each test found it."""

from __future__ import annotations

import signal

import pytest


@pytest.fixture(autouse=True)
def _sigterm_kept():
    """``serve_cluster`` (``hybridllm-cloud serve --replicas``) sets its own SIGTERM handler, which
    the real command never needs back: its process ends after it. Left in the suite's one process,
    a later SIGTERM (CI's timeout, a cancelled job) would run that closure, raising
    KeyboardInterrupt into whichever test runs then, or only setting an event, instead of ending
    the process."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)
