"""The energy meter's counters as they misbehave: NVML's session released (nvmlShutdown) whenever a
source is done with it; a RAPL counter that never moves (frozen, virtualised) and an NVML reading of
NaN go over to the estimate instead of reporting 0 J as measured; one rule and one message for a
power figure, wherever it comes from (a string from Serve's CLI args included). Fake sysfs trees
and a fake NVML: no hardware needed."""

from __future__ import annotations

import gc
import math
import time
from pathlib import Path

import pytest

from cloud_server.energy import (
    EnergyAccounting,
    EnergyMeter,
    EstimateSource,
    NvmlSource,
    RaplSource,
    default_watts,
    detect_source,
    meter_for,
)


class CountingNvml:
    """pynvml with its session counted: each nvmlInit must be matched by one nvmlShutdown."""

    def __init__(self, mj: float = 0.0, supported: bool = True) -> None:
        self.mj = mj
        self.supported = supported
        self.inits = self.shutdowns = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> float:
        if not self.supported:
            raise RuntimeError("Not Supported")
        return self.mj


def test_nvml_is_shut_down_when_the_meter_closes_once_only():
    """Before: nvmlInit was never matched by nvmlShutdown, at stop or anywhere else."""
    nvml = CountingNvml()
    accounting = EnergyAccounting(EnergyMeter(NvmlSource(0, nvml), 300.0), None, lambda: "m")
    accounting.meter.end(accounting.start())
    accounting.close()
    accounting.close()
    assert (nvml.inits, nvml.shutdowns) == (1, 1)
    assert accounting.meter.name == "estimate"  # a request still in flight is an estimate
    assert accounting.meter.end(accounting.start()) >= 0.0


def test_a_gpu_without_the_counter_does_not_leave_nvml_open():
    """Before a Volta GPU: the counter read fails in the constructor, after nvmlInit."""
    nvml = CountingNvml(supported=False)
    with pytest.raises(RuntimeError, match="Not Supported"):
        NvmlSource(0, nvml)
    assert (nvml.inits, nvml.shutdowns) == (1, 1)
    detect_source("cuda:0", nvml=nvml)  # the estimate: NVML closed again
    assert nvml.inits == nvml.shutdowns == 2


def test_nvml_is_shut_down_when_the_meter_drops_a_failed_counter():
    nvml = CountingNvml()
    meter = EnergyMeter(NvmlSource(0, nvml), 300.0)
    nvml.supported = False  # the GPU lost to the driver
    meter.end(meter.begin())
    assert meter.name == "estimate" and nvml.shutdowns == 1


def test_a_dropped_nvml_source_is_shut_down():
    nvml = CountingNvml()
    src = NvmlSource(0, nvml)
    del src
    gc.collect()
    assert nvml.shutdowns == 1


def test_nan_from_nvml_goes_over_to_the_estimate_not_zero_joules():
    """Before: max(0, NaN) read as 0 J, labelled nvml, for every request from then on."""
    nvml = CountingNvml(mj=1000.0)
    meter = EnergyMeter(NvmlSource(0, nvml), 1e6)
    nvml.mj = math.nan
    key = meter.begin()
    time.sleep(0.01)
    assert meter.end(key) > 0.0 and meter.name == "estimate"


def _frozen_rapl(root: Path) -> RaplSource:
    d = root / "intel-rapl:0"
    d.mkdir()
    (d / "name").write_text("package-0\n")
    (d / "energy_uj").write_text("123456\n")  # and so it stays
    (d / "max_energy_range_uj").write_text("262143328850\n")
    src = RaplSource(root)
    src.frozen_after_s = 0.05  # 1 s on a real package: kept short here
    return src


