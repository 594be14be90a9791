"""Fixtures shared by the cloud server's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def torchs_kernels(monkeypatch):
    """The engine as on a CPU without its own kernels (``HYBRIDLLM_CPU_KERNELS=0``): layers loaded
    during the test take torch's formats; the decision is made again afterwards."""
    from cloud_server.layers import cpu_kernels

    monkeypatch.setenv("HYBRIDLLM_CPU_KERNELS", "0")
    cpu_kernels.reset()
    yield
    monkeypatch.delenv("HYBRIDLLM_CPU_KERNELS")
    cpu_kernels.reset()
