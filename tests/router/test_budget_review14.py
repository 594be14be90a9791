"""Review 14: a reservation settled twice (a retried or duplicated settle) counted its call and
its tokens twice, so the budget ran out early; only the first settle counts now, as release."""

from __future__ import annotations

from hybridllm.router.budget import Budget


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_settling_twice_counts_the_call_once() -> None:
    b = Budget(max_cloud_calls_per_hour=2, max_cloud_tokens_per_day=1000, clock=Clock())
    held, why = b.reserve(100)
    assert held is not None and why is None
    b.settle(held, 120)
    b.settle(held, 120)
    u = b.usage()
    assert (u["calls_hour"], u["tokens_day"], u["calls_in_flight"]) == (1, 120, 0)
    assert b.exhausted() is None  # one call of two used: room for another
    assert b.reserve(10)[0] is not None


def test_settling_after_a_release_counts_nothing() -> None:
    b = Budget(max_cloud_calls_per_hour=1, clock=Clock())
    held, _ = b.reserve(10)
    b.release(held)
    b.settle(held, 50)
    assert b.usage()["calls_hour"] == 0 and b.exhausted() is None


def test_two_reservations_each_count() -> None:
    b = Budget(max_cloud_calls_per_hour=5, clock=Clock())
    first, second = b.reserve(10)[0], b.reserve(10)[0]
    b.settle(first, 30)
    b.settle(second, 40)
    u = b.usage()
    assert (u["calls_hour"], u["tokens_hour"], u["calls_in_flight"]) == (2, 70, 0)
