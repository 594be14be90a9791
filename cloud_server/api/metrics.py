"""Prometheus metrics, every series labelled by ``model``.

Two sources:
- request-level series observed by the API as outputs stream out (TTFT, inter-token latency,
  end-to-end latency, prompt and generation tokens, finished requests by reason);
- engine state read from ``engine.stats()`` at scrape time (requests running and waiting, KV cache
  usage and blocks, prefix cache queries and hits, preemptions, steps, batch sizes), so it can never
  drift from the engine's own books.

Each app gets its own ``CollectorRegistry``: several servers can live in one process (tests).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

PREFIX = "hybridllm"
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 20, 40, 80)
_ITL_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5, 5)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120, 300)

# engine.stats() key -> (metric name, help, kind)
_ENGINE_SERIES: dict[str, tuple[str, str, str]] = {
    "num_running": ("num_requests_running", "Requests in the running batch.", "gauge"),
    "num_waiting": ("num_requests_waiting", "Requests waiting to be scheduled.", "gauge"),
    "kv_cache_usage": (
        "kv_cache_usage_ratio",
        "Fraction of KV cache blocks in use (0-1).",
        "gauge",
    ),
    "num_total_blocks": ("kv_cache_blocks_total", "KV cache blocks in the pool.", "gauge"),
    "num_free_blocks": ("kv_cache_blocks_free", "KV cache blocks free for allocation.", "gauge"),
    "num_cached_blocks": (
        "kv_cache_blocks_cached",
        "Free blocks still holding a reusable prefix (evicted LRU-first).",
        "gauge",
    ),
    "prefix_cache_queries": (
        "prefix_cache_queries",
        "Prompt tokens looked up in the prefix cache (each request once, at its first admission).",
        "counter",
    ),
    "prefix_cache_hits": (
        "prefix_cache_hits",
        "Prompt tokens found in the prefix cache (each request once; each of an n > 1 "
        "response's choices is a request, its usage.cached_tokens is choice 0's).",
        "counter",
    ),
    "num_preemptions": ("num_preemptions", "Sequences preempted for lack of KV blocks.", "counter"),
    "steps": ("engine_steps", "Engine steps run.", "counter"),
    "last_batch_num_seqs": ("batch_num_seqs_last", "Sequences in the last engine step.", "gauge"),
    "last_batch_num_tokens": (
        "batch_num_tokens_last",
        "Tokens (prefill and decode) in the last engine step.",
        "gauge",
    ),
    "max_batch_num_seqs": (
        "batch_num_seqs_max",
        "Most sequences batched in one engine step.",
        "gauge",
    ),
    # speculative decoding, with vLLM's names (vllm:spec_decode_*) under our prefix
    "spec_decode_num_drafts": (
        "spec_decode_num_drafts",
        "Drafts verified (one sequence's proposal in one step).",
        "counter",
    ),
    "spec_decode_num_draft_tokens": (
        "spec_decode_num_draft_tokens",
        "Draft tokens proposed and verified.",
        "counter",
    ),
    "spec_decode_num_accepted_tokens": (
        "spec_decode_num_accepted_tokens",
        "Draft tokens accepted by the target model.",
        "counter",
    ),
    # the cluster front end's own figures (cloud_server/cluster/remote_engine.py), absent from a
    # single-process server's stats
    "num_replicas": ("cluster_replicas", "Engine replicas reporting their stats.", "gauge"),
    "num_replicas_wanted": (
        "cluster_replicas_wanted",
        "Engine replicas wanted (the autoscaler's current target, else --replicas).",
        "gauge",
    ),
    "num_retried": (
        "cluster_requests_retried",
        "Requests sent again to a replica after theirs failed before the first output.",
        "counter",
    ),
    "num_replica_failures": (
        "cluster_replica_failures",
        "Request attempts failed by their replica (died, unreachable, engine gone, or raised).",
        "counter",
    ),
}
# engine.stats() key holding a list -> (metric name, help, label of the list index)
_ENGINE_LIST_SERIES: dict[str, tuple[str, str, str]] = {
    "spec_decode_num_accepted_tokens_per_pos": (
        "spec_decode_num_accepted_tokens_per_pos",
        "Draft tokens accepted at each draft position (0 = the first drafted token).",
        "position",
    ),
}


class _EngineCollector(Collector):
    def __init__(self, stats: Callable[[], dict[str, Any] | None], model: Callable[[], str]) -> None:
        self._stats = stats
        self._model = model

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        if not stats:
            return
        model = self._model()
        for key, (name, doc, kind) in _ENGINE_SERIES.items():
            if key not in stats:
                continue
            family_type = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = family_type(f"{PREFIX}_{name}", doc, labels=["model"])
            family.add_metric([model], float(stats[key]))
            yield family
        for key, (name, doc, label) in _ENGINE_LIST_SERIES.items():
            values = stats.get(key)
            if not values:
                continue
            family = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=["model", label])
            for i, value in enumerate(values):
                family.add_metric([model, str(i)], float(value))
            yield family


class ServerMetrics:
    """Request-level series plus the engine collector, in a registry of their own."""

    def __init__(self, stats: Callable[[], dict[str, Any] | None], model: Callable[[], str]) -> None:
        self.registry = CollectorRegistry()
        self._model = model
        reg = self.registry
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "Time from arrival to the first output token.",
            ["model"],
            buckets=_TTFT_BUCKETS,
            registry=reg,
        )
        self.itl = Histogram(
            f"{PREFIX}_inter_token_latency_seconds",
            "Time between consecutive output tokens.",
            ["model"],
            buckets=_ITL_BUCKETS,
            registry=reg,
        )
        self.e2e = Histogram(
            f"{PREFIX}_e2e_request_latency_seconds",
            "Time from arrival to the last output token.",
            ["model"],
            buckets=_E2E_BUCKETS,
            registry=reg,
        )
        self.prompt_tokens = Counter(
            f"{PREFIX}_prompt_tokens",
            "Prompt tokens of admitted requests.",
            ["model"],
            registry=reg,
        )
        self.generation_tokens = Counter(
            f"{PREFIX}_generation_tokens", "Output tokens generated.", ["model"], registry=reg
        )
        self.finished = Counter(
            f"{PREFIX}_requests_finished",
            "Requests finished, by finish reason.",
            ["model", "finish_reason"],
            registry=reg,
        )
        self.rejected = Counter(
            f"{PREFIX}_requests_rejected",
            "Requests answered with an error, by HTTP status.",
            ["model", "status"],
            registry=reg,
        )
        reg.register(_EngineCollector(stats, model))
        self.energy: Any = None  # cloud_server.energy.EnergyAccounting, set by create_app

    def request_timer(self, arrival: float | None = None) -> RequestTimer:
        return RequestTimer(self, self._model(), arrival)

    def record_rejection(self, status: int) -> None:
        self.rejected.labels(self._model(), str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTimer:
    """Observes one request's token timings; call ``on_tokens`` per output, ``on_finish`` once."""

    def __init__(self, metrics: ServerMetrics, model: str, arrival: float | None = None) -> None:
        self._m = metrics
        self._model = model
        # arrival: when the server took the request up (perf_counter), before its tokenization
        self.arrival = time.perf_counter() if arrival is None else arrival
        self._last: float | None = None
        self._num_tokens = 0
        self._prompt_recorded = False

    def on_tokens(self, num_tokens: int, num_prompt_tokens: int) -> None:
        if not self._prompt_recorded:
            self._m.prompt_tokens.labels(self._model).inc(num_prompt_tokens)
            self._prompt_recorded = True
        if num_tokens <= 0:
            return
        now = time.perf_counter()
        if self._last is None:
            self._m.ttft.labels(self._model).observe(now - self.arrival)
            num_gaps = num_tokens - 1
        else:
            num_gaps = num_tokens
        if num_gaps > 0 and self._last is not None:
            # Several tokens in one output (a stop string held back text): spread the gap evenly.
            gap = (now - self._last) / num_gaps
            for _ in range(num_gaps):
                self._m.itl.labels(self._model).observe(gap)
        self._last = now
        self._num_tokens += num_tokens
        self._m.generation_tokens.labels(self._model).inc(num_tokens)

    def on_finish(self, finish_reason: str | None) -> None:
        self._m.e2e.labels(self._model).observe(time.perf_counter() - self.arrival)
        self._m.finished.labels(self._model, finish_reason or "abort").inc()
