from __future__ import annotations

import pytest

from hybridllm._exceptions import ConfigError
from hybridllm.router.budget import Budget


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_calls_per_hour_slide():
    clock = Clock()
    b = Budget(max_cloud_calls_per_hour=2, clock=clock)
    assert b.exhausted() is None
    b.record(10)
    b.record(10)
    assert "2/2 cloud calls this hour" in (b.exhausted() or "")
    clock.t += 3601  # the first calls leave the window
    assert b.exhausted() is None


def test_tokens_per_day():
    clock = Clock()
    b = Budget(max_cloud_tokens_per_day=1000, clock=clock)
    b.record(600)
    assert b.exhausted() is None
    b.record(500)
    assert "cloud tokens today" in (b.exhausted() or "")
    clock.t += 86401
    assert b.exhausted() is None and b.usage()["tokens_day"] == 0


def test_unlimited_and_validation():
    assert Budget().exhausted() is None
    with pytest.raises(ConfigError):
        Budget(max_cloud_calls_per_hour=-1)
    with pytest.raises(ConfigError):
        Budget(max_cloud_tokens_per_day=1.5)  # type: ignore[arg-type]
