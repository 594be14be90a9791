"""A circuit breaker per cloud endpoint, and token-aware balancing across endpoints.

closed --(threshold consecutive failures, or one trip())--> open --(cooldown elapsed)--> half-open
half-open lets exactly one probe through: success closes the circuit (a streamed probe's first
token, cloud_retry), failure opens it again.
While open, calls fail fast (the client answers on the device instead of waiting on timeouts).

Each failed probe doubles the cooldown, up to ``max_cooldown_s`` (5 minutes by default), and a
success brings it back to ``cooldown_s``: an endpoint that stays down (a laptop offline for hours,
each probe one connect timeout) is probed ever more rarely instead of every ``cooldown_s`` for ever.

``allow()`` hands each request it admits a :class:`Ticket`, which the caller passes back with the
outcome: while a probe is out, its ticket alone decides. A request admitted while the circuit was
closed that ends then changes nothing: its giving up does not free the probe slot (a second probe
at once), its failure is not a failed probe (the cooldown doubled).

Each opening waits a jittered share of that cooldown, drawn anew (``JITTER_LOW``): clients whose
circuits opened at the same outage do not all probe the recovering endpoint at the same moment.
"""

from __future__ import annotations

import math
import random
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .._exceptions import ConfigError
from .._masking import public_value

MAX_COOLDOWN_S = 300.0  # the longest wait between probes of an endpoint that stays down
# each opening waits cooldown_s * u, u uniform in [JITTER_LOW, 1]: processes that opened together
# spread their probes over half the cooldown (not full jitter from 0: a down endpoint still gets at
# least half the wait); the doubling and the cap stay on the nominal cooldown_s, never exceeded
JITTER_LOW = 0.5


def _sleep_counting_clock_id() -> int | None:
    """The clock that keeps counting while the machine sleeps and that no one sets: Linux's
    CLOCK_BOOTTIME, macOS's CLOCK_MONOTONIC; None where there is neither (time.monotonic)."""
    clock_id = getattr(time, "CLOCK_BOOTTIME", None)
    if clock_id is None and sys.platform == "darwin":
        clock_id = getattr(time, "CLOCK_MONOTONIC", None)
    try:
        if clock_id is not None:
            time.clock_gettime(clock_id)
    except OSError:  # a kernel that lacks it
        clock_id = None
    return clock_id


_CLOCK_ID = _sleep_counting_clock_id()


def awake_clock() -> float:
    """Seconds, for the budget's windows and the circuit's cooldowns: like time.monotonic (a change
    of the system clock does not move it) but it counts a laptop's sleep, which time.monotonic does
    not on Linux and macOS; a per-hour budget spent before an hour's sleep has room on waking."""
    return time.monotonic() if _CLOCK_ID is None else time.clock_gettime(_CLOCK_ID)


def check_setting(name: str, value: object, rule: str) -> None:
    """Refuse a number of the cloud client that cannot work, with a :class:`ConfigError` naming it
    as ``name``: the one rule for the settings (``cloud_breaker_cooldown_s``) and the constructors
    (``breaker_cooldown_s``), so both accept and refuse the same values. ``rule``:

    - "seconds>0": a finite number > 0 (a timeout of 0 failed every call; inf or NaN never ends);
    - "seconds>0|None": > 0 or None (no bound; inf is none either);
    - "seconds>=0": a finite number >= 0 (a cooldown, a backoff: 0 is at once);
    - "count>=1", "count>=0": a whole number (a threshold, a number of retries).

    A bool (True is 1 to Python) or a string ("10") is refused, never taken as a number."""
    wanted = {
        "seconds>0": "a positive number (of seconds, finite)",
        "seconds>0|None": "a positive number (of seconds) or None",
        "seconds>=0": "a number >= 0 (of seconds, finite)",
        "count>=1": "at least 1 (a whole number)",
        "count>=0": ">= 0 (a whole number)",
    }[rule]
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        ok = value is None and rule == "seconds>0|None"
    elif rule.startswith("count"):
        ok = isinstance(value, int) and value >= int(rule[-1])
    else:  # seconds: NaN fails every comparison; inf is "no bound" where None is
        ok = (0 <= value < math.inf if rule == "seconds>=0" else value > 0 and
              (value < math.inf or rule == "seconds>0|None"))
        try:  # an int past a float's range (10**400) passed and failed each call (OverflowError)
            float(value)
        except OverflowError:
            ok, value = False, "a number past a float's range"
    if not ok:
        raise ConfigError(f"{name} must be {wanted}, got {value!r}.")


