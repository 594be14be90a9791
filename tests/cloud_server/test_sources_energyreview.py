"""Energy sources as the counters really behave: RAPL trees with psys and sub-domains, counters
readable by root only, wrap-around inside a request; NVML on a machine with several GPUs, an old GPU
without the energy counter, no nvidia-ml-py; and the sharing rule's bound (the requests' joules never
sum to more than was measured). Fake sysfs trees, a fake NVML and fake clocks: no hardware needed."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from cloud_server.energy import EnergyMeter, EstimateSource, NvmlSource, RaplSource, detect_source


def _domain(root: Path, name: str, kind: str | None, energy_uj: int, wrap_uj: int = 10**9) -> Path:
    d = root / name
    d.mkdir()
    if kind is not None:
        (d / "name").write_text(kind + "\n")
    (d / "energy_uj").write_text(f"{energy_uj}\n")
    (d / "max_energy_range_uj").write_text(f"{wrap_uj}\n")
    return d / "energy_uj"


def _client_tree(root: Path) -> tuple[Path, Path]:
    """An Intel client machine: package-0 with its core/uncore sub-domains, and psys (the whole
    platform, package included) as a second top-level domain."""
    pkg = _domain(root, "intel-rapl:0", "package-0", 1_000)
    _domain(root, "intel-rapl:0:0", "core", 500)
    _domain(root, "intel-rapl:0:1", "uncore", 100)
    psys = _domain(root, "intel-rapl:1", "psys", 5_000)
    return pkg, psys


def test_psys_is_not_added_to_the_package_it_contains(tmp_path):
    """Before: intel-rapl:1 (psys) was summed with intel-rapl:0 (package-0): 1 J of CPU work while
    the platform drew 3 J read as 4 J."""
    pkg, psys = _client_tree(tmp_path)
    src = RaplSource(tmp_path)
    start = src.read_joules()
    pkg.write_text(str(1_000 + 1_000_000))  # the package: +1 J
    psys.write_text(str(5_000 + 3_000_000))  # the platform, package included: +3 J
    (tmp_path / "intel-rapl:0:0" / "energy_uj").write_text(str(500 + 700_000))  # part of the 1 J
    assert src.read_joules() - start == pytest.approx(1.0)


def test_two_packages_are_summed_and_psys_alone_is_used(tmp_path):
    server = tmp_path / "server"
    server.mkdir()
    p0 = _domain(server, "intel-rapl:0", "package-0", 0)
    p1 = _domain(server, "intel-rapl:1", "package-1", 0)
    _domain(server, "intel-rapl:0:0", "dram", 0)
    src = RaplSource(server)
    p0.write_text("2000000")
    p1.write_text("3000000")
    (server / "intel-rapl:0:0" / "energy_uj").write_text("9000000")  # dram: a part, not added
    assert src.read_joules() == pytest.approx(5.0)

    only_psys = tmp_path / "psys"
    only_psys.mkdir()
    platform = _domain(only_psys, "intel-rapl:1", "psys", 0)
    src = RaplSource(only_psys)
    platform.write_text("4000000")
    assert src.read_joules() == pytest.approx(4.0)


def test_a_request_across_a_wrap_gets_the_small_true_figure(tmp_path):
    counter = _domain(tmp_path, "intel-rapl:0", "package-0", 999_000_000, wrap_uj=1_000_000_000)
    meter = EnergyMeter(RaplSource(tmp_path))
    key = meter.begin()
    counter.write_text("500000")  # wrapped: 1 J to the top, then 0.5 J
    joules = meter.end(key)
    assert joules == pytest.approx(1.5)


def test_counters_readable_by_root_only_fall_back_once_and_say_why(tmp_path, monkeypatch, caplog):
    _client_tree(tmp_path)
    real_read = Path.read_text

    def denied(self: Path, *args, **kwargs):
        if self.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(self))
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", denied)
    monkeypatch.setattr("cloud_server.energy_sources.POWERCAP", tmp_path)
    monkeypatch.delenv("HYBRIDLLM_POWER_WATTS", raising=False)
    with caplog.at_level(logging.INFO, logger="cloud_server.energy"):
        src = detect_source("cpu", num_threads=4)
        meter = EnergyMeter(src)
        for _ in range(5):  # requests: nothing more is logged
            meter.end(meter.begin())
    assert src.name == "estimate" and src.watts == 40.0
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "permission denied" in said[0] and "estimate" in said[0], said


class FakeNvml:
    """pynvml as the driver answers it: every GPU of the machine, in NVML's numbering."""

    def __init__(self, millijoules: dict[int, int], supported: bool = True) -> None:
        self.mj = millijoules
        self.supported = supported
        self.opened: list[int] = []

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if index not in self.mj:
            raise RuntimeError(f"Invalid Argument: no GPU {index}")
        self.opened.append(index)
        return index

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        if not self.supported:
            raise RuntimeError("Not Supported")  # pynvml's NVMLError_NotSupported on pre-Volta
        return self.mj[handle]


