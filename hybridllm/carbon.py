"""Carbon-aware choice among cloud endpoints.

A cloud endpoint may carry a region and the carbon intensity of its grid in gCO2/kWh, a number or
a callable returning one, plain or ``async def`` (asked once per request, so a live feed can be
plugged in; the figure that placed a request also accounts it; a feed that fails, hangs past
``feed_timeout_s`` or gives a bogus value is unknown for that request, warned about once per
outage)::

    HybridLLM(cloud_endpoints=[
        {"url": "https://eu-north.example/v1", "region": "eu-north-1", "carbon_intensity": 30},
        CloudEndpoint("https://us-east.example/v1", region="us-east-1",
                      carbon_intensity=lambda: grid_feed("PJM")),
    ])
    llm.chat("summarise these 40 tickets", priority="batch")    # deferrable: the cleanest grid

Per request (``priority=``):

    "interactive" (default)  the fastest healthy endpoint: the lowest smoothed time to first token
                             seen (an endpoint not measured yet, or not for ``explore_after_s``,
                             counts as fastest, so each gets measured again), then the fewest
                             outstanding tokens
    "batch"                  the healthy endpoint with the lowest intensity (unknown: last), ties
                             broken as above

"Healthy": its circuit breaker admits a call. The energy of a request is what the server reports
(``usage.energy.joules``; our cloud server measures it) or else an estimate, ``joules_per_token``
times the request's tokens (neither, a stream without usage: no figures). Its carbon is
``energy_kWh * intensity``; what it saved is the same energy priced at the intensity of the
endpoint an interactive request would have used, minus its own: ``stats()["co2_saved_g"]`` sums
that against always using the fastest endpoint.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import numbers
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from ._exceptions import ConfigError, InvalidRequestError
from ._masking import split_userinfo
from ._types import is_real
from .backends.circuit import check_url

log = logging.getLogger("hybridllm.carbon")
PRIORITIES = ("interactive", "batch")
DEFAULT_JOULES_PER_TOKEN = 1.0  # a rough GPU-server figure, used only when a server reports none
J_PER_KWH = 3.6e6
FEED_TIMEOUT_S = 1.0  # a callable intensity slower than this is unknown for the request


@dataclass
class CloudEndpoint:
    url: str
    region: str | None = None
    carbon_intensity: float | Callable[[], float] | None = None  # gCO2/kWh
    feed_timeout_s = FEED_TIMEOUT_S  # a feed's longest wait per request (not a field)

    def __post_init__(self) -> None:
        # the cloud client's rule (a bad port, a broken IPv6 address, no host), named as this
        # setting: before, only the scheme was checked here and such a URL was refused as "cloud_url"
        # or "base_url", which the user never set
        check_url("a cloud endpoint's url (cloud_endpoints)", self.url)
        # its name in logs and errors: without a user:password@ (sent as basic auth, never logged)
        self._name = split_userinfo(self.url)[0]
        ci = self.carbon_intensity
        if ci is not None and not callable(ci) and not _valid_intensity(ci):
            raise ConfigError(f"carbon_intensity must be a number of gCO2/kWh in [0, 100000) or a "
                              f"callable, got {ci!r}.")
        self._feed_lock = threading.Lock()
        self._feed_call: tuple[Future, float] | None = None  # the feed's latest call, and its start
        self._feed_warned = False

    @classmethod
    def of(cls, value: Any) -> CloudEndpoint:
        """From a CloudEndpoint, a dict (``url``, ``region``, ``carbon_intensity``) or a URL."""
        if isinstance(value, CloudEndpoint):
            return value
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, dict):
            unknown = set(value) - {"url", "region", "carbon_intensity"}
            if unknown or "url" not in value:
                raise ConfigError(
                    f"a cloud endpoint takes url, region and carbon_intensity; got {sorted(value)}."
                )
            return cls(**value)
        raise ConfigError(f"a cloud endpoint is a URL, a dict or a CloudEndpoint, got {value!r}.")

    def intensity(self, call: tuple[Future, float] | None = None) -> float | None:
        """The figure in gCO2/kWh, or None (unknown: placed last, no CO2 figures). A feed that
        raises, gives a bogus value or has not answered within ``feed_timeout_s`` is unknown
        for that request, never its failure; warned once until it answers well again."""
        ci = self.carbon_intensity
        if not callable(ci):
            return None if ci is None else float(ci)
        future, started = call or self._feed()  # ``call``: one started earlier by start_feeds
        try:
            value = future.result(timeout=max(0.0, started + self.feed_timeout_s - time.monotonic()))
        except FutureTimeout:
            return self._unknown(f"has not answered within {self.feed_timeout_s:g} s")
        except Exception as exc:  # noqa: BLE001 - a failing feed must not fail the request
            return self._unknown(f"failed ({type(exc).__name__}: {exc})")
        if not _valid_intensity(value):
            return self._unknown(f"is {value!r}, not a number of gCO2/kWh in [0, 1e5)")
        if self._feed_warned:
            self._feed_warned = False
            log.info("carbon intensity of %s answers again (%s gCO2/kWh)", self._name, value)
        return float(value)

    def _feed(self) -> tuple[Future, float]:
        """The feed's call in flight, or a new one: a hung call is not asked again, so later
        requests wait only what is left of its timeout."""
        feed = self.carbon_intensity
        assert callable(feed)
        with self._feed_lock:
            call = self._feed_call
            if call is None or call[0].done():
                call = self._feed_call = (self._start_feed(feed), time.monotonic())
        return call

    @staticmethod
    def _start_feed(feed: Callable[[], Any]) -> Future:
        future: Future = Future()

        def ask() -> None:
            try:
                value = feed()
                if inspect.isawaitable(value):
                    # an async feed (``async def``, or a lambda calling one): awaited on this
                    # thread's own event loop. Before, its coroutine was taken for a bogus figure,
                    # never awaited: the endpoint's intensity was unknown on every request
                    value = asyncio.run(_awaited(value))
                future.set_result(value)
            except Exception as exc:  # noqa: BLE001 - handed to the request that waits
                future.set_exception(exc)
            except BaseException as exc:  # noqa: BLE001 - a feed's sys.exit() is its failure, not
                # the request's: re-raised as such it would end the waiting request (or thread)
                future.set_exception(RuntimeError(f"{type(exc).__name__}: {exc}"))

        threading.Thread(target=ask, name="carbon-intensity-feed", daemon=True).start()
        return future

    def _unknown(self, why: str) -> float | None:
        if not self._feed_warned:
            self._feed_warned = True
            log.warning("carbon intensity of %s %s; treated as unknown (warned once, until it "
                        "answers again)", self._name, why)
        else:
            log.debug("carbon intensity of %s %s; treated as unknown", self._name, why)
        return None


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value


def _valid_intensity(value: Any) -> bool:
    """A number (numpy's too) of gCO2/kWh in [0, 1e5); not NaN, not a bool."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return 0 <= float(value) < 1e5
    except OverflowError:  # an int past float's range (10**400): out of range, not a failure
        return False


def check_priority(priority: Any) -> str | None:
    if priority is not None and priority not in PRIORITIES:
        raise InvalidRequestError(f"priority must be 'interactive' or 'batch', got {priority!r}.")
    return priority


class CarbonPlacer:
    """Chooses among a CloudBackend's endpoints by speed or by carbon; keeps the speed figures."""

    def __init__(
        self,
        endpoints: Sequence[CloudEndpoint],
        *,
        root: Callable[[str], str],
        joules_per_token: float = DEFAULT_JOULES_PER_TOKEN,
        alpha: float = 0.3,
        explore_after_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # finite too: inf joules make every CO2 figure inf and a saving inf * 0 = NaN in stats()
        if not (is_real(joules_per_token) and 0 < joules_per_token < math.inf):
            raise ConfigError(f"joules_per_token must be a positive number, got {joules_per_token!r}.")
        self.by_root: dict[str, CloudEndpoint] = {}
        for e in endpoints:
            if root(e.url) in self.by_root:
                raise ConfigError(f"the cloud endpoint {root(e.url)} is listed twice in cloud_endpoints "
                                  f"({self.by_root[root(e.url)]._name!r}, {e._name!r}); keep one.")
            self.by_root[root(e.url)] = e
        self.joules_per_token = joules_per_token
        self.alpha = alpha
        self.explore_after_s = explore_after_s
        self._clock = clock
        self._ttft: dict[str, tuple[float, float]] = {}  # root -> (smoothed seconds, measured at)
        self._lock = threading.Lock()

    # -- speed ---------------------------------------------------------------------------------
    def observe_ttft(self, root: str, seconds: float) -> None:
        with self._lock:
            old = self._ttft.get(root)
            value = seconds if old is None else old[0] + self.alpha * (seconds - old[0])
            self._ttft[root] = (value, self._clock())

    def _speed_key(self, ep: Any) -> tuple[float, int, int]:
        seen = self._ttft.get(ep.base_url)
        fresh = seen is not None and self._clock() - seen[1] < self.explore_after_s
        return (seen[0] if seen is not None and fresh else 0.0, ep.outstanding_tokens, ep.requests)

    def intensity(self, root: str | None, seen: dict[str, float | None] | None = None) -> float | None:
        """The intensity of the endpoint at ``root``; with ``seen`` (one request's), its feed is
        asked once per request, so a request is placed and accounted with the same figure."""
        if seen is not None and root in seen:
            return seen[root]
        meta = self.by_root.get(root) if root is not None else None
        ci = meta.intensity() if meta is not None else None
        if seen is not None and root is not None:
            seen[root] = ci
        return ci

    @property
    def has_feeds(self) -> bool:
        """Whether any endpoint's intensity is a callable (a wait that must stay off event loops)."""
        return any(callable(e.carbon_intensity) for e in self.by_root.values())

    def start_feeds(self) -> dict[str, tuple[Future, float]]:
        """Every endpoint's feed asked now for one request, each in its own thread, without waiting
        for them: all at once, so ``collect_feeds`` waits for the slowest one, not their sum."""
        return {root: meta._feed() for root, meta in self.by_root.items() if callable(meta.carbon_intensity)}

    def collect_feeds(self, calls: dict[str, tuple[Future, float]], seen: dict[str, float | None]) -> None:
        """The figures of ``start_feeds``'s calls into ``seen``, each waited for what is left of its
        timeout; blocking, so async callers run it in a worker thread."""
        for root, meta in self.by_root.items():
            if root not in seen:
                seen[root] = meta.intensity(calls.get(root))

    def _carbon_key(self, ep: Any, seen: dict[str, float | None] | None = None
                    ) -> tuple[float, tuple[float, int, int]]:
        ci = self.intensity(ep.base_url, seen)
        return (float("inf") if ci is None else ci, self._speed_key(ep))

    # -- the choice ----------------------------------------------------------------------------
    def order(self, endpoints: Sequence[Any], exclude: set[str], priority: str | None,
              seen: dict[str, float | None] | None = None) -> list[Any]:
        healthy = [e for e in endpoints if e.base_url not in exclude and e.breaker.would_allow()]
        if priority == "batch":
            return sorted(healthy, key=lambda e: self._carbon_key(e, seen))
        return sorted(healthy, key=self._speed_key)

    def pick(self, endpoints: Sequence[Any], exclude: set[str], priority: str | None,
             seen: dict[str, float | None] | None = None) -> Any:
        for ep in self.order(endpoints, exclude, priority, seen):
            if ep.breaker.allow():
                return ep
        return None

    # -- accounting ----------------------------------------------------------------------------
    def account(
        self, used: str, fastest: str | None, joules: float | None, source: str | None, tokens: int,
        seen: dict[str, float | None] | None = None,
    ) -> dict[str, Any]:
        """Energy, carbon and carbon saved (vs ``fastest``) of one request, for its Usage: the
        server's figure (labelled with its source) or ``joules_per_token`` (``estimate``). A
        server that reports neither energy nor a token count gives no figures (None): estimated
        from 0 tokens, a whole answer read as 0 J and 0 g of CO2."""
        meta = self.by_root.get(used)
        out: dict[str, Any] = {
            "energy_j": None,
            "energy_source": None,
            "region": meta.region if meta is not None else None,
            "co2_g": None,
            "co2_saved_g": None,
        }
        if joules is None:
            if not tokens:  # no count to estimate from (the stream carried no usage)
                return out
            joules, source = tokens * self.joules_per_token, "estimate"
        kwh = joules / J_PER_KWH
        ci = self.intensity(used, seen)
        out["energy_j"], out["energy_source"] = joules, source or "server"
        out["co2_g"] = None if ci is None else kwh * ci
        base_ci = self.intensity(fastest, seen)
        if ci is not None and base_ci is not None:
            out["co2_saved_g"] = kwh * (base_ci - ci)
        return out
