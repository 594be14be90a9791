"""Fleet state: every replica posts its engine stats here once a second (a small Ray actor).

The front end reads it for ``/metrics`` (the fleet's engine series, summed) and ``/health``
(replicas that posted within the last few seconds). A replica that dies stops posting and drops
out after ``max_age_s``; its restarted successor posts under a new id.
"""

from __future__ import annotations

import time
from typing import Any

# engine.stats() keys that are per-step or peak values: the fleet figure is the largest, not a sum
_MAX_KEYS = {"kv_cache_usage", "last_batch_num_seqs", "last_batch_num_tokens", "max_batch_num_seqs"}


def aggregate_stats(per_replica: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum counters and counts over replicas; take the largest of per-step values."""
    out: dict[str, Any] = {}
    for stats in per_replica:
        for key, value in stats.items():
            if isinstance(value, list) and all(_number(v) for v in value):
                # per-position counters (spec_decode_num_accepted_tokens_per_pos): summed by
                # position, the longest list sets the length
                total = out.get(key, [])
                out[key] = [sum(x[i] for x in (total, value) if i < len(x))
                            for i in range(max(len(total), len(value)))]
                continue
            if not _number(value):
                continue
            if key in _MAX_KEYS:
                out[key] = max(out.get(key, value), value)
            else:
                out[key] = out.get(key, 0) + value
    if per_replica:
        out["num_replicas"] = len(per_replica)
    return out


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class FleetBoard:
    """Plain class; ``ray.remote(FleetBoard)`` makes it the named actor (see ``app.py``)."""

    def __init__(self) -> None:
        self._posts: dict[str, tuple[float, dict[str, Any]]] = {}
        self._notes: dict[str, Any] = {}  # not replicas: the router's own figures

    def note(self, key: str, value: Any) -> None:
        self._notes[key] = value

    def notes(self) -> dict[str, Any]:
        return dict(self._notes)

    def post(self, replica: str, report: dict[str, Any]) -> None:
        self._posts[replica] = (time.monotonic(), report)

    def snapshot(self, max_age_s: float = 3.0) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        for key in [k for k, (t, _) in self._posts.items() if now - t > max_age_s]:
            del self._posts[key]
        return {k: report for k, (_, report) in self._posts.items()}
