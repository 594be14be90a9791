"""bench.cluster's driver on Ctrl-C: the phase child runs in its own session, so the terminal's
SIGINT reaches only the driver; the driver must take the child's whole process group down."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench import cluster


def test_ctrl_c_during_a_phase_kills_the_phase_child(monkeypatch):
    started: list[subprocess.Popen] = []
    real_popen = subprocess.Popen

    class Interrupted(real_popen):  # the phase child: a process that would run for a minute
        def __init__(self, cmd, **kw):
            assert kw.get("start_new_session")
            super().__init__([sys.executable, "-c", "import time; time.sleep(60)"], **kw)
            started.append(self)

        def communicate(self, *a, timeout=None, **kw):
            if timeout is not None:  # the driver's wait for the phase: the user presses Ctrl-C
                raise KeyboardInterrupt
            return super().communicate(*a, **kw)

    monkeypatch.setattr(cluster.subprocess, "Popen", Interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):  # the interrupt still ends the benchmark
            cluster._phase_in_child("tokens", [], 30.0)
        (child,) = started
        # before: left running (its own session), with its Ray processes and their ports
        assert child.poll() is not None
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout:
                proc.stdout.close()
