"""A cloud budget: at most so many cloud calls or tokens per sliding hour and day.

A ledger the client's pipeline owns: its plan step asks ``exhausted()`` before sending a request
to the cloud (or escalating a cascade), and its record step writes every cloud call with
``record(tokens)``, a broken one included (its tokens estimated). Windows slide (the last
3600 s / 86400 s), so a spent budget comes back gradually rather than at midnight.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .._exceptions import ConfigError

HOUR = 3600.0
DAY = 86400.0


@dataclass
class Budget:
    max_cloud_calls_per_hour: int | None = None
    max_cloud_calls_per_day: int | None = None
    max_cloud_tokens_per_hour: int | None = None
    max_cloud_tokens_per_day: int | None = None
    clock: Callable[[], float] = time.monotonic
    _events: deque[tuple[float, int]] = field(default_factory=deque, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("max_cloud_calls_per_hour", "max_cloud_calls_per_day",
                     "max_cloud_tokens_per_hour", "max_cloud_tokens_per_day"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(
                    f"Budget {name} must be a non-negative integer or None, got {value!r}."
                )

    @property
    def is_limited(self) -> bool:
        limits = (self.max_cloud_calls_per_hour, self.max_cloud_calls_per_day,
                  self.max_cloud_tokens_per_hour, self.max_cloud_tokens_per_day)
        return any(v is not None for v in limits)

    def record(self, tokens: int = 0) -> None:
        """Count one cloud call that used ``tokens`` (prompt plus completion)."""
        if tokens < 0:
            raise ConfigError(f"tokens must be >= 0, got {tokens}.")
        with self._lock:
            self._events.append((self.clock(), int(tokens)))
            self._trim(self.clock())

    def _trim(self, now: float) -> None:
        while self._events and self._events[0][0] <= now - DAY:
            self._events.popleft()

    def usage(self) -> dict[str, int]:
        """Calls and tokens in the last hour and the last day."""
        with self._lock:
            now = self.clock()
            self._trim(now)
            hour = [t for ts, t in self._events if ts > now - HOUR]
            return {
                "calls_hour": len(hour),
                "calls_day": len(self._events),
                "tokens_hour": sum(hour),
                "tokens_day": sum(t for _, t in self._events),
            }

    def exhausted(self) -> str | None:
        """Why the cloud budget is spent (a reason string that says when there is room again), or
        None while there is room."""
        if not self.is_limited:
            return None
        with self._lock:
            now = self.clock()
            self._trim(now)
            events = list(self._events)
        hour = [(ts, t) for ts, t in events if ts > now - HOUR]
        checks = (
            (hour, HOUR, False, self.max_cloud_calls_per_hour, "cloud calls this hour"),
            (events, DAY, False, self.max_cloud_calls_per_day, "cloud calls today"),
            (hour, HOUR, True, self.max_cloud_tokens_per_hour, "cloud tokens this hour"),
            (events, DAY, True, self.max_cloud_tokens_per_day, "cloud tokens today"),
        )
        for window, span, tokens, limit, label in checks:
            if limit is None:
                continue
            used = sum(t for _, t in window) if tokens else len(window)
            if used >= limit:
                when = _room_again(window, span, tokens, limit, used, now)
                return f"budget spent: {used}/{limit} {label}{when}"
        return None


def _room_again(window: list[tuple[float, int]], span: float, tokens: bool, limit: int, used: int,
                now: float) -> str:
    """When enough of the oldest calls leave the sliding window for the next call to fit."""
    for ts, t in window:  # oldest first
        used -= t if tokens else 1
        if used < limit:
            wait = max(0.0, ts + span - now)
            return f" (sliding window: room again in {_duration(wait)})"
    return ""  # a limit of 0: never


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{max(1, round(seconds))} s"
    if seconds < 3600:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"
