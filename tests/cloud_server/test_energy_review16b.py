"""Energy figures a replica hands over (the cluster's front end records ``out.energy``): one that
is not a number of joules is left out of /metrics, never failing the finished answer nor poisoning
the counter; the ``source`` label is always a real value. No hardware, no model."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cloud_server.energy import EnergyAccounting


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples
            if not s.name.endswith("_created")}


def _finish(accounting: EnergyAccounting, report: dict, tokens: int = 4) -> SimpleNamespace:
    out = SimpleNamespace(energy=report, num_output_tokens=tokens)
    accounting.finish(None, out)  # remote mode: no meter here, no key
    return out


@pytest.mark.parametrize("joules", [-1.0, math.nan, math.inf, "lots"])
def test_a_bad_replica_figure_neither_fails_the_answer_nor_poisons_the_counter(joules):
    """Before: -1 J raised ValueError in finish() (the finished answer turned into a 500), "lots"
    raised too, and NaN or inf went into the counter, which then read NaN/inf for good."""
    registry = CollectorRegistry()
    accounting = EnergyAccounting(None, registry, lambda: "m")
    _finish(accounting, {"joules": 2.0, "source": "nvml", "joules_per_output_token": 0.5})
    out = _finish(accounting, {"joules": joules, "source": "nvml", "joules_per_output_token": joules})
    assert out.energy["joules"] is joules  # the client's usage.energy is the replica's, untouched
    samples = _samples(registry)
    labels = (("model", "m"), ("source", "nvml"))
    assert samples[("hybridllm_energy_joules_total", labels)] == 2.0
    assert samples[("hybridllm_energy_per_output_token_joules_count", labels)] == 1.0
    assert samples[("hybridllm_energy_per_output_token_joules_sum", labels)] == 0.5


def test_the_source_label_is_never_None_or_empty():
    """Before: a report whose source was None was labelled source="None", an empty one source=""."""
    registry = CollectorRegistry()
    accounting = EnergyAccounting(None, registry, lambda: "m")
    _finish(accounting, {"joules": 1.0, "source": None, "joules_per_output_token": None})
    _finish(accounting, {"joules": 1.0, "source": "", "joules_per_output_token": None}, tokens=0)
    sources = {dict(labels)["source"] for name, labels in _samples(registry)
               if name == "hybridllm_energy_joules_total"}
    assert sources == {"unknown"}


def test_zero_output_tokens_give_joules_but_no_per_token_observation():
    registry = CollectorRegistry()
    accounting = EnergyAccounting(None, registry, lambda: "m")
    _finish(accounting, {"joules": 1.5, "source": "rapl", "joules_per_output_token": None}, tokens=0)
    samples = _samples(registry)
    labels = (("model", "m"), ("source", "rapl"))
    assert samples[("hybridllm_energy_joules_total", labels)] == 1.5
    assert ("hybridllm_energy_per_output_token_joules_count", labels) not in samples


def test_a_bad_figure_from_a_replica_leaves_the_answer_and_the_metrics_intact():
    """Through the server (energy="remote", as the cluster's front end): before, a replica's -1 J
    on the last output made finish() raise, so the finished answer came back as a 500."""
    import dataclasses

    import httpx

    from cloud_server.api.server import create_app
    from tests.cloud_server.api.fake_engine import FakeEngine, FakeOutput
    from tests.cloud_server.api.helpers import ThreadServer

    @dataclasses.dataclass
    class ReplicaOutput(FakeOutput):
        energy: dict | None = None

    class ReplicaLike(FakeEngine):
        async def _run(self, request_id, ids, params):
            async for out in super()._run(request_id, ids, params):
                report = {"joules": -1.0, "source": "nvml", "joules_per_output_token": -0.5}
                yield ReplicaOutput(**dataclasses.asdict(out), energy=report if out.finished else None)

    server = ThreadServer(create_app(ReplicaLike, energy="remote")).start()
    try:
        body = {"model": "fake-model", "prompt": "hi", "max_tokens": 3}
        response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=10)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == 3
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
        families = {f.name: f for f in text_string_to_metric_families(metrics)}
        assert not families["hybridllm_energy_joules"].samples  # nothing recorded, nothing raised
        finished = [s for s in families["hybridllm_requests_finished"].samples
                    if s.name.endswith("_total")]
        assert [(s.labels["finish_reason"], s.value) for s in finished] == [("length", 1.0)]
    finally:
        server.stop()
