"""Review 14 of the cluster's plain-data parts: load reports that go stale, a fleet board that stops
answering, fleet counters when a replica leaves, NaN figures, and the router's per-replica memory."""

from __future__ import annotations

import asyncio
import contextlib
import math
from types import SimpleNamespace

import pytest

from cloud_server.cluster.fleet import aggregate_stats
from cloud_server.cluster.policy import TokenAwareRouter
from cloud_server.cluster.remote_engine import RemoteEngine


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_replica_that_stopped_reporting_is_not_judged_by_its_last_report_for_ever():
    clock = _Clock()
    policy = TokenAwareRouter(block_size=4, clock=clock)  # reports count 10 s
    policy.on_report("r1", {"outstanding_tokens": 5000, "prefill_tokens": 5000, "prefix_hashes": []})
    policy.on_report("r2", {"outstanding_tokens": 0, "prefix_hashes": []})
    assert policy.choose(["r1", "r2"], []).replica == "r2"
    # a minute on: r1 went silent (its stats call fails) and has nothing open on our books; r2
    # still reports, busy now. r1's 5000 tokens of a minute ago no longer count.
    clock.now = 60.0
    policy.on_report("r2", {"outstanding_tokens": 3000, "prefill_tokens": 3000, "prefix_hashes": []})
    assert policy.choose(["r1", "r2"], []).replica == "r1"
    assert policy.books["r1"].load() == 0 and policy.books["r2"].load() == 3000


def test_a_fresh_report_is_not_expired():
    clock = _Clock()
    policy = TokenAwareRouter(block_size=4, clock=clock)  # reports count 10 s
    policy.on_report("r1", {"outstanding_tokens": 500, "prefix_hashes": [7]})
    clock.now = 9.0
    policy.sync_replicas(["r1"])
    assert policy.books["r1"].load() == 500 and policy.books["r1"].holds(7)
    clock.now = 11.0
    policy.sync_replicas(["r1"])
    # the load goes; the cache's hashes stay (a cache does not change while it runs nothing)
    assert policy.books["r1"].load() == 0 and policy.books["r1"].holds(7)


def test_the_router_forgets_the_report_stamps_of_replicas_that_left():
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    from cloud_server.cluster.router import TokenPrefixRequestRouter

    router = TokenPrefixRequestRouter.__new__(TokenPrefixRequestRouter)
    router.initialize_state(block_size=4)

    def replica(i: int) -> SimpleNamespace:
        return SimpleNamespace(routing_stats={"outstanding_tokens": i, "reported_at": (i, 1)})

    for i in range(50):  # replicas come and go (autoscaling, restarts): two live at a time
        router._replicas = {i: replica(i), i + 1: replica(i + 1)}
        router._refresh()
    assert set(router._report_stamps) == {49, 50}
    assert set(router.policy.books) == {49, 50}


def test_a_nan_figure_from_one_replica_does_not_blank_the_fleets_sum():
    agg = aggregate_stats(
        [
            {"steps": math.nan, "kv_cache_usage": math.nan, "num_running": math.inf},
            {"steps": 3, "kv_cache_usage": 0.5, "num_running": 2},
        ]
    )
    assert agg == {"steps": 3, "kv_cache_usage": 0.5, "num_running": 2, "num_replicas": 2}


class _Board:
    """The fleet board actor's handle: ``snapshot.remote`` / ``notes.remote`` awaitables."""

    def __init__(self) -> None:
        self.fleet: dict = {}
        self.fail = False
        self.hang = False
        self.snapshot = SimpleNamespace(remote=self._snapshot)
        self.notes = SimpleNamespace(remote=self._notes)

    async def _snapshot(self, max_age_s: float) -> dict:
        if self.hang:
            await asyncio.Event().wait()
        if self.fail:
            raise ConnectionError("the board's actor died")
        return dict(self.fleet)

    async def _notes(self) -> dict:
        return {}


