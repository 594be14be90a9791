"""Running statistics of a client: requests per route, cache hit rate, cloud fraction, latency and
TTFT percentiles per route, cloud tokens and cost (what the cloud calls cost, as the budget counts
them: not the tokens a device wrote to finish a broken cloud answer), and the cost saved versus
sending everything to the cloud (every token the cloud did not write, priced at the cloud's rate:
an answer not produced by the cloud, the device's part of a cloud answer it finished, and a cache
hit at the tokens of the call that made the answer it replays, stored with the cache entry)."""

from __future__ import annotations

import math
import threading
from collections import defaultdict, deque
from typing import Any

from ._types import Completion

_WINDOW = 10_000  # latency samples kept per route


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]): the smallest value with at least q% of the values
    at or below it, the ceil(q n / 100)-th; None for no data. (round(q n / 100 + 0.5) rounded
    halves to even: the p95 of 20 latencies was their maximum, the p50 of 2 the larger one.)"""
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(q * len(ordered) / 100) - 1))
    return ordered[k]


class Stats:
    def __init__(self, *, price_per_1k_tokens: float) -> None:
        self.price_per_1k = price_per_1k_tokens
        self._lock = threading.Lock()
        self._count: dict[str, int] = defaultdict(int)
        self._latency: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=_WINDOW))
        self._ttft: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=_WINDOW))
        self.cloud_tokens = 0
        self.cloud_cost = 0.0
        self.saved_cost = 0.0
        self.co2_g = 0.0  # hybridllm.carbon: grams of CO2 of cloud answers with a known intensity
        self.co2_saved_g = 0.0  # ... and saved against always using the fastest endpoint
        self.energy_j = 0.0

    def cost(self, tokens: int) -> float:
        return tokens / 1000 * self.price_per_1k

    def record(self, c: Completion, *, avoided_tokens: int = 0, cloud_tokens: int | None = None) -> None:
        """``avoided_tokens``: for a cache hit, the tokens of the call that made its answer.
        ``cloud_tokens``: what the answer's cloud calls cost (the pipeline's count: for an answer
        the device finished, the cloud's part alone); None: the answer's usage."""
        with self._lock:
            self._count[c.route] += 1
            self._latency[c.route].append(c.latency_ms)
            if c.ttft_ms is not None:
                self._ttft[c.route].append(c.ttft_ms)
            self.co2_g += c.co2_g or 0.0
            self.co2_saved_g += c.co2_saved_g or 0.0
            self.energy_j += c.energy_j or 0.0
            answered = "cloud" in c.route and "unavailable" not in c.route  # the cloud wrote (some of) it
            if cloud_tokens is None:
                cloud_tokens = c.usage.total_tokens if answered else 0
            # every cloud call's cost, also one that broke before the device answered instead
            self.cloud_tokens += cloud_tokens
            self.cloud_cost += c.cost_usd
            if not answered:
                self.saved_cost += self.cost(c.usage.total_tokens or avoided_tokens)
            elif c.route.endswith("->edge"):
                # the device wrote the end of a broken cloud answer: a cloud-only client would have
                # paid for those tokens too. The answer's usage is the whole answer (the prompt once,
                # the cloud's part and the device's); less what the cloud calls cost: the device's
                self.saved_cost += self.cost(max(0, c.usage.total_tokens - cloud_tokens))

    def record_cloud_cost(self, tokens: int) -> None:
        """Cloud calls of a request that ended without an answer (the caller stopped reading or
        cancelled, an error after the call): they cost ``tokens`` all the same."""
        if tokens:
            with self._lock:
                self.cloud_tokens += tokens
                self.cloud_cost += self.cost(tokens)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            total = sum(self._count.values())
            cloud = sum(n for r, n in self._count.items() if "cloud" in r and "unavailable" not in r)
            per_route = {
                route: {
                    "requests": n,
                    "latency_ms_p50": percentile(list(self._latency[route]), 50),
                    "latency_ms_p95": percentile(list(self._latency[route]), 95),
                    "ttft_ms_p50": percentile(list(self._ttft[route]), 50),
                    "ttft_ms_p95": percentile(list(self._ttft[route]), 95),
                }
                for route, n in sorted(self._count.items())
            }
            return {
                "requests": total,
                "routes": per_route,
                "cache_hit_rate": self._count.get("cache", 0) / total if total else 0.0,
                "cloud_fraction": cloud / total if total else 0.0,
                "cloud_tokens": self.cloud_tokens,
                "cloud_cost_usd": round(self.cloud_cost, 6),
                "cost_saved_vs_cloud_only_usd": round(self.saved_cost, 6),
                "cloud_energy_j": round(self.energy_j, 3),
                "co2_g": round(self.co2_g, 6),
                "co2_saved_g": round(self.co2_saved_g, 6),
            }
