"""stats() percentiles are nearest-rank: the ceil(q n / 100)-th value, never one rank too high."""

from __future__ import annotations

import threading

import pytest

from hybridllm._stats import Stats, percentile
from hybridllm._types import Completion, Usage


@pytest.mark.parametrize("values,q,want", [
    ([1.0, 2.0], 50, 1.0),  # before: 2.0 (round(1.5) == 2)
    ([float(i) for i in range(1, 21)], 95, 19.0),  # before: 20.0, the maximum
    ([float(i) for i in range(1, 11)], 50, 5.0),  # before: 6.0
    ([float(i) for i in range(1, 101)], 95, 95.0),
    ([float(i) for i in range(1, 31)], 95, 29.0),
    ([float(i) for i in range(1, 5)], 50, 2.0),
    ([3.0, 1.0, 2.0], 0, 1.0),
    ([3.0, 1.0, 2.0], 100, 3.0),
    ([7.0], 95, 7.0),
    ([], 50, None),
])
def test_percentile_is_nearest_rank(values, q, want):
    assert percentile(values, q) == want


def _completion(route: str, latency_ms: float) -> Completion:
    return Completion("a", route, "r", "m", usage=Usage(1, 1, 2), latency_ms=latency_ms,
                      ttft_ms=latency_ms / 2)


def test_snapshot_p95_of_twenty_requests_is_not_the_slowest():
    stats = Stats(price_per_1k_tokens=0.0)
    for ms in range(20, 0, -1):
        stats.record(_completion("edge", float(ms)))
    edge = stats.snapshot()["routes"]["edge"]
    assert (edge["latency_ms_p50"], edge["latency_ms_p95"]) == (10.0, 19.0)
    assert (edge["ttft_ms_p50"], edge["ttft_ms_p95"]) == (5.0, 9.5)


def test_concurrent_records_are_all_counted():
    stats = Stats(price_per_1k_tokens=1.0)
    snapshots: list[dict] = []

    def work() -> None:
        for _ in range(200):
            stats.record(_completion("cloud", 1.0))
            snapshots.append(stats.snapshot())

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = stats.snapshot()
    assert final["requests"] == 800 and final["cloud_tokens"] == 1600 and final["cloud_fraction"] == 1.0
    assert all(s["requests"] == s["routes"]["cloud"]["requests"] for s in snapshots)