def test_nvml_reads_the_engines_gpu_not_nvml_index_of_the_cuda_ordinal(monkeypatch):
    """Before: cuda:1 opened NVML's GPU 1 even with CUDA_VISIBLE_DEVICES=2,3, where cuda:1 is the
    machine's GPU 3: the figures were another job's GPU."""
    pytest.importorskip("torch")
    nvml = FakeNvml({0: 0, 1: 0, 2: 0, 3: 0})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    src = detect_source("cuda:1", nvml=nvml)
    assert src.name == "nvml" and nvml.opened == [3]
    start = src.read_joules()
    nvml.mj[1] += 50_000  # another GPU's work: not ours
    nvml.mj[3] += 7_000
    assert src.read_joules() - start == pytest.approx(7.0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    nvml.opened.clear()
    assert detect_source("cuda:1", nvml=nvml).name == "nvml" and nvml.opened == [1]


def test_a_gpu_without_the_energy_counter_gets_the_gpu_estimate_not_the_cpus_rapl(
    tmp_path, monkeypatch, caplog
):
    """Before: NVML unusable (pre-Volta GPU, or no nvidia-ml-py) fell to RAPL, labelled "rapl" but
    measuring the CPU packages only, without the GPU doing the work."""
    _client_tree(tmp_path)
    monkeypatch.setattr("cloud_server.energy_sources.POWERCAP", tmp_path)  # readable RAPL counters
    monkeypatch.delenv("HYBRIDLLM_POWER_WATTS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with caplog.at_level(logging.WARNING, logger="cloud_server.energy"):
        old_gpu = detect_source("cuda:0", nvml=FakeNvml({0: 0}, supported=False))
    assert old_gpu.name == "estimate" and old_gpu.watts == 300.0
    assert "Not Supported" in caplog.text and "--power-watts" in caplog.text
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    no_pynvml = detect_source("cuda:0")
    assert no_pynvml.name == "estimate" and no_pynvml.watts == 300.0
    assert detect_source("cpu").name == "rapl"  # a CPU engine still measures its packages
    with pytest.raises(RuntimeError, match="Not Supported"):
        NvmlSource(0, FakeNvml({0: 0}, supported=False))


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_concurrent_requests_share_the_measured_energy_never_n_times_it():
    """Four overlapping requests on a 100 W source: each gets a share of each interval, and the
    shares sum to what was measured while any request ran (not 4x the machine's energy)."""
    clock = Clock()
    source = EstimateSource(100.0, clock)
    meter = EnergyMeter(source)
    measured_from = source.read_joules()
    keys = []
    for _ in range(4):  # staggered starts, 0.5 s apart
        keys.append(meter.begin())
        clock.t += 0.5
    got = []
    for key in keys:  # staggered ends
        clock.t += 0.25
        got.append(meter.end(key))
    measured = source.read_joules() - measured_from  # 3 s at 100 W, every second with a request
    assert measured == pytest.approx(300.0)
    assert sum(got) == pytest.approx(measured) == pytest.approx(meter.attributed_joules)
    assert max(got) < measured / 2  # nobody is charged the whole machine
    assert got[0] == pytest.approx(50 + 50 / 2 + 50 / 3 + 75 / 4)  # its share of each interval
