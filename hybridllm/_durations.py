"""Durations for people, one formatter for the whole library: a progress bar's time left, the wait
until a budget window has room again, how long ago a cloud refused a request field."""

from __future__ import annotations

import math

# each unit and its seconds, largest first; a duration shows its largest unit and the next one
_UNITS = (("day", 86_400), ("h", 3_600), ("min", 60), ("s", 1))


def duration(seconds: float) -> str:
    """``seconds`` as people read it, in its largest unit and the next: "45 s", "2 min 05 s",
    "3 h 07 min", "1 day", "2 days 4 h" (a next unit of 0 is left out); infinite, NaN or past a float's range
    (``10**400``), "an unknown time".

    Rounded to the precision shown (1 h 59 min 59.6 s is "2 h", not "1 h 59 min" nor "60 min");
    a time above 0 but under a second reads "1 s" (a wait is never "0 s"); 0 or less, "0 s".
    """
    try:
        finite = math.isfinite(seconds)
    except OverflowError:  # an int past a float's range (10**400): as 1e400, which reads as inf
        finite = False
    if not finite:
        return "an unknown time"
    if seconds <= 0:
        return "0 s"
    s = max(1, math.floor(seconds + 0.5))  # the nearest whole second, halves up
    i = _unit(s)
    s = _round_to(s, _step(i))
    i = _unit(s)  # rounding up may carry into the next unit (59 min 40 s -> 1 h)
    s = _round_to(s, _step(i))
    name, size = _UNITS[i]
    major, minor = divmod(s, size)
    text = f"{major} {name}s" if name == "day" and major != 1 else f"{major} {name}"
    if minor and i + 1 < len(_UNITS):
        sub, step = _UNITS[i + 1]
        # minutes and seconds two digits wide ("2 min 05 s"), as on a clock; hours as they are
        count = f"{minor // step}" if sub == "h" else f"{minor // step:02d}"
        text += f" {count} {sub}"
    return text


def _unit(s: int) -> int:
    """The index of the largest unit that ``s`` seconds fill at least once."""
    return next(i for i, (_, size) in enumerate(_UNITS) if s >= size or size == 1)


def _step(i: int) -> int:
    """The seconds of the unit shown after unit ``i`` (the precision of a duration in unit ``i``)."""
    return _UNITS[i + 1][1] if i + 1 < len(_UNITS) else 1


def _round_to(s: int, step: int) -> int:
    # to the nearest multiple of step, halves up
    return (s + step // 2) // step * step
