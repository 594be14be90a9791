"""Review 20 (launch and fleet stats): a stop whose app deletion fails leaves the fleet board to
the app's replicas; the board is not a detached actor (every KubeRay redeploy left one behind);
replicas of two versions reporting a key in two kinds (a list, a number) do not break /metrics.
Fakes only: no Ray cluster is started."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from cloud_server.cluster.fleet import FleetCounters, aggregate_stats
from cloud_server.config import ClusterConfig

PER_POS = "spec_decode_num_accepted_tokens_per_pos"


# -- aggregate_stats: a key reported as a list by one replica and a number by another --------------
@pytest.mark.parametrize("order", [1, -1], ids=["list-first", "number-first"])
def test_a_key_in_two_kinds_is_summed_in_its_own_kind_whatever_the_order(order):
    new = {PER_POS: [3, 1], "steps": 5, "kv_cache_usage": 0.5}
    old = {PER_POS: 4, "steps": [1, 2], "kv_cache_usage": 0.25}  # another version's kinds
    out = aggregate_stats([new, old][::order])
    # before: TypeError (a list plus an int, or len() of an int): /metrics answered 500
    assert out == {PER_POS: [3, 1], "steps": 5, "kv_cache_usage": 0.5, "num_replicas": 2}


def test_the_fleet_counters_survive_a_replica_reporting_a_key_in_the_other_kind():
    counters = FleetCounters()
    fleet = {"a": {"stats": {PER_POS: [2, 1], "steps": 3}}, "b": {"stats": {PER_POS: 7, "steps": 4}}}
    counters.update(fleet)
    assert counters.stats(fleet) == {PER_POS: [2, 1], "steps": 7, "num_replicas": 2}
    counters.update({"b": fleet["b"]})  # "a" left: its counters stay in the totals
    assert counters.stats({"b": fleet["b"]}) == {PER_POS: [2, 1], "steps": 7, "num_replicas": 1}


# -- launch.stop on an existing cluster ------------------------------------------------------------
def _fake_ray(monkeypatch, delete):
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    import ray
    from ray import serve

    done: list[tuple] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(serve, "delete", delete)
    monkeypatch.setattr(ray, "get_actor", lambda name, namespace: (name, namespace))
    monkeypatch.setattr(ray, "kill", lambda actor: done.append(("kill", actor)))
    monkeypatch.setattr(ray, "shutdown", lambda: done.append(("shutdown",)))
    return done


def test_a_failed_app_deletion_leaves_the_board_to_the_running_replicas(monkeypatch, caplog):
    # before: the board was killed while the replicas still ran; a replica created it again at
    # once (detached) and nothing ever killed that one
    from cloud_server.cluster import launch

    def delete(name):
        raise RuntimeError("the controller did not answer")

    done = _fake_ray(monkeypatch, delete)
    with caplog.at_level(logging.WARNING, logger="cloud_server.cluster"), \
            pytest.raises(RuntimeError, match="did not answer"):
        launch.stop(ClusterConfig(replicas=1, ray_address="auto"), "board-1")
    assert done == []
    assert "board-1" in caplog.text and "not deleted" in caplog.text


def test_a_run_that_deployed_nothing_still_removes_its_own_board(monkeypatch):
    from cloud_server.cluster import launch

    deleted: list[str] = []
    done = _fake_ray(monkeypatch, deleted.append)
    launch.stop(ClusterConfig(replicas=1, ray_address="auto"), "board-1", delete_app=False)
    assert deleted == [] and done == [("kill", ("board-1", "hybridllm"))]


# -- the board's lifetime --------------------------------------------------------------------------
def test_the_fleet_board_is_not_a_detached_actor(monkeypatch):
    # a detached board outlives its app: with app_builder (KubeRay) each build names a new board
    # and nothing kills the old one, so every redeploy left one on the cluster
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    from cloud_server.cluster import app

    asked: list[dict] = []

    class _Actor:
        def options(self, **options):
            asked.append(options)
            return SimpleNamespace(remote=lambda: "handle")

    monkeypatch.setattr(app.ray, "remote", lambda **kw: lambda cls: _Actor())
    assert app.board_handle("board-1") == "handle"
    assert asked == [{"name": "board-1", "namespace": "hybridllm", "get_if_exists": True}]
