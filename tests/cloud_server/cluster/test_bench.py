"""bench.cluster's plain parts: the seeded open-loop workload both phases send, and the check that
turns a replica death into an invalid run instead of a figure."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.cluster import TENANTS, Fleet, workload


def test_workload_is_seeded_open_loop_and_mixes_short_and_long_answers():
    a = workload(200, 0.5, 256, 0.25, seed=3)
    assert a == workload(200, 0.5, 256, 0.25, seed=3)  # both phases send the same list
    assert a != workload(200, 0.5, 256, 0.25, seed=4)
    times = [r["at"] for r in a]
    assert times == sorted(times) and 300 < times[-1] < 500  # Poisson at 0.5/s: ~400 s for 200
    lengths = [r["max_tokens"] for r in a]
    assert set(lengths) == {16, 256} and 30 < lengths.count(256) < 70
    assert {r["tenant"] for r in a} == set(TENANTS)


class FakeBoard:
    pass


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _post(pid: int) -> dict:
    return {"pid": pid, "stats": {}}


def test_fleet_check_reports_exited_silent_and_replaced_replicas():
    alive, dead = os.getpid(), _dead_pid()
    fleet = Fleet(FakeBoard())
    fleet.pin({"r1": _post(alive), "r2": _post(alive)})
    fleet.check({"r1": _post(alive), "r2": _post(alive)})
    assert fleet.deaths == []
    fleet.check({"r1": _post(alive)})  # r2 stopped posting
    assert fleet.deaths == [f"replica r2 (pid {alive}) stopped reporting for 5 s"]

    fleet = Fleet(FakeBoard())
    fleet.pin({"r1": _post(alive), "r2": _post(dead)})
    fleet.check({"r1": _post(alive), "r2": _post(dead), "r3": _post(alive)})
    assert any("exited" in d and "r2" in d for d in fleet.deaths)
    assert any("r3" in d and "replaced" in d for d in fleet.deaths)
    n = len(fleet.deaths)
    fleet.check({"r1": _post(alive), "r2": _post(dead), "r3": _post(alive)})
    assert len(fleet.deaths) == n  # each death reported once
