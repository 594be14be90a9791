"""bench.cache's call meters: a method wrapped on its instance to time or count each call."""

from __future__ import annotations

import time
from typing import Any


def _time_calls(obj: Any, name: str) -> list[float]:
    """Wrap ``obj.name`` (on the instance) so that each call's seconds are appended to the list
    returned; ``delattr(obj, name)`` restores the method."""
    spent: list[float] = []
    setattr(obj, name, _timed(getattr(obj, name), spent))
    return spent


def _count_calls(obj: Any, name: str, count: Any) -> list[int]:
    """Wrap ``obj.name`` (on the instance) so that ``count(args)`` of each call is appended to the
    list returned; ``delattr(obj, name)`` restores the method."""
    seen: list[int] = []
    method = getattr(obj, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        seen.append(count(args))
        return method(*args, **kwargs)

    setattr(obj, name, counted)
    return seen


def _timed(method: Any, spent: list[float]) -> Any:
    """``method``, appending each call's seconds to ``spent``."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)

    return timed
