"""Thread pools are sized by the CPUs this process may use (a container's cpuset, taskset), not
by the host's core count: the cloud engine's torch threads and its energy estimate read
os.cpu_count() (64 threads on a 2-CPU container), as llama.cpp did."""

from __future__ import annotations

import os

import pytest

from hybridllm._cpus import usable_cpus


@pytest.fixture
def two_of_64(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # the host
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5, 9}, raising=False)  # ours


def test_usable_cpus_reads_the_affinity(two_of_64) -> None:
    assert usable_cpus() == 2


def test_without_an_affinity_call_it_is_the_core_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # macOS, Windows
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert usable_cpus() == 6


def test_the_cloud_energy_estimate_counts_the_usable_cpus(two_of_64, monkeypatch) -> None:
    from cloud_server.energy import CPU_WATTS_PER_THREAD, default_watts

    monkeypatch.delenv("HYBRIDLLM_POWER_WATTS", raising=False)
    assert default_watts("cpu", None) == pytest.approx(2 * CPU_WATTS_PER_THREAD)  # was 64 threads' worth
    assert default_watts("cpu", 3) == pytest.approx(3 * CPU_WATTS_PER_THREAD)
