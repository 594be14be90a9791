"""The real server (the PyTorch engine on SmolLM2, in-process on loopback): after concurrent requests,
each response's usage.energy, the /metrics counter and the energy the source measured over the
same period agree, and the requests' joules sum to no more than was measured."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .api.helpers import ThreadServer, metric_value

pytestmark = pytest.mark.real
MODEL = "smollm2-energy"
N = 4


@pytest.fixture(scope="module")
def server(smollm2_path: Path) -> Iterator[ThreadServer]:
    from cloud_server.api.server import create_app
    from cloud_server.config import EngineConfig
    from cloud_server.engine.async_engine import AsyncLLMEngine

    config = EngineConfig(str(smollm2_path), max_model_len=512, kv_cache_memory_bytes=128 << 20,
                          max_num_seqs=8)
    srv = ThreadServer(create_app(lambda: AsyncLLMEngine(config), served_model_name=MODEL))
    srv.start(timeout_s=180)
    yield srv
    srv.stop()


async def _ask_all(url: str) -> list[dict]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        bodies = [{"model": MODEL, "max_tokens": 12, "temperature": 0,
                   "messages": [{"role": "user", "content": f"Count to {i + 3}."}]} for i in range(N)]
        answers = await asyncio.gather(*(client.post("/v1/chat/completions", json=b) for b in bodies))
    for r in answers:
        assert r.status_code == 200, r.text
    return [r.json()["usage"] for r in answers]


def test_concurrent_requests_usage_energy_metrics_and_measured_energy_agree(server: ThreadServer) -> None:
    meter = server.server.config.app.state.metrics.energy.meter
    assert meter is not None, "energy='auto' attaches a meter once the engine is loaded"
    source = meter.name
    before_metric = metric_value(httpx.get(f"{server.url}/metrics").text, "hybridllm_energy_joules_total",
                                 model=MODEL, source=source) or 0.0
    measured_from = meter.source.read_joules()
    usages = asyncio.run(_ask_all(server.url))
    measured = meter.source.read_joules() - measured_from

    energies = [u["energy"] for u in usages]
    assert {e["source"] for e in energies} == {source}
    joules = [e["joules"] for e in energies]
    assert all(j > 0 for j in joules), joules
    for u, e in zip(usages, energies, strict=True):
        assert e["joules_per_output_token"] == pytest.approx(e["joules"] / u["completion_tokens"], rel=1e-3)
    # the requests overlapped: shared, the sum stays within what was measured (not N times it)
    assert sum(joules) <= measured * 1.001 + 1e-6, (joules, measured)
    assert max(joules) < measured
    text = httpx.get(f"{server.url}/metrics").text
    after_metric = metric_value(text, "hybridllm_energy_joules_total", model=MODEL, source=source)
    assert after_metric is not None
    assert after_metric - before_metric == pytest.approx(sum(joules), rel=1e-6, abs=1e-5)
    observed = metric_value(text, "hybridllm_energy_per_output_token_joules_count", model=MODEL,
                            source=source)
    assert observed is not None and observed >= N
