"""Review 17 of the cloud budget's bookkeeping: a settle with a bad count frees its hold, a
reservation is refused by a budget that did not make it, and a count too big for a float is
refused rather than breaking every later check."""

from __future__ import annotations

import math
import threading

import pytest

from hybridllm._exceptions import ConfigError
from hybridllm.router.budget import Budget, Reservation


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("tokens", [math.nan, -1, None, "5"])
def test_a_settle_with_a_bad_count_frees_the_hold(tokens: object) -> None:
    # Before: ConfigError, and the reservation stayed held: with one call an hour the cloud stayed
    # closed ("1/1 cloud calls this hour (1 in flight)") until the caller settled or released it
    b = Budget(max_cloud_calls_per_hour=1, clock=Clock())
    r, why = b.reserve(10)
    assert r is not None and why is None
    with pytest.raises(ConfigError, match="tokens must be a number >= 0.*reservation is released"):
        b.settle(r, tokens)
    assert b.usage() == {"calls_hour": 0, "calls_day": 0, "tokens_hour": 0, "tokens_day": 0,
                         "calls_in_flight": 0}  # nothing counted, nothing held
    assert b.exhausted() is None
    b.settle(r, 5)  # a settle after it is harmless, as after a release
    assert b.usage()["calls_hour"] == 0
    again, why = b.reserve(10)
    assert again is not None and why is None


def test_a_bad_count_for_a_reservation_already_settled_is_still_refused() -> None:
    b = Budget(max_cloud_calls_per_hour=5, clock=Clock())
    r, _ = b.reserve(1)
    b.settle(r, 3)
    with pytest.raises(ConfigError, match="tokens must be a number >= 0") as e:
        b.settle(r, math.nan)
    assert "released" not in str(e.value)
    assert b.usage()["tokens_hour"] == 3


def test_another_budgets_reservation_is_refused_and_frees_nothing() -> None:
    # Before: both budgets numbered reservations from 0, so settling a's reservation on b freed
    # b's own hold of id 0 and counted a call b never made
    a = Budget(max_cloud_calls_per_hour=1, clock=Clock())
    b = Budget(max_cloud_calls_per_hour=1, clock=Clock())
    ra, _ = a.reserve(5)
    rb, _ = b.reserve(5)
    assert ra.id == rb.id == 0 and ra != rb
    for call in (lambda: b.settle(ra, 5), lambda: b.release(ra)):
        with pytest.raises(ConfigError, match="not a reservation of this Budget"):
            call()
    assert b.usage()["calls_in_flight"] == 1 and b.usage()["calls_hour"] == 0
    assert a.usage()["calls_in_flight"] == 1  # a's own hold is untouched too
    a.settle(ra, 5)
    b.release(rb)
    assert a.usage()["calls_hour"] == 1 and a.usage()["calls_in_flight"] == 0
    assert b.usage() == {"calls_hour": 0, "calls_day": 0, "tokens_hour": 0, "tokens_day": 0,
                         "calls_in_flight": 0}


def test_a_reservation_made_by_hand_is_refused() -> None:
    b = Budget(max_cloud_calls_per_hour=1, clock=Clock())
    r, _ = b.reserve(5)
    with pytest.raises(ConfigError, match="not a reservation of this Budget"):
        b.release(Reservation(r.id, 5))
    assert b.usage()["calls_in_flight"] == 1


@pytest.mark.parametrize("method", ["settle", "release"])
def test_no_reservation_is_a_clear_error(method: str) -> None:
    # reserve() returns (None, why) when the budget is spent; before: AttributeError on None.id
    b = Budget(max_cloud_calls_per_hour=0, clock=Clock())
    r, why = b.reserve(5)
    assert r is None and why
    with pytest.raises(ConfigError, match="reservation is None"):
        b.settle(r, 5) if method == "settle" else b.release(r)


@pytest.mark.parametrize("method", ["record", "reserve", "settle"])
@pytest.mark.parametrize("tokens", [10**400, 1e300, 2**63], ids=["10**400", "1e300", "2**63"])
def test_a_count_too_big_for_a_float_is_refused(method: str, tokens: object) -> None:
    # Before: 10**400 was counted, then exhausted(), reserve() and retry_after_s() all raised
    # OverflowError (int too large to convert to float) until it left the day's window
    b = Budget(max_cloud_tokens_per_hour=100, clock=Clock())
    r, _ = b.reserve(1)
    call = {"record": lambda: b.record(tokens), "reserve": lambda: b.reserve(tokens),
            "settle": lambda: b.settle(r, tokens)}[method]
    with pytest.raises(ConfigError, match="tokens must be a number >= 0"):
        call()
    assert b.usage()["tokens_hour"] == 0
    assert b.exhausted() is None and b.retry_after_s() == 0.0


def test_the_largest_count_still_counts() -> None:
    b = Budget(max_cloud_tokens_per_hour=100, clock=Clock())
    b.record(2**63 - 1)
    assert b.exhausted().startswith("budget spent:") and b.retry_after_s() == pytest.approx(3600)


def test_a_call_settled_after_the_hour_rolled_over_counts_when_it_ended() -> None:
    # reserved in one hour, settled in the next: held in every window meanwhile, then counted
    # at its end (one sliding hour from then), never twice and never lost
    clock = Clock()
    b = Budget(max_cloud_calls_per_hour=1, clock=clock)
    r, _ = b.reserve(10)
    clock.now += 3700
    assert b.reserve(1)[0] is None  # still in flight
    b.settle(r, 7)
    assert b.usage()["calls_hour"] == 1 and b.retry_after_s() == pytest.approx(3600)
    clock.now += 3600
    assert b.exhausted() is None


def test_concurrent_settles_and_releases_count_each_call_once() -> None:
    b = Budget(max_cloud_calls_per_day=1000)
    held = [b.reserve(1)[0] for _ in range(200)]
    start = threading.Barrier(8)

    def worker(i: int) -> None:
        start.wait()
        for r in held:
            b.settle(r, 2) if (r.id + i) % 2 else b.release(r)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    usage = b.usage()
    assert usage["calls_in_flight"] == 0 and usage["calls_day"] <= 200
    assert usage["tokens_day"] == 2 * usage["calls_day"]