def check_url(name: str, url: object) -> None:
    """Refuse a cloud URL that no request can go to, with a :class:`ConfigError` naming it as
    ``name`` (``cloud_url``, or the constructor's ``base_url``). Before, only its scheme was
    checked: a port out of range, a broken IPv6 address or no host passed the settings and failed
    each request with a traceback (httpx's InvalidURL, a ValueError) or a misleading "cannot reach"."""
    from urllib.parse import urlsplit


    shown = public_value(url)  # a user:password@ in it as ***@: errors are printed and logged
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError(f"{name} must start with http:// or https://, got {shown!r}.")
    # two URLs in one ("https://a,https://b", one item of a list): a host "a,https" that never resolves
    if re.search(r",\s*https?://", url):
        raise ConfigError(f"{name} holds several URLs joined by commas, got {shown!r}: give each "
                          "as an item of a list (a string or the environment variable is split on commas).")
    # a space or a control character is never part of a URL: httpx sent "x.example " as the host
    # "x.example%20" (which never resolves: "cannot be reached") and refused a tab at each request
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ConfigError(f"{name} has a space or a control character in it, got {shown!r}.")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  # raises ValueError for a port that is not a number in 0-65535
    except ValueError as exc:
        raise ConfigError(f"{name} is not a valid URL ({exc}), got {shown!r}.") from None
    if not parts.hostname:
        raise ConfigError(f"{name} has no host, got {shown!r}.")
    if "," in parts.hostname:  # no host name has one
        raise ConfigError(f"{name} has a comma in its host, got {shown!r}.")


class Ticket:
    """A request's admission by ``allow()``: ``probe`` when it is the half-open circuit's one probe."""

    __slots__ = ("probe",)

    def __init__(self, probe: bool) -> None:
        self.probe = probe

    def __repr__(self) -> str:
        return f"Ticket(probe={self.probe})"


