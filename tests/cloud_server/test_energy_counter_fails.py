"""An energy counter that stops reading while the server runs (a GPU lost to the driver, a
permission changed) must not fail the requests: the meter goes over to a labelled estimate."""

from __future__ import annotations

import logging

import httpx

from cloud_server.energy import EnergyMeter, EnergySource

from .api.fake_engine import FakeEngine
from .api.helpers import ThreadServer


class Breaks(EnergySource):
    """A counter that reads ``good`` times, then fails as a lost GPU's does."""

    name = "nvml"

    def __init__(self, good: int) -> None:
        self.left, self.joules = good, 0.0

    def read_joules(self) -> float:
        if self.left <= 0:
            raise RuntimeError("NVMLError_GpuIsLost: GPU is lost")
        self.left -= 1
        self.joules += 5.0
        return self.joules


def test_the_meter_goes_over_to_an_estimate_once_and_keeps_sharing(caplog):
    meter = EnergyMeter(Breaks(good=2), fallback_watts=300.0)  # one read at start, one at begin
    a = meter.begin()
    with caplog.at_level(logging.WARNING, logger="cloud_server.energy"):
        assert meter.end(a) >= 0.0  # the failed read is nobody's; no error
        b = meter.begin()
        assert meter.end(b) >= 0.0
    assert meter.name == "estimate" and meter.source.watts == 300.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "nvml energy counter failed" in warnings[0] and "300 W" in warnings[0]


def test_requests_are_answered_with_an_estimate_after_the_counter_fails():
    engine = FakeEngine(max_num_seqs=4, max_waiting=8, max_model_len=512)
    from cloud_server.api.server import create_app

    srv = ThreadServer(create_app(lambda: engine)).start()
    try:
        accounting = srv.server.config.app.state.metrics.energy
        accounting.meter = EnergyMeter(Breaks(good=3), fallback_watts=10.0)
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        sources = []
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            for _ in range(3):
                r = client.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                sources.append(r.json()["usage"]["energy"]["source"])
            metrics = client.get("/metrics").text
        assert sources[-1] == "estimate", sources
        assert 'source="estimate"' in metrics
    finally:
        srv.stop()
