"""Edges of the cluster's plain-data parts: the autoscaler on missing or NaN figures, a replica's
load report when the engine cannot be read, the fleet's list series, replica faults the front end
may send elsewhere, and the books of a request a full replica turned away."""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import pytest

from cloud_server.cluster.autoscale import QueuedTokensPolicy
from cloud_server.cluster.fleet import aggregate_stats
from cloud_server.cluster.policy import TokenAwareRouter, prompt_block_hashes
from cloud_server.cluster.remote_engine import RemoteEngine
from cloud_server.exceptions import EngineDeadError, EngineError, NotReadyError, QueueFullError

BS = 4


def _ctx(per_replica: dict, current: int = 3) -> SimpleNamespace:
    return SimpleNamespace(
        aggregated_metrics={"outstanding_tokens": per_replica},
        current_num_replicas=current,
        capacity_adjusted_min_replicas=1,
        capacity_adjusted_max_replicas=8,
        policy_state={},
    )


def test_a_nan_or_missing_figure_does_not_scale_a_busy_fleet_down():
    policy = QueuedTokensPolicy(target_tokens_per_replica=1000)
    # one replica's window had no sample (Serve's average is None), or read NaN: the others count
    assert policy(_ctx({"r1": 5000.0, "r2": math.nan}))[0] == 5
    assert policy(_ctx({"r1": 5000.0, "r2": None}))[0] == 5
    assert policy(_ctx({"r1": 5000.0, "r2": math.inf}))[0] == 5
    # replicas that all lack a figure: hold the current count, neither shrink nor grow blind
    assert policy(_ctx({"r1": math.nan, "r2": None}, current=3))[0] == 3
    assert policy(_ctx({"r1": 0.0, "r2": 0.0}, current=3))[0] == 1  # a real zero still shrinks


def test_a_load_report_that_cannot_be_read_repeats_the_last_one():
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    from cloud_server.cluster.app import EngineReplica

    class Engine:
        fail = False

        def load_report(self):
            if self.fail:
                raise RuntimeError("deque mutated during iteration")
            return {"outstanding_tokens": 900, "prefill_tokens": 400, "prefix_hashes": [1, 2]}

    replica = EngineReplica.__new__(EngineReplica)
    replica.engine = SimpleNamespace(engine=Engine())
    replica.replica = "r1"
    replica._reports = 0
    replica._last_report = None
    first = replica.record_routing_stats()
    replica.engine.engine.fail = True
    again = replica.record_routing_stats()
    # not an idle replica with an empty cache: the same figures, the same stamp (the router's
    # books stay as they are), and the autoscaler still sees the queued tokens
    assert again == first and again["outstanding_tokens"] == 900
    assert replica.record_autoscaling_stats() == {"outstanding_tokens": 900.0}


def test_fleet_metrics_sum_the_per_position_acceptance_lists():
    agg = aggregate_stats(
        [
            {"steps": 1, "spec_decode_num_accepted_tokens_per_pos": [5, 3]},
            {"steps": 2, "spec_decode_num_accepted_tokens_per_pos": [2, 1, 1]},
            {"steps": 3},
        ]
    )
    assert agg["spec_decode_num_accepted_tokens_per_pos"] == [7, 4, 1]
    assert agg["steps"] == 6 and agg["num_replicas"] == 3


class _Handle:
    """A handle whose replica raises ``errors[i]`` on call ``i`` before any output (None: answers)."""

    def __init__(self, errors: list) -> None:
        self.errors = errors
        self.calls = 0

    def options(self, **_):
        return self

    @property
    def generate(self):
        return self

    def remote(self, prompt_ids, params, request_id):
        err = self.errors[min(self.calls, len(self.errors) - 1)]
        self.calls += 1

        class Stream:
            def __aiter__(self):
                return self._gen()

            async def _gen(self):
                if err is not None:
                    raise err
                yield SimpleNamespace(request_id=request_id)

            def cancel(self):
                pass

        return Stream()


def _collect(engine: RemoteEngine) -> list:
    async def go():
        return [o async for o in engine._stream("req", [1, 2], {})]

    return asyncio.run(go())


