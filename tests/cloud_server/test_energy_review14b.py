"""A bad power figure (HYBRIDLLM_POWER_WATTS, an infinite --power-watts) is refused at start with
a message naming it, on every machine: before, it was a bare float() error, slipped through where a
counter worked (then failed every request once the counter failed), or read inf and gave 0 J. And a
RAPL counter that wraps more than once within a request loses nothing (read in the background)."""

from __future__ import annotations

import gc
import tempfile
import threading
import time
from pathlib import Path

import pytest

from cloud_server import energy_sources
from cloud_server.energy import (
    EnergyMeter,
    EnergySource,
    EstimateSource,
    RaplSource,
    detect_source,
    meter_for,
)


def _rapl_tree(root: Path) -> Path:
    d = root / "intel-rapl:0"
    d.mkdir()
    (d / "name").write_text("package-0\n")
    (d / "energy_uj").write_text("1000\n")
    (d / "max_energy_range_uj").write_text("1000000000\n")
    return d / "energy_uj"


@pytest.mark.parametrize("value", ["abc", "-5", "0", "nan", "inf", "1e400"])
def test_a_bad_power_watts_variable_is_a_clear_error_naming_it(monkeypatch, value):
    monkeypatch.setenv("HYBRIDLLM_POWER_WATTS", value)
    monkeypatch.setattr(energy_sources, "POWERCAP", Path("/nonexistent-powercap"))
    with pytest.raises(ValueError, match=r"HYBRIDLLM_POWER_WATTS=.*positive number of watts"):
        detect_source("cpu")


def test_a_bad_power_watts_variable_is_refused_where_rapl_works_too(monkeypatch, tmp_path):
    """Before: RAPL read fine, so -5 W was kept as the fallback; once the counter failed, every
    request failed on EstimateSource(-5) (a 500) instead of going over to an estimate."""
    _rapl_tree(tmp_path)
    monkeypatch.setattr(energy_sources, "POWERCAP", tmp_path)
    monkeypatch.setenv("HYBRIDLLM_POWER_WATTS", "-5")
    with pytest.raises(ValueError, match="HYBRIDLLM_POWER_WATTS='-5'"):
        meter_for("cpu")


def test_a_good_power_watts_variable_still_sets_the_estimate(monkeypatch):
    monkeypatch.setenv("HYBRIDLLM_POWER_WATTS", "42.5")
    monkeypatch.setattr(energy_sources, "POWERCAP", Path("/nonexistent-powercap"))
    src = detect_source("cpu")
    assert isinstance(src, EstimateSource) and src.watts == 42.5


def test_an_infinite_power_figure_is_refused_not_read_as_zero_joules():
    """Before: EstimateSource(inf) was accepted; every reading was inf, inf - inf = NaN, and the
    meter's max(0, NaN) charged each request 0 J, reported as a real estimate."""
    with pytest.raises(ValueError, match="positive number of watts"):
        EstimateSource(float("inf"))


def test_the_meter_still_falls_back_with_a_valid_figure():
    class Broken(EnergySource):
        name = "nvml"
        reads = 0

        def read_joules(self) -> float:
            self.reads += 1
            if self.reads > 1:
                raise RuntimeError("lost")
            return 0.0

    meter = EnergyMeter(Broken(), fallback_watts=50.0)
    key = meter.begin()
    assert meter.end(key) >= 0.0 and meter.name == "estimate"


def _wait_for_read(src, value: int, timeout_s: float = 10.0) -> None:
    """Until the source has read ``value`` on its own (the background poll), or the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and src._last[0] != value:
        time.sleep(0.01)


def test_a_counter_that_wraps_twice_in_one_request_loses_nothing(tmp_path):
    """A 1 J range (262 kJ on real CPUs: 20 min at 200 W) passed more than once between a request's
    begin and end. Before: only the two end points were read, so 2.4 J read as 0.4 J."""
    counter = _rapl_tree(tmp_path)
    (tmp_path / "intel-rapl:0" / "max_energy_range_uj").write_text("1000000\n")
    counter.write_text("0\n")
    src = RaplSource(tmp_path)
    meter = EnergyMeter(src)
    key = meter.begin()
    for value in (800_000, 600_000, 400_000):  # +0.8 J each: the last two wrap
        counter.write_text(f"{value}\n")
        _wait_for_read(src, value)
    assert meter.end(key) == pytest.approx(2.4)


def test_the_background_read_ends_with_its_source():
    """No thread left behind once the meter drops the source (its estimate took over)."""
    with tempfile.TemporaryDirectory() as tmp:
        _rapl_tree(Path(tmp))
        before = set(threading.enumerate())
        src = RaplSource(Path(tmp), poll_s=0.01)
        # by name: in one suite process another test's thread may start in between
        (poller,) = [t for t in set(threading.enumerate()) - before if t.name == "rapl-poll"]
        del src
        gc.collect()
        poller.join(timeout=2.0)
        assert not poller.is_alive()


def test_the_server_stops_at_start_naming_the_variable(monkeypatch):
    from cloud_server.api.server import create_app

    from .api.fake_engine import FakeEngine
    from .api.helpers import ThreadServer

    monkeypatch.setenv("HYBRIDLLM_POWER_WATTS", "300W")
    monkeypatch.setattr(energy_sources, "POWERCAP", Path("/nonexistent-powercap"))
    errors: list[BaseException] = []
    engine = FakeEngine(max_num_seqs=2, max_waiting=2, max_model_len=128)
    srv = ThreadServer(create_app(lambda: engine, on_load_error=errors.append)).start(wait_healthy=False)
    try:
        deadline = time.monotonic() + 10
        while not errors and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        srv.stop()
    assert errors and "HYBRIDLLM_POWER_WATTS='300W' is not a positive number" in str(errors[0])
