"""The budget's windows count the time a laptop sleeps (review 21)."""

from __future__ import annotations

import sys
import time

import pytest

from hybridllm.router.budget import Budget

pytestmark = pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME") and sys.platform != "darwin",
                                reason="no sleep-counting clock here")


@pytest.fixture
def asleep(monkeypatch):
    """time.monotonic frozen (it stops while Linux or macOS sleeps); the sleep-counting clock
    moves on by ``slept["s"]``."""
    slept = {"s": 0.0}
    real = time.clock_gettime

    def clock_gettime(clock_id):
        return real(clock_id) + slept["s"]  # every clock but time.monotonic moved on

    frozen = time.monotonic()
    monkeypatch.setattr(time, "clock_gettime", clock_gettime)
    monkeypatch.setattr(time, "monotonic", lambda: frozen)
    return slept


def test_an_hours_budget_spent_before_a_sleep_has_room_on_waking(asleep):
    """Before, the windows ran on time.monotonic: a budget spent in the evening stayed spent after
    a night's sleep (the day's window counted only the hours awake)."""
    b = Budget(max_cloud_calls_per_hour=1, max_cloud_usd_per_day=1.0, price_per_1k_tokens=1.0)
    held, why = b.reserve(10)
    b.settle(held, 10)
    assert b.reserve(0)[1] is not None  # spent
    asleep["s"] = 2 * 3600.0  # the lid closed for two hours
    assert b.exhausted() is None and b.retry_after_s() == 0.0
    assert b.usage()["calls_hour"] == 0 and b.usage()["calls_day"] == 1
    asleep["s"] = 9 * 3600.0 + 86400.0  # and the next night too
    assert b.usage()["calls_day"] == 0


def test_the_wait_it_gives_counts_down_while_asleep(asleep):
    b = Budget(max_cloud_tokens_per_day=100)
    b.record(100)
    assert b.retry_after_s() == pytest.approx(86400.0, abs=5)
    asleep["s"] = 8 * 3600.0
    assert b.retry_after_s() == pytest.approx(16 * 3600.0, abs=5)
    assert "room again in 16 h" in b.exhausted()
