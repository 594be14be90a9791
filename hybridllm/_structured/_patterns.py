"""The patterns the grammar writes itself, for ``_regex.compiled``: JSON Schema's ``format``
values, and the JSON numbers within a schema's bounds (``minimum``, ``maximum`` and their exclusive
forms), as JSON writes them.
"""

from __future__ import annotations

# JSON Schema's ``format`` values served, each as the pattern a value of it must match
_DEC_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_FULL_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:(?:[0-5]\d|60)(?:\.\d{1,9})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_FULL_DATE = r"\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])"
_DURATION_TIME = r"T(?:\d+H(?:\d+M)?(?:\d+(?:\.\d+)?S)?|\d+M(?:\d+(?:\.\d+)?S)?|\d+(?:\.\d+)?S)"
FORMATS = {
    "date": f"^{_FULL_DATE}$",  # RFC 3339 full-date
    "time": f"^{_FULL_TIME}$",  # RFC 3339 full-time (with its offset)
    "date-time": f"^{_FULL_DATE}T{_FULL_TIME}$",
    "duration": (
        r"^P(?:(?:\d+Y(?:\d+M)?(?:\d+D)?|\d+M(?:\d+D)?|\d+D)(?:"
        + _DURATION_TIME
        + r")?|"
        + _DURATION_TIME
        + r"|\d+W)$"
    ),  # ISO 8601, as RFC 3339's appendix A
    "uuid": r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
    "email": rf"^[A-Za-z0-9.!#$%&'*+/=?^_`{{|}}~-]{{1,64}}@{_LABEL}(?:\.{_LABEL})+$",
    "hostname": rf"^{_LABEL}(?:\.{_LABEL})*$",
    "ipv4": rf"^{_DEC_OCTET}(?:\.{_DEC_OCTET}){{3}}$",
    # a scheme, then no whitespace and none of the characters RFC 3986 never allows raw
    "uri": r'^[A-Za-z][A-Za-z0-9+.-]*:[^\s"<>\\^`{|}]+$',
}


def integer_range(lo: int | None, hi: int | None) -> str:
    """A pattern of the JSON integers in [lo, hi] (None: no bound), as JSON writes them: no
    leading zeros, no '-0'. Split by sign, then by digit count, then by leading digit, so each
    part is a run of fixed digits, one class and free digits: O(digits) parts a length."""
    parts: list[str] = []
    if hi is None or hi >= 0:
        parts += _natural_range(max(lo, 0) if lo is not None else 0, hi)
    if lo is None or lo < 0:
        # n < 0: '-' and |n| in [max(1, -hi), -lo]
        low_abs = max(1, -hi) if hi is not None else 1
        parts += ["-" + p for p in _natural_range(low_abs, -lo if lo is not None else None)]
    if not parts:
        raise ValueError("no integer lies within the bounds")
    return "^(?:" + "|".join(parts) + ")$"


def _natural_range(a: int, b: int | None) -> list[str]:
    """Patterns for a <= n <= b (n >= 0; b None: no bound)."""
    if b is not None and b < a:
        return []
    parts: list[str] = []
    top_len = len(str(b)) if b is not None else len(str(a))
    for length in range(len(str(a)), top_len + 1):
        first = 10 ** (length - 1) if length > 1 else 0
        last = 10**length - 1
        lo, hi = max(a, first), last if b is None else min(b, last)
        if lo <= hi:
            parts += _same_length(str(lo), str(hi))
    if b is None:  # every number longer than a's digits
        parts.append(f"[1-9]\\d{{{len(str(a))},}}")
    return parts


def _same_length(lo: str, hi: str) -> list[str]:
    """Patterns for the numbers from lo to hi, both written with the same number of digits."""
    if len(lo) == 1:
        return [f"[{lo}-{hi}]" if lo != hi else lo]
    if lo[0] == hi[0]:
        return [lo[0] + p for p in _same_length(lo[1:], hi[1:])]
    rest = len(lo) - 1
    parts: list[str] = []
    start, end = int(lo[0]), int(hi[0])
    if lo[1:] != "0" * rest:  # lo .. lo[0]99..9
        parts += [lo[0] + p for p in _same_length(lo[1:], "9" * rest)]
        start += 1
    tail_full = hi[1:] == "9" * rest
    if not tail_full:
        end -= 1
    if start <= end:  # whole decades: a leading digit, then any digits
        parts.append((f"[{start}-{end}]" if start != end else str(start)) + f"\\d{{{rest}}}")
    if not tail_full:  # hi[0]00..0 .. hi
        parts += [hi[0] + p for p in _same_length("0" * rest, hi[1:])]
    return parts


def number_range(lo: tuple[int, bool] | None, hi: tuple[int, bool] | None) -> str:
    """A pattern of the JSON numbers within whole-number bounds, each (bound, inclusive) or None,
    written as JSON writes them but without an exponent (the bounds are read off the digits):
    an integer part, then perhaps a fraction. Negative numbers are '-' and y = -x > 0, so
    both sides are one rule on a positive part y with its own bounds."""
    parts: list[str] = []
    if hi is None or hi[0] > 0 or (hi[0] == 0 and hi[1]):  # x >= 0
        low = (0, True) if lo is None or lo[0] < 0 else lo
        parts += _unsigned_range(low, hi)
    if lo is None or lo[0] < 0:  # x < 0: y = -x, y > 0
        low = (-hi[0], hi[1]) if hi is not None and hi[0] < 0 else (0, False)
        high = (-lo[0], lo[1]) if lo is not None else None
        parts += ["-" + p for p in _unsigned_range(low, high)]
    if not parts:
        raise ValueError("no number lies within the bounds")
    return "^(?:" + "|".join(parts) + ")$"


_ANY_FRACTION = r"(?:\.\d+)?"
_ZERO_FRACTION = r"(?:\.0+)?"
_SOME_FRACTION = r"\.\d*[1-9]\d*"


def _unsigned_range(low: tuple[int, bool], high: tuple[int, bool] | None) -> list[str]:
    """Patterns for l <(=) y <(=) h, y >= 0 an integer part and an optional fraction: the whole
    parts strictly inside take any fraction, a bound's own whole part only the fractions that
    keep y on the right side of it (none past h, a non-zero one past an exclusive l)."""
    lo, lo_in = low
    first_any = lo if lo_in else lo + 1  # whole parts from here take any fraction
    last_any = None if high is None else high[0] - 1  # ... up to here
    parts: list[str] = []

    def whole(a: int, b: int | None) -> str:
        return "(?:" + "|".join(_natural_range(a, b)) + ")"

    if last_any is None or first_any <= last_any:
        parts.append(whole(first_any, last_any) + _ANY_FRACTION)
    if not lo_in and (high is None or lo < high[0]):  # lo itself, with a fraction above zero
        parts.append(whole(lo, lo) + _SOME_FRACTION)
    if high is not None and high[1] and (high[0] > lo or (high[0] == lo and lo_in)):
        parts.append(whole(high[0], high[0]) + _ZERO_FRACTION)  # h itself, no fraction past it
    return parts
