"""The cluster's router, fleet board and replicas with odd reports (review 16): a replica that
reports an absurdly large count, and one whose engine loop died but whose process still runs."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from cloud_server.cluster.autoscale import QueuedTokensPolicy
from cloud_server.cluster.fleet import FleetCounters, aggregate_stats
from cloud_server.cluster.policy import TokenAwareRouter, prompt_block_hashes

HUGE = 10**400  # a Python int past a float's range: math.isfinite and float() raise on it


def test_a_huge_reported_count_does_not_break_routing_and_is_avoided():
    router = TokenAwareRouter(block_size=4)
    hashes = prompt_block_hashes(list(range(20)), 4)
    router.on_report("a", {"outstanding_tokens": HUGE, "prefill_tokens": HUGE, "prefix_hashes": hashes})
    router.on_report("b", {"outstanding_tokens": 10, "prefill_tokens": 0, "prefix_hashes": []})
    # before: OverflowError on every choice, so every request failed routing
    choice = router.choose(["a", "b"], hashes)
    assert choice.replica == "b" and choice.reason == "spill"  # its cache, but an absurd load
    assert router.choose(["a", "b"], []).replica == "b"
    assert router.books["a"].load() > 10**15  # read as very busy, not as idle


def test_a_huge_counter_is_skipped_by_the_fleet_sums_and_the_autoscaler():
    assert aggregate_stats([{"steps": HUGE, "num_running": 1}, {"steps": 3, "num_running": 2}]) == {
        "steps": 3, "num_running": 3, "num_replicas": 2,
    }
    counters = FleetCounters()
    fleet = {"r1": {"stats": {"steps": HUGE}}, "r2": {"stats": {"steps": 5}}}
    counters.update(fleet)
    assert counters.stats(fleet)["steps"] == 5
    policy = QueuedTokensPolicy(target_tokens_per_replica=100)
    ctx = SimpleNamespace(
        aggregated_metrics={"outstanding_tokens": {"r1": HUGE, "r2": 250.0}}, current_num_replicas=2,
        capacity_adjusted_min_replicas=1, capacity_adjusted_max_replicas=8, policy_state={},
    )
    assert policy(ctx)[0] == 3  # r2's 250 tokens: 3 replicas


def test_a_replica_whose_engine_loop_died_stops_posting_to_the_board():
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    from cloud_server.cluster.app import EngineReplica

    posts: list[str] = []
    board = SimpleNamespace(post=SimpleNamespace(remote=lambda replica, report: posts.append(replica)))
    replica = EngineReplica.__new__(EngineReplica)
    replica.engine = SimpleNamespace(is_ready=True, stats=lambda: {"steps": 1})
    replica.meter = SimpleNamespace(name="estimate")
    replica.replica = "r1"
    replica._board = board

    async def run() -> None:
        poster = asyncio.create_task(replica._post_stats())
        await asyncio.sleep(0.05)
        assert posts == ["r1"]
        replica.engine.is_ready = False  # the engine loop died; Serve's health check is 2 s away
        await asyncio.sleep(1.1)
        poster.cancel()

    asyncio.run(run())
    # before: a second post, so the board (and /health) counted the dead replica as up
    assert posts == ["r1"]


def _serve_cluster_with_failing_stop(monkeypatch, start):
    from cloud_server.cluster import launch
    from cloud_server.config import ClusterConfig, EngineConfig

    def stop(*args, **kwargs):
        raise RuntimeError("Failed to connect to GCS at head:6379")  # the joined cluster went away

    monkeypatch.setattr(launch, "require_ray", lambda: None)
    monkeypatch.setattr(launch, "start", start)
    monkeypatch.setattr(launch, "stop", stop)
    return launch.serve_cluster(EngineConfig(model="m"), ClusterConfig(replicas=1, ray_address="head:6379"),
                                host="127.0.0.1", port=8000, power_watts=None, app_options={})


def test_a_cleanup_that_fails_after_a_stop_is_one_line_not_a_traceback(monkeypatch):
    from cloud_server.exceptions import ServerError

    def stopped_by_ctrl_c(*args, **kwargs):
        kwargs["deploying"]()
        raise KeyboardInterrupt

    # before: Ray's RuntimeError escaped serve_cluster, a traceback from `hybridllm-cloud serve`
    with pytest.raises(ServerError, match="stopping the Ray Serve app failed: RuntimeError: Failed"):
        _serve_cluster_with_failing_stop(monkeypatch, stopped_by_ctrl_c)


def test_a_cleanup_that_fails_after_a_failure_keeps_the_first_reason(monkeypatch):
    from cloud_server.exceptions import ServerError

    def refused(*args, **kwargs):
        raise ServerError("the engine replicas could not start: ConfigError: bad model")

    with pytest.raises(ServerError, match="could not start: ConfigError: bad model"):
        _serve_cluster_with_failing_stop(monkeypatch, refused)


def test_a_replica_that_stopped_reporting_keeps_its_backlog_in_the_prefix_rule():
    now = [0.0]
    router = TokenAwareRouter(block_size=4, report_ttl_s=10.0, clock=lambda: now[0])
    prompt = list(range(9))  # two full blocks
    hashes = prompt_block_hashes(prompt, 4)
    router.sync_replicas(["a", "b"])
    router.on_sent("a", "r-long", hashes, 2016, prefill_tokens=2000)  # a long prompt, sent at t=0
    now[0] = 5.0  # a's report covers it: 2000 prompt tokens still to prefill
    router.on_report("a", {"outstanding_tokens": 2016, "prefill_tokens": 2000, "prefix_hashes": []})
    now[0] = 20.0  # a's stats calls time out from then on (a hung or swamped replica); b reports
    router.on_report("b", {"outstanding_tokens": 0, "prefill_tokens": 0, "prefix_hashes": []})
    router.expire_reports()  # a's report is 15 s old: its figures go, its request stays
    assert router.books["a"].pressure(router.decode_weight) >= 2000  # before: 8 (its decode alone)
    # a holds the prompt's blocks but 2000 tokens queued ahead: the request spills to idle b
    assert router.choose(["a", "b"], hashes).replica == "b"
    router.on_done("r-long")  # a's backlog done: its cached prefix wins again
    assert router.choose(["a", "b"], hashes).replica == "a"