@pytest.mark.parametrize("gone", [EngineDeadError("the engine failed"), NotReadyError("loop not running")])
def test_a_replica_whose_engine_died_before_the_first_output_is_retried(monkeypatch, gone):
    pytest.importorskip("ray", reason="needs the [cluster] extra")
    monkeypatch.setattr(asyncio, "sleep", _no_sleep)
    handle = _Handle([gone, None])
    outs = _collect(RemoteEngine(handle, "m", retries=2))
    assert handle.calls == 2 and outs[0].request_id == "req-retry1"
    # always gone: a fault after the retries, never the dead engine's 503 on the first try
    handle = _Handle([gone])
    with pytest.raises(EngineError, match="replica serving this request failed"):
        _collect(RemoteEngine(handle, "m", retries=2))
    assert handle.calls == 3
    # the request's own error (a full queue) is still the answer at once
    handle = _Handle([QueueFullError("full"), None])
    with pytest.raises(QueueFullError):
        _collect(RemoteEngine(handle, "m", retries=2))
    assert handle.calls == 1


async def _no_sleep(_s: float) -> None:
    return None


def _router():
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    from cloud_server.cluster.router import TokenPrefixRequestRouter

    router = TokenPrefixRequestRouter.__new__(TokenPrefixRequestRouter)
    router.initialize_state(block_size=BS, min_margin_tokens=8, imbalance_ratio=0.0)
    prompt = list(range(30))
    reps = {
        "r1": SimpleNamespace(replica_id="r1", routing_stats={}),
        "r2": SimpleNamespace(
            replica_id="r2",
            routing_stats={"outstanding_tokens": 0, "prefix_hashes": prompt_block_hashes(prompt, BS),
                           "reported_at": 1},
        ),
    }
    router._replicas = reps
    meta = SimpleNamespace(call_method="generate", internal_request_id="q")
    pending = SimpleNamespace(metadata=meta, args=[prompt, {"max_tokens": 10}, "q"])
    return router, list(reps.values()), pending


def _open(router) -> dict:
    return {k: b.sent_tokens for k, b in router.policy.books.items()}


@pytest.mark.parametrize("rejection_ends_first", [True, False])
def test_a_request_the_chosen_replica_turned_away_is_booked_where_it_runs(rejection_ends_first):
    # r2 holds the prefix and is ranked first; it is full and turns the request away, Serve sends
    # it to r1 (our second rank). The turned-away attempt ends (on_request_completed for r2)
    # before or after r1 takes the request (on_request_routed for r1).
    router, reps, pending = _router()
    ranks = asyncio.run(router.choose_replicas(reps, pending))
    assert ranks[0][0].replica_id == "r2" and _open(router)["r2"] == 30 - 28 + 10
    if rejection_ends_first:
        router.on_request_completed("r2", "q")
        router.on_request_routed(pending, "r1", None)
    else:
        router.on_request_routed(pending, "r1", None)
        router.on_request_completed("r2", "q")
    # r1 has none of the prompt cached: the whole prompt to prefill plus the answer, on r1
    assert _open(router) == {"r1": 30 + 10, "r2": 0}
    router.on_request_completed("r1", "q")
    assert _open(router) == {"r1": 0, "r2": 0}
    router.on_request_routed(pending, "r1", None)  # a late call for an ended attempt books nothing
    assert _open(router) == {"r1": 0, "r2": 0}


def test_a_request_taken_by_the_chosen_replica_keeps_its_books():
    router, reps, pending = _router()
    asyncio.run(router.choose_replicas(reps, pending))
    router.on_request_routed(pending, "r2", None)
    assert _open(router) == {"r1": 0, "r2": 12}
    router.on_request_completed("r2", "q")
    assert _open(router) == {"r1": 0, "r2": 0}


def test_policy_routed_elsewhere_counts_the_choice_once():
    r = TokenAwareRouter(block_size=BS)
    h = prompt_block_hashes(list(range(30)), BS)
    r.on_sent("a", "x", h, 12, prefill_tokens=2, reason="prefix")
    r.on_routed("b", "x", h, 30, 10)
    assert r.num_prefix_choices == 1 and r.num_load_choices == 0
    assert r.books["a"].sent_tokens == 0 and r.books["b"].sent_tokens == 40
    assert r.books["b"].holds(h[-1])  # the prompt's blocks will be cached where it ran
