"""Choosing an endpoint and retrying across them: availability, Retry-After, backoff with jitter."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from .._exceptions import CloudRateLimitError, CloudUnavailableError
from .._types import GenerationParams, Messages, estimate_tokens
from . import cloud_http
from .base import Delta
from .circuit import Endpoint, Ticket, awake_clock, balanced, first_admitted
from .cloud_http import _ssl_context
from .cloud_status import _EndpointDown, _Retryable
from .cloud_stream import _Streaming

if TYPE_CHECKING:
    from ..carbon import CarbonPlacer

log = logging.getLogger("hybridllm.cloud")
COOL_MAX_S = 300.0  # the longest an endpoint is left alone on its Retry-After (then asked again)
# a Retry-After's end is kept on awake_clock, as the circuit's cooldowns and the budget's windows:
# on time.monotonic (which stops while a laptop sleeps) a wait of 5 minutes asked before an hour's
# sleep still held the endpoint back for the rest of it on waking


class CloudCallStream:
    """The deltas of one request to the cloud (what ``CloudBackend.astream`` returns: an async
    generator's surface, ``async for``, ``anext``, ``aclose``), and whether the request is at an
    endpoint now (``request_out``). A caller that stops before the first token learns from it
    whether the cloud had the prompt: it had while a request was out; it had not while the request
    waited out a Retry-After or the backoff before its next attempt, nor once an attempt failed
    (a 429 or 5xx is not a call the cloud bills)."""

    def __init__(self, make: Callable[[CloudCallStream], AsyncGenerator[Delta, None]]) -> None:
        self.request_out = False
        self._agen = make(self)

    def __aiter__(self) -> CloudCallStream:
        return self

    def __anext__(self) -> Awaitable[Delta]:
        return self._agen.__anext__()

    def asend(self, value: None) -> Awaitable[Delta]:
        return self._agen.asend(value)

    def athrow(self, *args: Any) -> Awaitable[Delta]:
        return self._agen.athrow(*args)

    def aclose(self) -> Awaitable[None]:
        return self._agen.aclose()


class _Retrying(_Streaming):
    """How :class:`~hybridllm.backends.cloud.CloudBackend` picks its endpoints and retries them."""

    endpoints: list[Endpoint]
    placer: CarbonPlacer | None
    max_retries: int
    backoff_base_s: float
    backoff_max_s: float
    _cool_until: dict[str, tuple[float, int | None]]
    _answered: str | None  # the model of the latest answer (``model``)

    def is_available(self) -> bool:
        """False when every endpoint's circuit is open (a half-open probe counts as available) or
        it asked (Retry-After) to be left alone longer than ``backoff_max_s``."""
        cooling, now = self._cooling(), awake_clock()
        return any(e.breaker.would_allow()
                   and cooling.get(e.base_url, (now, None))[0] - now <= self.backoff_max_s
                   for e in self.endpoints)

    def retry_after_s(self) -> float:
        """Seconds until some endpoint takes a request again (its circuit's cooldown over, and its
        Retry-After): the soonest of them; 0.0 when one takes it now."""
        cooling, now = self._cooling(), awake_clock()
        return min((max(e.breaker.seconds_until_allowed(), cooling.get(e.base_url, (now, None))[0] - now)
                    for e in self.endpoints), default=0.0)

    def rate_limited(self) -> bool:
        """Whether the cloud takes no request now because it asked to wait: unavailable, and an
        endpoint answered HTTP 429 with a Retry-After that is longer than ``backoff_max_s`` and not
        over. A request that only the cloud can answer is then a rate limit (429), not an outage."""
        if self.is_available():
            return False
        now = awake_clock()
        return any(status == 429 and until - now > self.backoff_max_s
                   for until, status in self._cooling().values())

    def unavailable_reason(self) -> str:
        """Why the endpoints take no request now, in a few words for a completion's reason: each
        open circuit with the failure that opened it, or the Retry-After being waited out."""
        cooling, now = self._cooling(), awake_clock()
        why = []
        for e in self.endpoints:
            if not e.breaker.would_allow():
                why.append(f"circuit open after: {e.last_failure or 'repeated failures'}")
            elif e.base_url in cooling:
                until, status = cooling[e.base_url]
                why.append(f"Retry-After not over: HTTP {status} from {e.base_url}, "
                           f"{max(0.0, until - now):.0f} s left")
        return "; ".join(dict.fromkeys(why)) or "circuit open"

    async def _astream(self, messages: Messages, params: GenerationParams, priority: str | None = None,
                       out: CloudCallStream | None = None) -> AsyncGenerator[Delta, None]:
        """``out``: told whether a request is at an endpoint now (``request_out``)."""
        tried: set[str] = set()
        down: set[str] = set()  # endpoints that cannot serve: this request does not ask them again
        last: _Retryable | None = None
        # (endpoint, the end of its Retry-After) that the last backoff waited out: only that one
        waited: tuple[str, float] | None = None
        last_ep: Endpoint | None = None
        attempt = 0
        cost = estimate_tokens(messages) + params.max_tokens
        placer = self.placer
        seen: dict[str, float | None] = {}  # each intensity feed is asked once per request
        # the feeds are asked as the request begins; their answers are waited for (off the event
        # loop: a slow feed must not hold it) where they are needed: before a batch request is
        # placed, which they decide; after an interactive one's answer, which they only account
        # (before, it waited for them too, up to a feed's timeout, before it was sent)
        feeds = placer.start_feeds() if placer is not None and placer.has_feeds else None
        if placer is not None and feeds is not None and priority == "batch":
            await asyncio.to_thread(placer.collect_feeds, feeds, seen)
        # the CA store read once, off the loop
        if self._transport is None and cloud_http._SSL_CONTEXT is None:
            await asyncio.to_thread(_ssl_context)
        while True:
            exclude = (tried if len(tried) < len(self.endpoints) else set()) | down
            cooling = self._cooling()
            ep, ticket, base = self._pick(exclude | set(cooling), priority, seen)
            if ep is None and cooling:  # only endpoints that asked to wait (Retry-After) are left
                url = min(cooling, key=lambda u: cooling[u][0])
                left, status = cooling[url][0] - awake_clock(), cooling[url][1]
                if left > self.backoff_max_s:  # not worth blocking the app: the device answers
                    err = CloudRateLimitError if status == 429 else CloudUnavailableError
                    raise err(f"The cloud asked to wait: {url} answered HTTP {status} with Retry-After; "
                              f"it gets no request for {left:.0f} s more, and answers come from the "
                              "device meanwhile.", status_code=status, retry_after_s=left)
                # unless the last backoff waited this Retry-After already (its own failure's), it
                # is waited out here (before: only on a first attempt, so a retry after another
                # endpoint failed asked it again at once, long before the end of its wait). A later
                # one, from another request's 429 that came while this one waited, is waited out
                # too (before: the endpoint was asked at once, long before that one ended)
                if waited is None or waited[0] != url or cooling[url][0] > waited[1]:
                    await _sleep(max(0.0, left))
                # and it is asked now, tried before or not (before: a tried one stayed left out
                # while others were untried, so the wait was for nothing and the device answered)
                ep, ticket, base = self._pick((exclude - {url}) | down, priority, seen)
            if ep is None and isinstance(last, _EndpointDown):  # no endpoint left that can serve
                wait = (last_ep or self.endpoints[0]).breaker.wait_s  # this opening's, jittered
                raise CloudUnavailableError(
                    f"{str(last).rstrip('.')}; it is not asked again for {round(wait, 1):g} s, and answers "
                    "come from the device meanwhile", status_code=last.status,
                    retry_after_s=self.retry_after_s()) from last
            if ep is None:
                raise CloudUnavailableError(
                    f"The cloud is unavailable ({self.unavailable_reason()}); "
                    "answers come from the device until it recovers.", retry_after_s=self.retry_after_s()
                )
            ep.add(cost)
            started = False
            sent = time.perf_counter()
            try:
                # closed here, not by the garbage collector later: breaking off a stream frees its
                # connection before aclose() returns
                deltas = self._stream_once(ep, messages, params, out)
                async with aclosing(deltas):  # type: ignore[type-var]  # an async generator
                    async for delta in deltas:
                        if placer is not None and not started:
                            placer.observe_ttft(ep.base_url, time.perf_counter() - sent)
                        if not started and ticket is not None and ticket.probe:
                            # the probe's first token shows the endpoint serves: the circuit closes
                            # now, not when its answer ends (a long answer, or a stream its caller
                            # holds unread, kept every other request on the device meanwhile)
                            ep.breaker.record_success(ticket)
                        started = True
                        if placer is not None and delta.finish_reason is not None and delta.usage:
                            if feeds is not None and priority != "batch":
                                await asyncio.to_thread(placer.collect_feeds, feeds, seen)
                            u = delta.usage
                            for k, v in placer.account(
                                ep.base_url, base.base_url if base is not None else None,
                                u.energy_j, u.energy_source, u.total_tokens, seen,
                            ).items():
                                setattr(u, k, v)
                        # the model that wrote this answer (endpoints may serve different ones):
                        # on each delta, so an answer names its own model however streams interleave
                        # as the server names it (``model`` of its chunks, _stream_once), else as
                        # asked; the backend's ``model`` (the cache key's) stays the name asked for
                        if (model := self._model_at(ep)) is not None:
                            self._answered = model
                            delta.model = delta.model or model
                        yield delta
                ep.breaker.record_success(ticket)
                return
            except _Retryable as exc:
                if out is not None:  # the endpoint failed it: no request is out until the next attempt
                    out.request_out = False
                ep.last_failure = exc.cause
                if started:  # cannot retry mid-answer without duplicating text
                    ep.breaker.record_failure(ticket)
                    raise CloudUnavailableError(f"The cloud stream broke off: {exc}") from exc
                ep.failures += 1
                tried.add(ep.base_url)
                last, last_ep = exc, ep
                if isinstance(exc, _EndpointDown):  # not retried: another endpoint, else the device
                    ep.breaker.trip(ticket)
                    down.add(ep.base_url)
                    if exc.status is not None:
                        self._warn_once(ep.base_url, exc.status, str(exc))
                    log.info("cloud endpoint %s cannot serve (%s); its circuit is open", ep.base_url, exc)
                    usable = [e for e in self.endpoints if e.base_url not in down and e.breaker.would_allow()]
                    if attempt and usable and not self._ready(tried):
                        # the next to ask failed earlier in this request: its backoff still applies
                        await _sleep(random.uniform(0, min(self.backoff_max_s,
                                                           self.backoff_base_s * 2 ** (attempt - 1))))
                    continue
                if exc.status != 429:
                    # a 429 is no failure of the endpoint: it answers, and asks to be asked less
                    # often. Its Retry-After keeps requests away (below) for as long as it says;
                    # counted, three 429s opened the circuit, which then held the endpoint back for
                    # its cooldown whatever the Retry-After said (doubled by each probe answered
                    # 429, up to 5 minutes), cut the request's retries short, and made a rate limit
                    # an outage (CloudUnavailableError, the proxy's 503 for cloud_rate_limited)
                    ep.breaker.record_failure(ticket)
                attempt += 1
                until = None
                if exc.retry_after is not None:  # later requests go elsewhere until it ends
                    until = awake_clock() + min(exc.retry_after, COOL_MAX_S)
                    self._cool_until[ep.base_url] = (until, exc.status)
                if attempt > self.max_retries:
                    err = CloudRateLimitError if exc.status == 429 else CloudUnavailableError
                    # its wait as it is kept (COOL_MAX_S at most): a Retry-After of a day said a day
                    # here while the next request, a second later, said 299 s and the cloud was
                    # asked again after 300
                    asked = None if exc.retry_after is None else min(exc.retry_after, COOL_MAX_S)
                    raise err(f"The cloud failed after {attempt} attempts: {exc}", status_code=exc.status,
                              retry_after_s=asked) from exc
                if self._ready(tried) or ((exc.retry_after or 0.0) > self.backoff_max_s
                                          and not self._ready(down)):
                    # another endpoint has not failed; or this one is not waited for and no other
                    # is left to ask (the request fails at once, its Retry-After in the error)
                    delay = 0.0
                else:
                    # this one again, or one that failed earlier in this request (before: asked at
                    # once, without its backoff, when this one's Retry-After was not waited for)
                    delay = min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempt - 1))
                    delay = random.uniform(0, delay)  # full jitter
                    if exc.retry_after is not None and exc.retry_after <= self.backoff_max_s:
                        delay = max(delay, exc.retry_after)  # a longer one is not waited for (above)
                waited = ((ep.base_url, until) if until is not None and exc.retry_after is not None
                          and delay >= exc.retry_after else None)
                log.info("cloud attempt %d failed (%s); retrying in %.2fs", attempt, exc, delay)
                await _sleep(delay)
            except (GeneratorExit, asyncio.CancelledError):
                if started:  # it was answering when the reader stopped (at its stop sequence, a
                    # hang-up): a verdict on the endpoint, or a half-open circuit never closed
                    ep.breaker.record_success(ticket)
                raise
            finally:
                # no verdict (the endpoint answered a refusal, or the caller stopped reading before
                # the first token): a probe's slot is free again; a verdict above already freed it,
                # and another request's ticket never frees the probe it holds
                ep.breaker.release_probe(ticket)
                ep.done(cost)

    def _pick(self, exclude: set[str], priority: str | None, seen: dict[str, float | None]
              ) -> tuple[Endpoint, Ticket, Endpoint] | tuple[None, None, None]:
        """The endpoint to ask, its circuit's ticket (passed back with the outcome), and the one
        "always the fastest" would have asked in its place (the baseline of its CO2 saved)."""
        ordered = (self.placer.order(self.endpoints, exclude, priority, seen) if self.placer is not None
                   else balanced(self.endpoints, exclude))
        # The baseline is placed as this request is, with what this request may use now:
        #   interactive: the endpoint it is placed on (the fastest: nothing saved, nothing lost);
        #   batch: the fastest of the endpoints it could be placed on (not failed in this request,
        #   not waiting out a Retry-After, circuit closed), ranked before a ticket is taken.
        # Before, the fastest of all endpoints when the request began: two interactive requests
        # that both saw A fastest, the second balanced onto B, or A held back by a Retry-After,
        # read as CO2 lost against A (co2_saved_g < 0) for an interactive request.
        fastest = (self.placer.order(self.endpoints, exclude, "interactive", seen)
                   if self.placer is not None and priority == "batch" else [])
        picked = first_admitted(ordered)
        if picked is None:
            return None, None, None
        ep, ticket = picked
        return ep, ticket, fastest[0] if fastest else ep

    def _cooling(self) -> dict[str, tuple[float, int | None]]:
        """The endpoints whose Retry-After has not ended yet (the ended ones are forgotten)."""
        now, snapshot = awake_clock(), dict(self._cool_until)  # one copy: other threads may add
        for url in [u for u, (until, _) in snapshot.items() if until <= now]:
            self._cool_until.pop(url, None)
            del snapshot[url]
        return snapshot

    def _ready(self, exclude: set[str]) -> bool:
        """Whether an endpoint not in ``exclude`` takes a request now (circuit, Retry-After)."""
        cooling = self._cooling()
        return any(e.base_url not in exclude and e.base_url not in cooling and e.breaker.would_allow()
                   for e in self.endpoints)



async def _sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)
