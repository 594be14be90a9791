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


def test_a_spent_budget_says_when_there_is_room_again():
    clock = Clock()
    b = Budget(max_cloud_calls_per_hour=2, clock=clock)
    b.record(10)
    clock.t += 600
    b.record(10)
    assert b.exhausted() == "budget spent: 2/2 cloud calls this hour (sliding window: room again in 50 min)"
    clock.t += 3000  # the first call has left the window
    assert b.exhausted() is None
    tokens = Budget(max_cloud_tokens_per_day=1000, clock=clock)
    tokens.record(10)
    clock.t += 3600
    tokens.record(10)
    tokens.record(990)
    # 1010 tokens: one more fits once the first two calls (20 tokens) have left the day; the
    # second leaves 86,400 s from now
    assert tokens.exhausted() == ("budget spent: 1010/1000 cloud tokens today "
                                  "(sliding window: room again in 1 day)")
    clock.t += 3600  # an hour on, the wait is an hour shorter
    assert tokens.exhausted() == ("budget spent: 1010/1000 cloud tokens today "
                                  "(sliding window: room again in 23 h)")
    assert Budget(max_cloud_calls_per_hour=0).exhausted() == (
        "budget spent: 0/0 cloud calls this hour (max_cloud_calls_per_hour is 0: no cloud calls until it "
        "is raised)")
    assert Budget(max_cloud_usd_per_day=0.0).exhausted() == (
        "budget spent: $0.00/$0.00 cloud spend today (max_cloud_usd_per_day is 0: no cloud calls until it "
        "is raised)")