def _post(**stats) -> dict:
    return {"stats": stats, "pid": 1}


def test_fleet_counters_do_not_go_down_when_a_replica_leaves():
    board = _Board()
    engine = RemoteEngine(handle=None, model="m", board=board, target_replicas=2)

    async def run() -> list[dict]:
        seen = []
        board.fleet = {"a": _post(steps=10, prefix_cache_hits=4, num_running=1),
                       "b": _post(steps=5, prefix_cache_hits=2, num_running=3)}
        await engine._poll_once()
        seen.append(engine.stats())
        board.fleet = {"a": _post(steps=12, prefix_cache_hits=4, num_running=1)}  # b died
        await engine._poll_once()
        seen.append(engine.stats())
        board.fleet["b"] = _post(steps=6, prefix_cache_hits=2, num_running=0)  # b was only late
        await engine._poll_once()
        seen.append(engine.stats())
        return seen

    before, after, back = asyncio.run(run())
    assert before["steps"] == 15 and before["num_running"] == 4
    # b's 5 steps stay in the total (a counter that goes down reads as a restart to Prometheus);
    # its gauges go with it
    assert after["steps"] == 17 and after["prefix_cache_hits"] == 6
    assert after["num_running"] == 1 and after["num_replicas"] == 1
    assert back["steps"] == 18 and back["num_running"] == 1 and back["num_replicas"] == 2


def test_the_memory_of_replicas_that_left_is_bounded_and_keeps_their_counts():
    from cloud_server.cluster.fleet import FleetCounters

    counters = FleetCounters(max_remembered=3)
    for i in range(20):  # twenty replicas, one after the other, 1 step and [1, 1] accepted each
        counters.update({f"r{i}": _post(steps=1, spec_decode_num_accepted_tokens_per_pos=[1, 1])})
    assert len(counters._left) == 3
    agg = counters.stats({"r19": _post(steps=1, spec_decode_num_accepted_tokens_per_pos=[1, 1])})
    assert agg["steps"] == 20 and agg["spec_decode_num_accepted_tokens_per_pos"] == [20, 20]
    assert agg["num_replicas"] == 1
    counters.update({})  # the last one leaves too
    assert counters.stats({}) == {"steps": 20, "spec_decode_num_accepted_tokens_per_pos": [20, 20]}


def test_health_does_not_read_a_board_that_stopped_answering_as_a_healthy_fleet():
    # a failed poll asks whether the board's actor died (ray.exceptions, imported then: a second or
    # more the first time), so the import is done before, and the window leaves a loaded machine room
    with contextlib.suppress(ImportError):
        import ray.exceptions  # noqa: F401
    board = _Board()
    engine = RemoteEngine(handle=None, model="m", board=board, target_replicas=1, stale_after_s=2.0)

    async def run() -> tuple[str, str, str]:
        board.fleet = {"a": _post(steps=1)}
        await engine._poll_once()
        ok = engine.health_detail()["status"]
        board.fail = True
        await engine._poll_once()  # one missed poll: still the fleet it saw a moment ago
        once = engine.health_detail()["status"]
        await asyncio.sleep(2.1)
        await engine._poll_once()
        return ok, once, engine.health_detail()["status"]

    ok, once, later = asyncio.run(run())
    assert (ok, once) == ("ok", "ok")
    assert later == "unavailable"  # not "ok" for ever on what the board said long ago
    assert engine.stats()["steps"] == 1  # the counters still hold


def test_a_hung_board_does_not_stall_the_fleet_poll():
    board = _Board()
    engine = RemoteEngine(handle=None, model="m", board=board, target_replicas=1, stale_after_s=0.05)
    board.hang = True

    async def run() -> None:
        await asyncio.wait_for(engine._poll_once(), 2.0)

    asyncio.run(run())  # the old poll waited for ever: start() never finished, /health never moved
    assert engine.health_detail()["status"] == "unavailable"