class CircuitBreaker:
    def __init__(self, *, threshold: int = 3, cooldown_s: float = 10.0,
                 max_cooldown_s: float = MAX_COOLDOWN_S,
                 clock: Callable[[], float] = awake_clock,
                 rng: Callable[[], float] = random.random) -> None:
        """``rng``: uniform in [0, 1), drawn once per opening for its jitter (tests pin it)."""
        # a NaN or infinite cooldown never elapses (the circuit stayed open for good after its first
        # opening: every answer from the device, silently); a threshold below 1 opened it at once
        check_setting("breaker_threshold", threshold, "count>=1")
        check_setting("breaker_cooldown_s", cooldown_s, "seconds>=0")
        check_setting("breaker_max_cooldown_s", max_cooldown_s, "seconds>=0")
        self.threshold = threshold
        self.base_cooldown_s = cooldown_s
        self.max_cooldown_s = max(cooldown_s, max_cooldown_s)  # never below the configured wait
        self.cooldown_s = cooldown_s  # the wait now: doubled by each failed probe, reset by a success
        self.wait_s = cooldown_s  # this opening's wait before a probe: cooldown_s, jittered
        self._clock = clock
        self._rng = rng
        self._lock = threading.Lock()
        self._failures = 0
        self._opened_at: float | None = None
        self._probe: Ticket | None = None  # the probe out now (half-open), None when none is

    @property
    def _probing(self) -> bool:
        return self._probe is not None

    def _owns(self, ticket: Ticket | None) -> bool:
        """Whether an outcome decides the half-open state: the probe's own, or one given without a
        ticket (a caller that keeps none: the probe out, if any, is taken to be its)."""
        return self._probe is not None and (ticket is None or ticket is self._probe)

    def _stale(self, ticket: Ticket | None) -> bool:
        """Another request's outcome while a probe is out: the half-open state is the probe's to decide."""
        return ticket is not None and self._probe is not None and ticket is not self._probe

    @property
    def state(self) -> str:
        with self._lock:
            return self._state()

    def _state(self) -> str:
        if self._opened_at is None:
            return "closed"
        if self._elapsed() >= self.wait_s:
            return "half-open"
        return "open"

    def _elapsed(self) -> float:
        """Seconds since the circuit opened (it is open). A clock set back re-anchors the opening at
        now: the wait starts again, not kept until the clock catches up (hours, for a day's step)."""
        now = self._clock()
        if now < self._opened_at:  # type: ignore[operator]
            self._opened_at = now
        return now - self._opened_at  # type: ignore[operator]

    def allow(self) -> Ticket | None:
        """May a request go out now? A :class:`Ticket` (truthy) if so, to pass back with its
        outcome; None if not. In half-open state only one probe is admitted."""
        with self._lock:
            state = self._state()
            if state == "closed":
                return Ticket(probe=False)
            if state == "half-open" and not self._probing:
                self._probe = Ticket(probe=True)
                return self._probe
            return None

    def would_allow(self) -> bool:
        """Like allow() but without taking the half-open probe slot."""
        with self._lock:
            state = self._state()
            return state == "closed" or (state == "half-open" and not self._probing)

    def seconds_until_allowed(self) -> float:
        """How long until a request may go out: 0 when closed or a probe is free; the rest of this
        opening's wait when open (when ``_state`` turns half-open); when a probe is out (its verdict
        is not known), the shortest wait a failed probe can bring: the doubled cooldown, capped, at
        its lowest jitter (cooldown_s itself below the cap)."""
        with self._lock:
            if self._opened_at is None:
                return 0.0
            left = self.wait_s - self._elapsed()
            if left > 0:
                return left
            if not self._probing:
                return 0.0
            return JITTER_LOW * min(self.max_cooldown_s, self.cooldown_s * 2)

    def record_success(self, ticket: Ticket | None = None) -> None:
        """An answer came: the endpoint serves, whichever request it was (the circuit closes)."""
        with self._lock:
            self._failures = 0
            self._opened_at = None
            self._probe = None
            self.cooldown_s = self.wait_s = self.base_cooldown_s

    def record_failure(self, ticket: Ticket | None = None) -> None:
        with self._lock:
            if self._stale(ticket):
                return
            self._failures += 1
            if self._owns(ticket) or self._failures >= self.threshold:
                self._open(failed_probe=self._owns(ticket))

    def _open(self, failed_probe: bool) -> None:
        """Open now (the lock is held). A failed probe doubles the wait before the next one:
        cooldown_s * 2^(failed probes in a row), capped at max_cooldown_s; the wait itself is that
        times u, u uniform in [JITTER_LOW, 1] (drawn per opening, so never above the cap)."""
        if failed_probe:
            self.cooldown_s = min(self.max_cooldown_s, self.cooldown_s * 2)
        self.wait_s = self.cooldown_s * (1.0 - (1.0 - JITTER_LOW) * self._rng())
        self._opened_at = self._clock()
        self._probe = None

    def trip(self, ticket: Ticket | None = None) -> None:
        """Open at once, whatever the count: the endpoint cannot serve at all (unreachable, or not
        an OpenAI-compatible API), so repeating the call would only make the caller wait."""
        with self._lock:
            if self._stale(ticket):
                return
            self._failures = max(self._failures + 1, self.threshold)
            self._open(failed_probe=self._owns(ticket))

    def release_probe(self, ticket: Ticket | None = None) -> None:
        """A request that ended without a verdict (the caller stopped reading before its first
        token): its probe slot, if it holds it, is free again. Any other ticket: nothing changes."""
        with self._lock:
            if self._owns(ticket):
                self._probe = None


@dataclass
class Endpoint:
    base_url: str
    breaker: CircuitBreaker
    outstanding_tokens: int = 0
    requests: int = 0
    failures: int = 0
    last_failure: str | None = None  # the short cause of the latest failure ("HTTP 404 from ...")
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, tokens: int) -> None:
        with self.lock:
            self.outstanding_tokens += tokens
            self.requests += 1

    def done(self, tokens: int) -> None:
        with self.lock:
            self.outstanding_tokens -= tokens


def balanced(endpoints: list[Endpoint], exclude: set[str]) -> list[Endpoint]:
    """The admissible endpoints, fewest outstanding tokens first (ties: fewest requests).

    Counting tokens rather than requests matters when requests differ a lot in size: one long
    generation weighs as much as many short ones.
    """
    candidates = [e for e in endpoints if e.base_url not in exclude and e.breaker.would_allow()]
    return sorted(candidates, key=lambda e: (e.outstanding_tokens, e.requests))


def first_admitted(ordered: list[Endpoint]) -> tuple[Endpoint, Ticket] | None:
    """The first endpoint of ``ordered`` whose circuit admits the request, with its ticket."""
    for ep in ordered:
        if ticket := ep.breaker.allow():
            return ep, ticket
    return None


def pick_endpoint(endpoints: list[Endpoint], exclude: set[str]) -> Endpoint | None:
    """The admissible endpoint with the fewest outstanding tokens (ties: fewest requests)."""
    picked = first_admitted(balanced(endpoints, exclude))
    return picked[0] if picked else None
