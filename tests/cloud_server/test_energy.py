"""Energy per request: sources (estimate, RAPL on a fake powercap tree with wrap-around), the
meter's sharing among concurrent requests, and what reaches usage.energy and /metrics."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from cloud_server.energy import (
    EnergyAccounting,
    EnergyMeter,
    EstimateSource,
    RaplSource,
    detect_source,
    energy_report,
)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_meter_shares_energy_among_the_requests_running():
    clock = Clock()
    meter = EnergyMeter(EstimateSource(10.0, clock))  # 10 W
    a = meter.begin()
    clock.t = 1.0  # a alone for 1 s: 10 J
    b = meter.begin()
    clock.t = 3.0  # a and b for 2 s: 20 J, 10 J each
    assert meter.end(a) == pytest.approx(20.0)
    clock.t = 4.0  # b alone for 1 s
    assert meter.end(b) == pytest.approx(20.0)
    clock.t = 10.0  # idle: charged to nobody
    c = meter.begin()
    assert meter.end(c) == pytest.approx(0.0)
    assert meter.attributed_joules == pytest.approx(40.0)


def _rapl(root, package: int, energy: int, wrap: int = 1000) -> None:
    d = root / f"intel-rapl:{package}"
    d.mkdir()
    (d / "energy_uj").write_text(str(energy))
    (d / "max_energy_range_uj").write_text(str(wrap))
    sub = root / f"intel-rapl:{package}:0"  # a sub-domain: not counted twice
    sub.mkdir()
    (sub / "energy_uj").write_text("5")
    (sub / "max_energy_range_uj").write_text(str(wrap))


def test_rapl_sums_packages_and_handles_wrap_around(tmp_path):
    _rapl(tmp_path, 0, 900)
    _rapl(tmp_path, 1, 100)
    src = RaplSource(tmp_path)
    start = src.read_joules()
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("50")  # wrapped: +150 uJ
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("400")  # +300 uJ
    assert src.read_joules() - start == pytest.approx(450e-6)
    with pytest.raises(OSError):
        RaplSource(tmp_path / "absent")


def test_detect_source_falls_back_to_a_labelled_estimate(monkeypatch):
    assert detect_source("cpu", power_watts=42).name == "estimate"
    monkeypatch.setattr("cloud_server.energy_sources.POWERCAP", Path("/nonexistent"))
    monkeypatch.delenv("HYBRIDLLM_POWER_WATTS", raising=False)
    src = detect_source("cpu", num_threads=2)
    assert src.name == "estimate" and src.watts == 20.0
    monkeypatch.setenv("HYBRIDLLM_POWER_WATTS", "7.5")
    assert detect_source("cuda:0").name in ("nvml", "estimate")  # no pynvml here: the estimate
    with pytest.raises(ValueError):
        EstimateSource(0)


def test_accounting_sets_usage_energy_and_metrics():
    from prometheus_client import CollectorRegistry, generate_latest

    clock = Clock()
    reg = CollectorRegistry()
    acct = EnergyAccounting(EnergyMeter(EstimateSource(4.0, clock)), reg, lambda: "m")
    key = acct.start()
    clock.t = 2.0
    out = SimpleNamespace(num_output_tokens=4)
    acct.finish(key, out)
    assert out.energy == {"joules": 8.0, "source": "estimate", "joules_per_output_token": 2.0}
    # a replica's figure is recorded as it is (the cluster's front end measures nothing itself)
    remote = SimpleNamespace(num_output_tokens=2, energy=energy_report(1.0, 2, "rapl"))
    EnergyAccounting(None, reg2 := CollectorRegistry(), lambda: "m").finish(None, remote)
    text = generate_latest(reg).decode() + generate_latest(reg2).decode()
    assert 'hybridllm_energy_joules_total{model="m",source="estimate"} 8.0' in text
    assert 'hybridllm_energy_joules_total{model="m",source="rapl"} 1.0' in text
    assert energy_report(1.0, 0, "estimate")["joules_per_output_token"] is None
