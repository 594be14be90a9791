"""A cloud budget: at most so many cloud calls, tokens or US dollars per sliding hour and day.

A ledger the client's pipeline owns, kept by reserve-then-settle so that it holds under
concurrency: the plan step ``reserve(tokens)``s room for one call and its estimated tokens in one
step under the lock (or learns why there is none), and once the request ends it ``settle``s the
reservation with the tokens the call really used, or ``release``s it when no cloud call was made
(the cloud failed before answering, the device answered, an error, a request cancelled before its
call: one cancelled while it ran counts its prompt, since the cloud read it). A
reservation counts as used while it is held, so with one call left, of N concurrent requests one
goes to the cloud. Windows slide (the last 3600 s / 86400 s), so a spent budget comes back
gradually rather than at midnight. A dollar limit is a token limit at ``price_per_1k_tokens``
(the client's one price for prompt and completion tokens), reported in dollars.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count

from .._durations import duration
from .._exceptions import ConfigError
from .._types import is_integer, is_real
from ..backends.circuit import awake_clock

HOUR = 3600.0
DAY = 86400.0


@dataclass(frozen=True)
class Reservation:
    """Room held for one cloud call: the call and ``tokens`` (its estimate) count as used until the
    reservation is settled or released."""

    id: int
    tokens: int
    # the Budget that made it (its opaque key): each budget numbers its reservations from 0, so
    # one settled on another budget freed that budget's hold of the same id; now it is refused
    owner: object = field(default=None, repr=False)


@dataclass
class Budget:
    max_cloud_calls_per_hour: int | None = None
    max_cloud_calls_per_day: int | None = None
    max_cloud_tokens_per_hour: int | None = None
    max_cloud_tokens_per_day: int | None = None
    max_cloud_usd_per_hour: float | None = None
    max_cloud_usd_per_day: float | None = None
    price_per_1k_tokens: float = 0.002  # USD a 1,000 tokens, what the dollar limits count in
    # the windows count a laptop's sleep too: on time.monotonic a day's budget spent at night stayed
    # spent for most of the next day (Linux and macOS stop it while the machine sleeps)
    clock: Callable[[], float] = awake_clock
    _events: deque[tuple[float, int]] = field(default_factory=deque, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    # reservations held now: id -> estimated tokens (in flight: inside every window)
    _held: dict[int, int] = field(default_factory=dict, init=False, repr=False)
    _ids: count = field(default_factory=count, init=False, repr=False)
    _key: object = field(default_factory=object, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("max_cloud_calls_per_hour", "max_cloud_calls_per_day",
                     "max_cloud_tokens_per_hour", "max_cloud_tokens_per_day"):
            value = getattr(self, name)
            if value is None:
                continue
            # is_integer: numpy's int64 (a limit read with numpy or pandas) was refused as
            # "not a non-negative integer"; kept as a Python int
            if not is_integer(value) or value < 0:
                raise ConfigError(
                    f"Budget {name} must be a non-negative integer or None, got {value!r}."
                )
            setattr(self, name, int(value))
        price = self.price_per_1k_tokens
        # finite: at an infinite price a call of 0 tokens costs 0 * inf = NaN dollars, never spent
        if not is_real(price) or not 0 <= price < math.inf:
            raise ConfigError(f"price_per_1k_tokens must be a finite number >= 0, got {price!r}.")
        self.price_per_1k_tokens = _plain(price)
        for name in ("max_cloud_usd_per_hour", "max_cloud_usd_per_day"):
            value = getattr(self, name)
            if value is None:
                continue
            if not is_real(value) or not 0 <= value < math.inf:
                raise ConfigError(f"Budget {name} must be a non-negative number of dollars or "
                                  f"None, got {value!r}.")
            setattr(self, name, _plain(value))
            if not price > 0:
                raise ConfigError(f"Budget {name} counts dollars at price_per_1k_tokens, which is "
                                  f"{price!r}: set the price the cloud charges a 1,000 tokens.")

    @property
    def is_limited(self) -> bool:
        limits = (self.max_cloud_calls_per_hour, self.max_cloud_calls_per_day,
                  self.max_cloud_tokens_per_hour, self.max_cloud_tokens_per_day,
                  self.max_cloud_usd_per_hour, self.max_cloud_usd_per_day)
        return any(v is not None for v in limits)

    def record(self, tokens: int = 0) -> None:
        """Count one cloud call that used ``tokens`` (prompt plus completion), without a
        reservation (a call made outside the pipeline's plan step)."""
        _check_tokens(tokens)
        with self._lock:
            now = self.clock()
            self._events.append((now, _whole(tokens)))
            self._trim(now)

    def reserve(self, tokens: int = 0) -> tuple[Reservation | None, str | None]:
        """Hold room for one cloud call of about ``tokens`` (prompt plus completion, estimated):
        ``(reservation, None)``, or ``(None, why)`` when the budget is spent (nothing held). The
        check and the hold are one step under the lock, so concurrent callers cannot all pass."""
        _check_tokens(tokens)
        with self._lock:
            now = self.clock()
            self._trim(now)
            spent = self._spent(now)
            if spent:
                return None, spent
            held = Reservation(next(self._ids), _whole(tokens), self._key)
            self._held[held.id] = held.tokens
            return held, None

    def settle(self, reservation: Reservation, tokens: int) -> None:
        """The reserved call was made and used ``tokens``: the estimate gives way to the count.
        Only a reservation still held counts: settling it again, or after its release, is
        harmless (a retried or duplicated settle would count the call twice). A ``tokens`` that
        is not a count raises ConfigError and counts nothing, but still frees the hold: kept, it
        counted as a call in flight for good (with a limit of one call an hour, the cloud stayed
        closed until the caller settled or released it)."""
        self._check_own(reservation)
        try:
            _check_tokens(tokens)
        except ConfigError as e:
            with self._lock:
                held = self._held.pop(reservation.id, None) is not None
            if held:
                raise ConfigError(f"{e} The reservation is released; the call is not counted.") from None
            raise
        with self._lock:
            if self._held.pop(reservation.id, None) is None:
                return
            now = self.clock()
            self._events.append((now, _whole(tokens)))
            self._trim(now)

    def release(self, reservation: Reservation) -> None:
        """No cloud call was made after all: free the room. Releasing twice, or after a settle, is
        harmless."""
        self._check_own(reservation)
        with self._lock:
            self._held.pop(reservation.id, None)

    def _check_own(self, reservation: Reservation) -> None:
        """Refuse what is not a reservation this budget made (None, another budget's), whose id
        would free another hold of this one's; a clear error, not an AttributeError."""
        if isinstance(reservation, Reservation) and reservation.owner is self._key:
            return
        if reservation is None:
            raise ConfigError("reservation is None: reserve() made none (it returns (None, why) when "
                              "the budget is spent), so there is nothing to settle or release.")
        raise ConfigError(f"{reservation!r} is not a reservation of this Budget: settle or release "
                          f"it on the Budget whose reserve() made it.")

    def _trim(self, now: float) -> None:
        while self._events and self._events[0][0] <= now - DAY:
            self._events.popleft()

    def usage(self) -> dict[str, int]:
        """Calls and tokens in the last hour and the last day (settled calls; ``calls_in_flight``
        are the reservations held now)."""
        with self._lock:
            now = self.clock()
            self._trim(now)
            hour = [t for ts, t in self._events if ts > now - HOUR]
            return {
                "calls_hour": len(hour),
                "calls_day": len(self._events),
                "tokens_hour": sum(hour),
                "tokens_day": sum(t for _, t in self._events),
                "calls_in_flight": len(self._held),
            }

    def exhausted(self) -> str | None:
        """Why the cloud budget is spent (a reason string that says when there is room again), or
        None while there is room. Reservations held count as used."""
        if not self.is_limited:
            return None
        with self._lock:
            now = self.clock()
            self._trim(now)
            return self._spent(now)

    def retry_after_s(self) -> float | None:
        """Seconds until the next call may fit under every limit (``hybridllm serve``'s
        Retry-After for a spent budget): 0.0 when one fits now, None when none ever will (a limit
        of 0). A reservation held counts as a call settled now, with no tokens: its estimate is
        the most it can use (``max_tokens`` of answer), and its own count, known once it ends in
        a few seconds, is usually far less, so the soonest time is given rather than one a day
        late; a retry then learns the later time if the calls in flight used more."""
        with self._lock:
            now = self.clock()
            self._trim(now)
            # oldest first: the settled calls, then the ones in flight
            events = list(self._events) + [(now, 0) for _ in self._held]
            wait = 0.0
            for window, span, unit, limit, _ in self._limits(events, now):
                # every spent limit must have room again: the longest wait of them
                one = _until_room(window, span, unit, limit, _used(window, unit), now)
                if one is None:
                    return None
                wait = max(wait, one)
            return wait

    def _limits(self, events: list[tuple[float, int]],
                now: float) -> list[tuple[list[tuple[float, int]], float, float, float, str]]:
        """(the window's calls, its span, what a token counts (0: the limit counts calls), the
        limit, its label) of each limit that is set; ``events`` oldest first."""
        hour = [(ts, t) for ts, t in events if ts > now - HOUR]
        usd = self.price_per_1k_tokens / 1000  # a token's dollars
        checks = (
            (hour, HOUR, 0.0, self.max_cloud_calls_per_hour, "cloud calls this hour"),
            (events, DAY, 0.0, self.max_cloud_calls_per_day, "cloud calls today"),
            (hour, HOUR, 1.0, self.max_cloud_tokens_per_hour, "cloud tokens this hour"),
            (events, DAY, 1.0, self.max_cloud_tokens_per_day, "cloud tokens today"),
            (hour, HOUR, usd, self.max_cloud_usd_per_hour, "cloud spend this hour"),
            (events, DAY, usd, self.max_cloud_usd_per_day, "cloud spend today"),
        )
        return [(w, span, unit, limit, label) for w, span, unit, limit, label in checks if limit is not None]

    def _spent(self, now: float) -> str | None:  # under the lock
        if not self.is_limited:
            return None
        held_calls, held_tokens = len(self._held), sum(self._held.values())
        spent: list[tuple[float, str]] = []  # (seconds until room, reason) of each spent limit
        for window, span, unit, limit, label in self._limits(list(self._events), now):
            # a call may start while what is used (settled plus held) is under the limit; the
            # last one that starts may go past it by its own size
            used = _used(window, unit) + (held_tokens * unit if unit else held_calls)
            if not _under(used, limit):
                flight = f" ({held_calls} in flight)" if held_calls else ""
                wait = _until_room(window, span, unit, limit, used, now)
                when = "" if wait is None else f" (sliding window: room again in {duration(wait)})"
                if not limit:  # never room: say which setting closes the cloud
                    when = f" ({_SETTING[label]} is 0: no cloud calls until it is raised)"
                dollars = label.startswith("cloud spend")
                d = _decimals(limit)  # as many as the limit has: $0.001 read "$0.00/$0.00"
                amount = f"${used:.{d}f}/${limit:.{d}f}" if dollars else f"{round(used)}/{round(limit)}"
                if unit and held_tokens:
                    # the estimates held are not spent: say how much of the total they are, or a
                    # request with a huge max_tokens read "budget spent" with nothing spent
                    held = held_tokens * unit
                    flight += (f", ${held:.{d}f}" if dollars else f", {round(held)}") + (
                        " of it reserved for the calls in flight (each its prompt plus max_tokens)"
                        " until they end")
                spent.append((math.inf if wait is None else wait, f"{amount} {label}{flight}{when}"))
        if not spent:
            return None
        # a call needs room under every limit, so the reason is the limit with the longest wait
        # (the time it gives is when a call fits again); any other spent limit is named after it
        spent.sort(key=lambda item: -item[0])
        also = "".join(f"; also {reason}" for _, reason in spent[1:])
        return f"budget spent: {spent[0][1]}{also}"


_SETTING = {  # each limit's label -> the setting that sets it
    "cloud calls this hour": "max_cloud_calls_per_hour", "cloud calls today": "max_cloud_calls_per_day",
    "cloud tokens this hour": "max_cloud_tokens_per_hour", "cloud tokens today": "max_cloud_tokens_per_day",
    "cloud spend this hour": "max_cloud_usd_per_hour", "cloud spend today": "max_cloud_usd_per_day",
}


def _decimals(limit: float) -> int:
    """Decimals that show a dollar limit as it was set: 2 (cents), more (up to 5) for a limit
    under a cent or between cents; one that 5 decimals do not hold (1/3): in cents, or 6 under a cent."""
    for d in range(2, 6):
        if math.isclose(round(limit, d), limit, rel_tol=1e-9, abs_tol=1e-12):
            return d
    return 2 if limit >= 0.01 else 6


def _plain(value: float) -> float:
    """A numpy number as a Python float of the same value (numpy's float32 was refused); a
    Python int or float as it is."""
    return value if type(value) in (int, float) else float(value)


MAX_TOKENS = 2.0**63  # no call's count comes near; a larger one overflowed float() in every check


def _check_tokens(tokens: int) -> None:
    # NaN, inf, None or a string would fail later in int() or "<" with an error that names no
    # argument; 10**400 was counted, then every check of the limits raised
    # OverflowError (int too large to convert to float) for the rest of the day
    if not is_real(tokens) or not 0 <= tokens < MAX_TOKENS:
        raise ConfigError(f"tokens must be a number >= 0 (prompt plus completion tokens, under "
                          f"2**63), got {tokens!r}.")


def _whole(tokens: float) -> int:
    """A token count as a whole number, a fraction rounded up: a cloud bills whole tokens, and an
    estimate or a custom cloud's count of 2.9 counted as 2 (int() truncates), under the limit."""
    return int(tokens) if is_integer(tokens) else math.ceil(tokens)  # ints exact past 2**53


def _used(window: list[tuple[float, int]], unit: float) -> float:
    """Calls (``unit`` 0), tokens (1) or dollars (a token's price) that ``window`` used."""
    return sum(t for _, t in window) * unit if unit else len(window)


def _until_room(window: list[tuple[float, int]], span: float, unit: float, limit: float, used: float,
                now: float) -> float | None:
    """Seconds until ``used`` is under ``limit`` as the oldest calls of ``window`` (oldest first)
    leave it, each ``span`` after it was made: 0.0 if it is now, None if never (a limit of 0)."""
    if _under(used, limit):
        return 0.0
    for ts, t in window:
        used -= t * unit if unit else 1
        if _under(used, limit):
            return max(0.0, ts + span - now)
    return None


def _under(used: float, limit: float) -> bool:
    """Whether ``used`` leaves room under ``limit``. Dollars are float products, a hair off the
    sum they stand for (25,000 tokens at $0.002 a 1,000 come to 0.049999999999999996), so a
    total within a rounding error of the limit has reached it; counts of calls and tokens are
    whole numbers, far apart at the relative 1e-12 below (up to a trillion tokens)."""
    return used < limit and not math.isclose(used, limit, rel_tol=1e-12)