def test_a_frozen_rapl_counter_gives_the_estimate_not_zero_joules_as_measured(tmp_path):
    """Before: a counter that always read the same gave every request 0 J labelled "rapl"."""
    meter = EnergyMeter(_frozen_rapl(tmp_path), fallback_watts=100.0)
    t0 = time.monotonic()
    a, b = meter.begin(), meter.begin()
    alone = time.monotonic() - t0  # at most the time a ran alone (the whole 100 W its own)
    time.sleep(0.1)
    got_a = meter.end(a)
    elapsed = time.monotonic() - t0
    assert meter.name == "estimate"
    # its share of the estimate, both running: 50 W over its run, plus 50 W more while it was alone
    # (bounded by the clock reads around the begins, so a preempted host can't make it fail)
    assert 0.0 < got_a <= 50.0 * elapsed + 50.0 * alone + 1e-9
    time.sleep(0.02)
    got_b = meter.end(b)
    assert got_b > got_a  # the estimate goes on
    assert meter.attributed_joules == pytest.approx(got_a + got_b)  # the books agree


def test_short_requests_on_a_frozen_counter_add_up_to_the_fallback(tmp_path):
    meter = EnergyMeter(_frozen_rapl(tmp_path), fallback_watts=100.0)
    got = []
    for _ in range(20):
        key = meter.begin()
        time.sleep(0.01)
        got.append(meter.end(key))
        if meter.name == "estimate":
            break
    assert meter.name == "estimate" and got[-1] > 0.0


def test_idle_time_and_a_moving_counter_are_not_taken_for_a_frozen_one(tmp_path):
    src = _frozen_rapl(tmp_path)
    meter = EnergyMeter(src, fallback_watts=100.0)
    time.sleep(0.1)  # idle: the counter need not move
    counter = tmp_path / "intel-rapl:0" / "energy_uj"
    key = meter.begin()
    time.sleep(0.1)
    counter.write_text("2123456\n")  # +2 J while the request ran
    assert meter.end(key) == pytest.approx(2.0) and meter.name == "rapl"


@pytest.mark.parametrize("value", ["abc", "-5", "0", "nan", "inf", "1e400", True, None])
def test_one_rule_and_one_message_for_a_power_figure(monkeypatch, value):
    """Before: EstimateSource said "power figure must be positive watts", the variable "... is not
    a positive number of watts", and EstimateSource(True) was 1 W."""
    if isinstance(value, str):
        monkeypatch.setenv("HYBRIDLLM_POWER_WATTS", value)
        with pytest.raises(ValueError, match=r"^HYBRIDLLM_POWER_WATTS=.* is not a positive number of watts$"):
            default_watts("cpu", 4)
    with pytest.raises(ValueError, match=r"^power_watts=.* is not a positive number of watts$"):
        EstimateSource(value)  # type: ignore[arg-type]


def test_a_power_figure_as_a_string_from_serve_args_is_a_number_or_a_clear_error(monkeypatch):
    """``serve run cloud_server.cluster.app:app_builder power_watts=300`` hands a string. Before:
    "'>' not supported between instances of 'str' and 'int'" from every replica."""
    monkeypatch.delenv("HYBRIDLLM_POWER_WATTS", raising=False)
    meter = meter_for("cpu", power_watts="300")  # type: ignore[arg-type]
    assert meter.name == "estimate" and meter.source.watts == 300.0 and meter.fallback_watts == 300.0
    for bad in ("300W", 0, -1.0):
        with pytest.raises(ValueError, match=r"power_watts=.* is not a positive number of watts"):
            meter_for("cpu", power_watts=bad)  # type: ignore[arg-type]


def test_the_server_releases_its_energy_counter_when_it_stops():
    # the lifespan's end closes the meter (NVML's session); before, nothing called close()
    from cloud_server.api.server import create_app
    from tests.cloud_server.api.fake_engine import FakeEngine
    from tests.cloud_server.api.helpers import ThreadServer

    engine = FakeEngine(max_num_seqs=2, max_waiting=2, max_model_len=128)
    srv = ThreadServer(create_app(lambda: engine, api_keys=["sk-x"])).start()
    try:
        meter = srv.server.config.app.state.metrics.energy.meter
        closed = []
        meter.source.close = lambda: closed.append(True)
    finally:
        srv.stop()
    assert closed == [True]
