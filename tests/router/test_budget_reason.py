"""A budget spent under several limits at once says when a call really fits again."""

from __future__ import annotations

from hybridllm.router.budget import Budget


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_the_reason_names_the_limit_with_the_longest_wait_and_the_others_after_it():
    clock = Clock()
    b = Budget(max_cloud_calls_per_hour=1, max_cloud_tokens_per_day=100, clock=clock)
    b.record(120)  # one call of 120 tokens spends both the hour's calls and the day's tokens
    clock.t += 600
    # the hour's call limit has room in 50 min, the day's tokens only in 23 h 50 min: a call fits
    # when both have room, so the reason leads with the day and gives its time
    reason = b.exhausted()
    assert reason == ("budget spent: 120/100 cloud tokens today (sliding window: room again in 23 h 50 min); "
                      "also 1/1 cloud calls this hour (sliding window: room again in 50 min)")
    assert b.retry_after_s() == 86400 - 600  # the same time as the reason's lead
    clock.t += 3000  # the hour has room, the day does not: only the day is named
    assert b.exhausted() == "budget spent: 120/100 cloud tokens today (sliding window: room again in 23 h)"


def test_a_limit_that_never_has_room_leads():
    clock = Clock()
    b = Budget(max_cloud_calls_per_hour=1, max_cloud_tokens_per_day=0, clock=clock)
    b.record(5)
    reason = b.exhausted()
    assert reason is not None and reason.startswith(
        "budget spent: 5/0 cloud tokens today (max_cloud_tokens_per_day is 0: no cloud calls until it is "
        "raised); also 1/1 cloud calls this hour"), reason
    assert b.retry_after_s() is None
