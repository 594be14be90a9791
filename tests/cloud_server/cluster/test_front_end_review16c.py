"""The cluster front end's figures in /metrics (retries, failed attempts, replicas), the fleet's
gauges with no replica reporting, and the autoscaler with running replicas that have no figure.
Fakes only: no Ray cluster, no model."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
import pytest

from cloud_server.api.metrics import ServerMetrics
from cloud_server.api.server import create_app
from cloud_server.cluster.autoscale import QueuedTokensPolicy
from cloud_server.cluster.remote_engine import RemoteEngine
from tests.cloud_server.api.fake_engine import CharTokenizer, FakeOutput
from tests.cloud_server.api.helpers import ThreadServer


def _lines(engine: RemoteEngine) -> list[str]:
    text = ServerMetrics(engine.stats, lambda: "m").render().decode()
    return [ln for ln in text.splitlines() if not ln.startswith("#")]


class _Handle:
    """A deployment handle whose replica dies before its first output on the first ``deaths``
    calls, then answers 'ok' (two tokens) for the prompt it was sent."""

    def __init__(self, deaths: int) -> None:
        self.deaths = deaths
        self.calls = 0

    def options(self, **_):
        return self

    @property
    def generate(self):
        return self

    def remote(self, prompt_ids, params, request_id):
        from ray.exceptions import ActorDiedError

        dies = self.calls < self.deaths
        self.calls += 1

        class Stream:
            def __aiter__(self):
                return self._gen()

            async def _gen(self):
                if dies:
                    raise ActorDiedError()
                n = len(prompt_ids)
                yield FakeOutput(request_id, "o", [ord("o")], False, None, n, 1)
                yield FakeOutput(request_id, "k", [ord("k")], True, "stop", n, 2)

            def cancel(self):
                pass

        return Stream()


class _FrontEnd(RemoteEngine):
    """RemoteEngine with its start (Serve's describe, the model's tokenizer) faked."""

    async def start(self) -> None:
        self.tokenizer, self.model_name, self.max_model_len = CharTokenizer(), "fake-model", 512
        self._fleet = {"r1": {"stats": {}}}  # one replica reporting: /health says ok
        self._ready = True


def test_retries_failures_and_replicas_reach_metrics():
    pytest.importorskip("ray", reason="needs the [cluster] extra")
    engine = RemoteEngine(_Handle(deaths=1), "m", retries=2, target_replicas=2)
    engine._fleet = {"r1": {"stats": {"num_running": 1}}}

    async def collect():
        return [o async for o in engine._stream("req", [1, 2], {})]

    assert len(asyncio.run(collect())) == 2
    lines = _lines(engine)
    assert 'hybridllm_cluster_requests_retried_total{model="m"} 1.0' in lines
    assert 'hybridllm_cluster_replica_failures_total{model="m"} 1.0' in lines
    assert 'hybridllm_cluster_replicas{model="m"} 1.0' in lines
    assert 'hybridllm_cluster_replicas_wanted{model="m"} 2.0' in lines


def test_with_no_replica_reporting_the_fleet_gauges_read_zero():
    engine = RemoteEngine(handle=None, model="m", target_replicas=0)  # scaled to zero
    lines = _lines(engine)
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_ratio",
                 "cluster_replicas", "cluster_replicas_wanted"):
        assert f'hybridllm_{name}{{model="m"}} 0.0' in lines, name
    # a fleet that had replicas and lost them all: the gauges read 0, the counters keep their count
    engine._fleet = {"r1": {"stats": {"num_running": 3, "kv_cache_usage": 0.5, "steps": 7}}}
    engine._counters.update(engine._fleet)
    engine._fleet = {}
    engine._counters.update(engine._fleet)
    lines = _lines(engine)
    assert 'hybridllm_num_requests_running{model="m"} 0.0' in lines
    assert 'hybridllm_kv_cache_usage_ratio{model="m"} 0.0' in lines
    assert 'hybridllm_engine_steps_total{model="m"} 7.0' in lines


def test_a_request_retried_before_its_first_token_counts_once():
    pytest.importorskip("ray", reason="needs the [cluster] extra")
    handle = _Handle(deaths=1)
    server = ThreadServer(create_app(lambda: _FrontEnd(handle, "m", retries=2), energy="off")).start()
    try:
        r = httpx.post(f"{server.url}/v1/completions",
                       json={"model": "fake-model", "prompt": "hello", "max_tokens": 2})
        other = httpx.post(f"{server.url}/v1/completions",  # a model the replicas do not serve
                           json={"model": "other", "prompt": "hello", "max_tokens": 2})
        lines = httpx.get(f"{server.url}/metrics").text.splitlines()
    finally:
        server.stop()
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "ok"
    assert r.json()["usage"]["prompt_tokens"] == 5 and handle.calls == 2  # not "other"
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"
    assert 'hybridllm_prompt_tokens_total{model="fake-model"} 5.0' in lines  # not 10
    assert 'hybridllm_generation_tokens_total{model="fake-model"} 2.0' in lines
    assert 'hybridllm_requests_finished_total{finish_reason="stop",model="fake-model"} 1.0' in lines
    assert 'hybridllm_cluster_requests_retried_total{model="fake-model"} 1.0' in lines
    assert 'hybridllm_cluster_replica_failures_total{model="fake-model"} 1.0' in lines


def _ctx(metrics: dict, running: list[str], current: int) -> SimpleNamespace:
    return SimpleNamespace(
        aggregated_metrics=metrics, running_replicas=running, current_num_replicas=current,
        capacity_adjusted_min_replicas=1, capacity_adjusted_max_replicas=8, policy_state={},
    )


def test_running_replicas_with_no_figure_hold_the_fleet_not_shrink_it():
    policy = QueuedTokensPolicy(target_tokens_per_replica=100)
    # three replicas running (the controller just restarted, or they just started): no figure yet
    assert policy(_ctx({}, ["r1", "r2", "r3"], 3))[0] == 3
    assert policy(_ctx({"outstanding_tokens": {}}, ["r1", "r2", "r3"], 3))[0] == 3
    # the same replicas reporting an idle fleet: down to the minimum, as before
    idle = {"outstanding_tokens": {"r1": 0.0, "r2": 0.0, "r3": 0.0}}
    assert policy(_ctx(idle, ["r1", "r2", "r3"], 3))[0] == 1
    # and reporting load: the rule
    assert policy(_ctx({"outstanding_tokens": {"r1": 450.0}}, ["r1", "r2", "r3"], 3))[0] == 5
    # no replica running (scaled to zero, Serve's cold start wakes it): the minimum
    assert policy(_ctx({}, [], 0))[0] == 1
