"""Fleet state: every replica posts its engine stats here once a second (a small Ray actor).

The front end reads it for ``/metrics`` (the fleet's engine series, summed) and ``/health``
(replicas that posted within the last few seconds). A replica that dies stops posting and drops
out after ``max_age_s``; its restarted successor posts under a new id.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from typing import Any

# engine.stats() keys that are per-step or peak values: the fleet figure is the largest, not a sum
_MAX_KEYS = {"kv_cache_usage", "last_batch_num_seqs", "last_batch_num_tokens", "max_batch_num_seqs"}
# engine.stats() keys that /metrics exports as Prometheus counters (cloud_server/api/metrics.py):
# a replica that leaves the fleet keeps its share of them, or the fleet's totals would go down
COUNTER_KEYS = frozenset({
    "prefix_cache_queries", "prefix_cache_hits", "num_preemptions", "steps", "spec_decode_num_drafts",
    "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
    "spec_decode_num_accepted_tokens_per_pos",
})


# engine.stats() keys holding a list, summed by position (/metrics exports them per position,
# cloud_server/api/metrics.py); every other key is a number
_LIST_KEYS = frozenset({"spec_decode_num_accepted_tokens_per_pos"})


def aggregate_stats(per_replica: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum counters and counts over replicas; take the largest of per-step values. A value of
    the wrong kind for its key (a list where a number belongs, or the reverse: replicas of two
    versions in a rolling upgrade) is left out; the key's other values still count."""
    out: dict[str, Any] = {}
    for stats in per_replica:
        for key, value in stats.items():
            if isinstance(value, list) != (key in _LIST_KEYS):
                continue  # the kind is the key's, not the first replica's: the same in any order
            if isinstance(value, list) and all(finite_number(v) for v in value):
                # per-position counters (spec_decode_num_accepted_tokens_per_pos): summed by
                # position, the longest list sets the length
                total = out.get(key, [])
                out[key] = [sum(x[i] for x in (total, value) if i < len(x))
                            for i in range(max(len(total), len(value)))]
                continue
            if not finite_number(value):  # a NaN would make the fleet's sum NaN
                continue
            if key in _MAX_KEYS:
                out[key] = max(out.get(key, value), value)
            else:
                out[key] = out.get(key, 0) + value
    if per_replica:
        out["num_replicas"] = len(per_replica)
    return out


def finite_number(value: Any) -> bool:
    """A real int or float, not a bool, not NaN or infinite (a figure a replica may report); an
    int too large for a float (past 1e308) is none either: sums and weights of it would raise."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


class FleetCounters:
    """The counters of replicas that left the fleet (died, scaled away, or fell silent), added to
    the live replicas' sums so that a fleet total never goes down (Prometheus reads a counter that
    goes down as a restart). A replica that was only late and posts again counts live again."""

    def __init__(self, max_remembered: int = 1024) -> None:
        self.max_remembered = max_remembered
        self._live: dict[str, dict[str, Any]] = {}  # replica -> its counters, as last seen
        self._left: OrderedDict[str, dict[str, Any]] = OrderedDict()  # replica -> its last counters
        self._forgotten: dict[str, Any] = {}  # sums of the replicas too long gone to remember

    def update(self, fleet: dict[str, dict[str, Any]]) -> None:
        """``fleet``: the board's snapshot (replica -> its post), the replicas live now."""
        for replica in [r for r in self._live if r not in fleet]:
            self._left[replica] = self._live.pop(replica)
        for replica, post in fleet.items():
            self._left.pop(replica, None)
            self._live[replica] = {k: v for k, v in post.get("stats", {}).items() if k in COUNTER_KEYS}
        while len(self._left) > self.max_remembered:  # bounded: fold the oldest into one sum
            self._forgotten = aggregate_stats([self._forgotten, self._left.popitem(last=False)[1]])
            self._forgotten.pop("num_replicas", None)

    def stats(self, fleet: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The live replicas' stats summed (``aggregate_stats``), plus the gone ones' counters."""
        # the gone replicas' entries hold counters only: the gauges are the live replicas' alone
        out = aggregate_stats(
            [*(post.get("stats", {}) for post in fleet.values()), self._forgotten, *self._left.values()]
        )
        out.pop("num_replicas", None)
        if fleet:
            out["num_replicas"] = len(fleet)
        return out


def board_lost(exc: BaseException | None) -> bool:
    """``exc`` says the board's actor died or cannot be reached (Ray's ``RayActorError``:
    ``ActorDiedError``, ``ActorUnavailableError``): its handle is no use any more, the board is
    got again by name (a detached actor that died is not restarted; its name is free again)."""
    if exc is None:
        return False
    try:
        from ray.exceptions import RayActorError  # lazily: this module must not import Ray
    except ImportError:
        return False
    return isinstance(exc, RayActorError)


def watch_sent(ref: Any) -> Any:
    """The future of a fire-and-forget call to the board (``ObjectRef.future()``), to learn on
    the next call whether it failed; None where there is nothing to watch."""
    future = getattr(ref, "future", None)
    return future() if callable(future) else None


def sent_to_lost_board(sent: Any) -> bool:
    """A fire-and-forget call's future (``ObjectRef.future()``) that failed as the board died."""
    return sent is not None and sent.done() and not sent.cancelled() and board_lost(sent.exception())


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
