"""The cloud backend: any OpenAI-compatible endpoint (our server, vLLM, a hosted API) over httpx.

Resilience, in the order a request meets it:
1. an endpoint is picked by least outstanding tokens among those whose circuit admits a call;
2. an endpoint that cannot serve at all opens its circuit at once and is not asked again by this
   request (no retry, no backoff wait): the next endpoint is tried, and with none left the request
   fails at once with :class:`CloudUnavailableError` and the device answers. That is a connection
   refused, timed out or unresolvable (TCP already retransmits a lost SYN within the connect
   timeout, so a second try mostly doubles the wait of an app that is offline), and an answer
   that is not from an OpenAI-compatible API: a redirect (never followed: a captive portal's sign-in
   page, or http -> https: set ``base_url`` to where it points), 404, 405, 410, 415 or any other 4xx
   not named here, and a web page (text/html) instead of an event stream. Each such status is
   logged as a warning once per endpoint;
3. other connection errors, read timeouts, 408, 409, 429 and 5xx are retried with exponential
   backoff and full jitter (none before an endpoint that has not failed yet), honouring
   ``Retry-After`` (``retry-after-ms`` first, OpenAI's and Azure's) up to ``backoff_max_s``; an
   endpoint that asks for longer gets no request until then (``COOL_MAX_S`` at most; with no
   other, the request fails at once and the device answers);
4. a field the endpoint does not take is left out (or renamed) and the request sent again at once,
   and that endpoint is never sent it again for that model (a warning says so, once): not a
   failure, and no retry is spent on it. A hosted endpoint's refusals are kept across processes
   for a week (``refusals.py``), so the next process does not learn them again. That is a field it
   does not know (``top_k``, ``min_p``,
   ``repetition_penalty``: vLLM's and our server's, not OpenAI's, a hosted API answers 400
   "Unrecognized request argument supplied: top_k"; ``stream_options``, which older servers and
   Azure API versions lack: the cloud's token count then never arrives and the pipeline estimates
   it), ``max_tokens`` refused by a model that wants ``max_completion_tokens`` (OpenAI's reasoning
   models), a ``temperature`` or ``top_p`` such a model takes only at its default (left out:
   it samples at the server's default), and ``stop`` refused by such a model ("Unsupported
   parameter: 'stop'"): the client then applies the stop sequences itself, streamed or not: the
   answer ends before the earliest one (not included), with finish_reason "stop", and the stream is
   closed there; while streaming only a tail that may start a stop sequence is held back. The
   cloud's count then covers what it generated past the stop (a whole answer: kept as the call's
   cost, counted once); a stream closed at the stop brings none, so the call is counted from what
   the cloud sent up to the close, the text past the stop included (each piece at least one token,
   ~4 characters a token), plus the prompt's estimate. A bad stop value ("Invalid 'stop': array
   too long") stays the caller's error (5);
5. a refusal of this request alone is not retried and leaves the circuit as it is:
   400 ``context_length_exceeded`` (the cloud's context window), 413 (too large) and a 422 whose
   body says the context or maximum length was exceeded (TGI's "`inputs` tokens + `max_new_tokens`
   must be <= 2048") raise :class:`CloudUnavailableError`, so the device answers when the prompt
   fits it; any other 400 or 422 (a validation error) is the caller's (:class:`InvalidRequestError`,
   with what the server said), and a refused key (401/403) raises :class:`CloudAuthError`;
6. retries happen only before the first token is passed on, so an answer is never duplicated; once
   its finish_reason has come, the answer is whole: a connection that breaks, an error event or
   garbage before the count and [DONE] end it as it is, never fail it;
7. a stream that goes quiet for ``stall_timeout_s`` after its first token is broken off (a hung
   server), apart from ``read_timeout_s``, which bounds the wait for the first token (keepalive
   comments are no event: they count as quiet, here and before the first token; headers that
   trickle in get ``connect_timeout_s + 2 * read_timeout_s`` in all, a whole answer sent as JSON
   ``2 * read_timeout_s``), and no answer is held in memory
   past a bound (``MAX_BODY_BYTES``, ``MAX_LINE_CHARS``; an error's first ``MAX_ERROR_BYTES``);
8. repeated failures open the endpoint's circuit, and the client fails fast with
   :class:`CloudUnavailableError`, which the pipeline turns into an answer from the device; the
   error says what the cloud last did ("circuit open after: HTTP 404 from http://h/v1/..."). Each
   failed probe doubles the wait before the next, up to ``breaker_max_cooldown_s``; each opening
   waits a random share of that, between half and all of it, so that many processes whose
   circuits opened at the same outage do not probe the recovering endpoint together.
The API key comes from the constructor or ``HYBRIDLLM_CLOUD_API_KEY`` and is never logged.

The pipeline calls :meth:`CloudBackend.astream` (httpx ``AsyncClient``, one per event loop);
:meth:`CloudBackend.stream` drives the same code on a private loop for synchronous callers.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import json
import logging
import math
import os
import random
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import AsyncExitStack, aclosing, asynccontextmanager
from typing import Any

from .._config import split_userinfo
from .._durations import duration
from .._exceptions import (
    CloudAuthError,
    CloudRateLimitError,
    CloudUnavailableError,
    ConfigError,
    InvalidRequestError,
)
from .._request_id import REQUEST_ID
from .._types import GenerationParams, Messages, Usage, estimate_text_tokens, estimate_tokens
from .base import Backend, Delta, StopMatcher, drain_loop, register_backend
from .circuit import (
    MAX_COOLDOWN_S,
    CircuitBreaker,
    Endpoint,
    Ticket,
    balanced,
    check_setting,
    check_url,
    first_admitted,
)
from .refusals import RefusalMemory, is_hosted

log = logging.getLogger("hybridllm.cloud")
COOL_MAX_S = 300.0  # the longest an endpoint is left alone on its Retry-After (then asked again)
MODELS_TIMEOUT_S = 10.0  # the longest wait for GET /v1/models (model discovery)
# the most of an answer held in memory: a server that sends without end (a runaway error page, an
# event stream with no line breaks) is cut off there, not read until the process runs out of memory
MAX_BODY_BYTES = 32 * 2**20  # a whole (non-streamed) completion
MAX_LINE_CHARS = 4 * 2**20  # one line of an event stream (one event: a token and its logprobs)
MAX_ERROR_BYTES = 64 * 2**10  # an error's body: only its start is read, for the message
RETRY_STATUS = {408, 409, 429}  # and every 5xx: a proxy's 520-524 (Cloudflare) or 529 (overloaded) too
# the cloud's context-window refusal: OpenAI's (and our server's) code, or the wording of servers
# that send none (vLLM: "maximum context length", others: "context window", "prompt is too long")
CONTEXT_WORDS = re.compile(r"context[ _-]?(length|window)|prompt is too long", re.IGNORECASE)
# a 422 is a window refusal only when it says so: those words, or what servers that answer a long
# prompt with 422 write (TGI: "`inputs` tokens + `max_new_tokens` must be <= 2048", "`inputs` must
# have less than 1024 tokens"; others "maximum input length", "too many tokens"); any other 422 (a
# validation error: "Input should be less than or equal to 4096") is the request's fault
WINDOW_422_WORDS = re.compile(
    r"context[ _-]?(length|window)|prompt is too long|max(imum)?[ _-](input|sequence|prompt|model)[ _-]"
    r"length|too many (input |prompt )?tokens|inputs.{0,80}must (be <=|have less than)",
    re.IGNORECASE)
# fields a server may not know at all, left out for an endpoint that rejects them as unknown: the
# sampling fields outside OpenAI's API (vLLM's, our server's), and stream_options (newer than older
# servers and Azure API versions; without it the cloud sends no token count and the pipeline estimates)
OPTIONAL_FIELDS = ("top_k", "min_p", "repetition_penalty", "stream_options")
# fields of OpenAI's API that a model may refuse (its reasoning models): "Unsupported parameter:
# 'max_tokens' ... Use 'max_completion_tokens' instead", and "Unsupported value: 'temperature' does
# not support 0.7 with this model. Only the default (1) value is supported." (top_p alike)
# ("Unsupported parameter: 'stop' is not supported with this model": the client then cuts at the
# stop sequences itself)
MODEL_FIELDS = ("max_tokens", "temperature", "top_p", "stop")
QUOTED_ONLY = {"stop"}  # a common word: without a param, the message must name it in quotes
RENAMED = {"max_tokens": "max_completion_tokens"}  # a refused field that goes on under its new name
# what the request loses, for the warning, by the field it no longer sends
LOSES = {"stream_options": "the cloud reports no token count, so each answer's tokens are estimated "
                           "(the prompt plus about 4 characters a token)",
         "max_tokens": "the answer's length limit goes as max_completion_tokens",
         "temperature": "it samples at the server's default temperature, not the request's",
         "top_p": "it samples at the server's default top_p, not the request's",
         "stop": "the client cuts each answer at its stop sequences itself and closes the stream there "
                 "(the call is then counted from what the cloud sent, ~4 characters a token)"}
# how servers reject a field they do not know: OpenAI "Unrecognized request argument supplied: top_k",
# pydantic "Extra inputs are not permitted", Google "Unknown name", our server "min_p is not supported"
UNKNOWN_WORDS = re.compile(r"unrecogni[sz]ed|unknown|unsupported|not supported|not permitted|not allowed"
                           r"|extra|unexpected|additional propert", re.IGNORECASE)
# how a model refuses a field of OpenAI's API (narrower: "not allowed" may be a bad value's wording)
UNSUPPORTED_WORDS = re.compile(r"unsupported|not supported|unrecogni[sz]ed|unknown", re.IGNORECASE)


class _Retryable(Exception):
    def __init__(self, message: str, *, status: int | None = None,
                 retry_after: float | None = None, cause: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        # what the cloud did, in a few words, for the reasons given while its circuit stays open
        self.cause = cause or (message if len(message) <= 160 else message[:157] + "...")


class _EndpointDown(_Retryable):
    """The endpoint cannot serve at all (unreachable, or not an OpenAI-compatible API): its circuit
    opens at once and the request moves on to another endpoint, or to the device."""


_SSL_CONTEXT: Any = None
_RECALLS_SAID: set[tuple[str, str, frozenset[str]]] = set()  # recalled refusals already warned of


def _ssl_context() -> Any:
    """One TLS context for every client of the process: httpx reads the CA store (certifi's, or
    ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``) for each new client, 20-250 ms that the first cloud call
    on each event loop spent on the loop, holding up an async app's other requests."""
    global _SSL_CONTEXT
    if _SSL_CONTEXT is None:
        import httpx

        _SSL_CONTEXT = httpx.create_ssl_context()  # a race builds two; either is right
    return _SSL_CONTEXT


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    try:
        seconds = float(value)
        return max(0.0, seconds) if math.isfinite(seconds) else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000" parses naive; HTTP dates are GMT, not the machine's zone
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - time.time())


def retry_after_of(headers: Any) -> float | None:
    """Seconds to wait from an answer's headers: ``retry-after-ms`` (OpenAI's and Azure's, in
    milliseconds, finer than whole seconds) when it is a number >= 0, else ``Retry-After``. Either
    is bounded where it is used (``backoff_max_s`` waited, ``COOL_MAX_S`` at most left alone)."""
    try:
        ms = float(headers.get("retry-after-ms") or "")
    except ValueError:  # absent, or not a number: Retry-After decides
        ms = math.nan
    if math.isfinite(ms) and ms >= 0:
        return ms / 1000
    return parse_retry_after(headers.get("retry-after"))


class CloudBackend(Backend):
    name = "cloud"

    def __init__(
        self,
        *,
        base_url: str | list[str],
        api_key: str | None = None,
        model: str | None = None,
        connect_timeout_s: float = 3.0,
        read_timeout_s: float = 120.0,
        stall_timeout_s: float | None = 10.0,
        max_retries: int = 3,
        backoff_base_s: float = 0.25,
        backoff_max_s: float = 8.0,
        breaker_threshold: int = 3,
        breaker_cooldown_s: float = 10.0,
        breaker_max_cooldown_s: float = MAX_COOLDOWN_S,
        transport: Any = None,
        carbon: list[Any] | None = None,
        joules_per_token: float | None = None,
        remember_refusals: bool | None = None,
    ) -> None:
        """``carbon``: endpoints with a region and grid intensity (``hybridllm.carbon``); their
        URLs are added to ``base_url``, and requests choose by ``priority``. ``remember_refusals``:
        keep the fields an endpoint refused across processes (``refusals.py``): None for hosted
        (https, not this machine) endpoints only, True for every endpoint, False for none."""
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        placer = None
        if carbon:
            from ..carbon import DEFAULT_JOULES_PER_TOKEN, CarbonPlacer, CloudEndpoint

            marked = [CloudEndpoint.of(e) for e in carbon]
            urls += [e.url for e in marked]
            placer = CarbonPlacer(marked, root=_api_root,
                                  joules_per_token=joules_per_token or DEFAULT_JOULES_PER_TOKEN)
        if not urls:
            raise ConfigError(f"cloud base_url must be http(s) URL(s), got {base_url!r}.")
        for u in urls:  # the settings' rule: a bad port or no host is refused here, not per request
            check_url("base_url", u)
        # one server named twice ("http://h", "http://h/v1/") is one endpoint: one breaker, one share
        urls = list({_api_root(u): u for u in reversed(urls)}.values())[::-1]
        # a URL's user:password@ goes as basic auth, never in an endpoint's name: errors, logs,
        # the proxy's reasons and the refusal file quote the endpoint
        self._auth = {_api_root(u): cred for u in urls if (cred := split_userinfo(u)[1])}
        # and a query string's parameters (Azure's api-version, a key some gateways take there)
        # go as each request's params, never in an endpoint's name either
        self._query = {_api_root(u): query for u in urls if (query := _query_of(u))}
        # a timeout of 0 or below (or NaN) failed every request at once, silently: each answer came
        # from the device; a backoff of None or a string was a TypeError mid-request. The rule is
        # the settings' own (check_setting), under the names of the arguments
        check_setting("max_retries", max_retries, "count>=0")
        check_setting("connect_timeout_s", connect_timeout_s, "seconds>0")
        check_setting("read_timeout_s", read_timeout_s, "seconds>0")
        check_setting("stall_timeout_s", stall_timeout_s, "seconds>0|None")
        check_setting("backoff_base_s", backoff_base_s, "seconds>=0")
        check_setting("backoff_max_s", backoff_max_s, "seconds>=0")
        self.endpoints = [Endpoint(_api_root(u), CircuitBreaker(
            threshold=breaker_threshold, cooldown_s=breaker_cooldown_s,
            max_cooldown_s=breaker_max_cooldown_s)) for u in urls]
        self._api_key = api_key if api_key is not None else os.environ.get("HYBRIDLLM_CLOUD_API_KEY")
        self._model = model
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self._transport = transport
        self._clients: dict[asyncio.AbstractEventLoop, Any] = {}
        self.placer = placer
        # base URL -> (monotonic time its Retry-After ends, the status that asked for it)
        self._cool_until: dict[str, tuple[float, int | None]] = {}
        self._warned: set[tuple[str, int]] = set()  # (endpoint, status) already logged as a warning
        # (base URL, model) -> the fields it refused (OPTIONAL_FIELDS, MODEL_FIELDS): not sent to it
        # again (RENAMED ones go under their new name)
        self._refused: dict[tuple[str, str], frozenset[str]] = {}
        self._memory = RefusalMemory() if remember_refusals is not False else None
        self._remember_all = remember_refusals is True
        self._recalled: set[tuple[str, str]] = set()  # keys whose remembered fields were read

    def __repr__(self) -> str:  # never show the key
        key = "***" if self._api_key else None
        return f"CloudBackend(endpoints={[e.base_url for e in self.endpoints]}, api_key={key})"

    @property
    def model(self) -> str:  # type: ignore[override]
        return self._model or "cloud"

    def is_available(self) -> bool:
        """False when every endpoint's circuit is open (a half-open probe counts as available) or
        it asked (Retry-After) to be left alone longer than ``backoff_max_s``."""
        cooling, now = self._cooling(), time.monotonic()
        return any(e.breaker.would_allow()
                   and cooling.get(e.base_url, (now, None))[0] - now <= self.backoff_max_s
                   for e in self.endpoints)

    def retry_after_s(self) -> float:
        """Seconds until some endpoint takes a request again (its circuit's cooldown over, and its
        Retry-After): the soonest of them; 0.0 when one takes it now."""
        cooling, now = self._cooling(), time.monotonic()
        return min((max(e.breaker.seconds_until_allowed(), cooling.get(e.base_url, (now, None))[0] - now)
                    for e in self.endpoints), default=0.0)

    def rate_limited(self) -> bool:
        """Whether the cloud takes no request now because it asked to wait: unavailable, and an
        endpoint answered HTTP 429 with a Retry-After that is longer than ``backoff_max_s`` and not
        over. A request that only the cloud can answer is then a rate limit (429), not an outage."""
        if self.is_available():
            return False
        now = time.monotonic()
        return any(status == 429 and until - now > self.backoff_max_s
                   for until, status in self._cooling().values())

    def unavailable_reason(self) -> str:
        """Why the endpoints take no request now, in a few words for a completion's reason: each
        open circuit with the failure that opened it, or the Retry-After being waited out."""
        cooling, now = self._cooling(), time.monotonic()
        why = []
        for e in self.endpoints:
            if not e.breaker.would_allow():
                why.append(f"circuit open after: {e.last_failure or 'repeated failures'}")
            elif e.base_url in cooling:
                until, status = cooling[e.base_url]
                why.append(f"Retry-After not over: HTTP {status} from {e.base_url}, "
                           f"{max(0.0, until - now):.0f} s left")
        return "; ".join(dict.fromkeys(why)) or "circuit open"

    def _client(self) -> Any:
        """The AsyncClient of the running loop (a client's connections belong to one loop)."""
        import httpx

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            for old in [lp for lp in self._clients if lp.is_closed()]:
                del self._clients[old]
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            # redirects are not followed: a POST would be re-sent (the prompt, the key) to wherever a
            # captive portal or a proxy points; the status says where, and base_url is fixed once
            tls = {} if self._transport is not None else {"verify": _ssl_context()}
            client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.read_timeout_s, connect=self.connect_timeout_s),
                headers=headers, transport=self._transport, follow_redirects=False, **tls)
            self._clients[loop] = client
        return client

    async def _resolve_model(self, ep: Endpoint) -> str:
        if self._model:
            return self._model
        import httpx

        # a cheap call: a server slow to answer it is not waited on for the whole read timeout, nor
        # one that trickles it a byte at a time (each byte would restart httpx's read timeout)
        limit = self.connect_timeout_s + min(self.read_timeout_s, MODELS_TIMEOUT_S)
        try:
            async with _trickle_bound(limit, f"could not list models at {ep.base_url}: no whole answer"):
                resp = await self._client().get(f"{ep.base_url}/models", timeout=httpx.Timeout(
                    min(self.read_timeout_s, MODELS_TIMEOUT_S), connect=self.connect_timeout_s),
                    auth=self._auth.get(ep.base_url, httpx.USE_CLIENT_DEFAULT),
                    params=self._query.get(ep.base_url))
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise self._unreachable(ep, exc) from exc
        except httpx.HTTPError as exc:
            raise _Retryable(f"could not list models at {ep.base_url}: "
                             f"{str(exc) or type(exc).__name__}") from exc
        if resp.status_code == 404:
            raise _EndpointDown(f"The cloud at {ep.base_url}/models answered HTTP 404: is cloud_url the "
                                "base URL of an OpenAI-compatible server? If it is, it does not list its "
                                "models: set cloud_model (HYBRIDLLM_CLOUD_MODEL).", status=404,
                                cause=f"HTTP 404 from {ep.base_url}/models")
        if resp.status_code != 200:
            self._raise_for_status(resp, listing=True)
        try:
            self._model = str(resp.json()["data"][0]["id"])
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise _Retryable(f"could not list models at {ep.base_url}: {exc}") from exc
        return self._model

    def stream(self, messages: Messages, params: GenerationParams) -> Iterator[Delta]:
        """Synchronous streaming for callers without an event loop (the pipeline uses astream)."""
        loop = asyncio.new_event_loop()
        agen = self._astream(messages, params)
        try:
            while True:
                try:
                    delta = loop.run_until_complete(agen.__anext__())
                except StopAsyncIteration:
                    return
                yield delta
        finally:
            loop.run_until_complete(agen.aclose())
            client = self._clients.pop(loop, None)
            if client is not None:
                loop.run_until_complete(client.aclose())
            # httpx's inner line readers, dropped when a stream broke off or ended, are closed by
            # tasks the loop must still run (drain_loop)
            loop.run_until_complete(drain_loop())
            loop.close()

    def astream(self, messages: Messages, params: GenerationParams, *,
                priority: str | None = None) -> AsyncIterator[Delta]:
        """``priority``: "interactive" (the fastest endpoint) or "batch" (the lowest carbon
        intensity), when endpoints carry one (``carbon=``); else balanced by outstanding tokens."""
        return self._astream(messages, params, priority)

    async def _astream(self, messages: Messages, params: GenerationParams,
                       priority: str | None = None) -> AsyncGenerator[Delta, None]:
        tried: set[str] = set()
        down: set[str] = set()  # endpoints that cannot serve: this request does not ask them again
        last: _Retryable | None = None
        waited: str | None = None  # the endpoint whose Retry-After the last backoff waited out
        last_ep: Endpoint | None = None
        attempt = 0
        cost = estimate_tokens(messages) + params.max_tokens
        placer = self.placer
        fastest = placer.fastest(self.endpoints) if placer is not None else None
        seen: dict[str, float | None] = {}  # each intensity feed is asked once per request
        if placer is not None and placer.has_feeds:  # a slow feed must not hold the event loop
            await asyncio.to_thread(placer.ask_feeds, seen)
        if self._transport is None and _SSL_CONTEXT is None:  # the CA store read once, off the loop
            await asyncio.to_thread(_ssl_context)
        while True:
            exclude = (tried if len(tried) < len(self.endpoints) else set()) | down
            cooling = self._cooling()
            ep, ticket = self._pick(exclude | set(cooling), priority, seen)
            if ep is None and cooling:  # only endpoints that asked to wait (Retry-After) are left
                url = min(cooling, key=lambda u: cooling[u][0])
                left, status = cooling[url][0] - time.monotonic(), cooling[url][1]
                if left > self.backoff_max_s:  # not worth blocking the app: the device answers
                    err = CloudRateLimitError if status == 429 else CloudUnavailableError
                    raise err(f"The cloud asked to wait: {url} answered HTTP {status} with Retry-After; "
                              f"it gets no request for {left:.0f} s more, and answers come from the "
                              "device meanwhile.", status_code=status, retry_after_s=left)
                # unless the last backoff waited this Retry-After already (its own failure's), it
                # is waited out here (before: only on a first attempt, so a retry after another
                # endpoint failed asked it again at once, long before the end of its wait)
                if url != waited:
                    await _sleep(max(0.0, left))
                ep, ticket = self._pick(exclude, priority, seen)
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
                deltas = self._stream_once(ep, messages, params)
                async with aclosing(deltas):  # type: ignore[type-var]  # an async generator
                    async for delta in deltas:
                        if placer is not None and not started:
                            placer.observe_ttft(ep.base_url, time.perf_counter() - sent)
                        started = True
                        if placer is not None and delta.finish_reason is not None and delta.usage:
                            u = delta.usage
                            for k, v in placer.account(
                                ep.base_url, fastest.base_url if fastest is not None else None,
                                u.energy_j, u.energy_source, u.total_tokens, seen,
                            ).items():
                                setattr(u, k, v)
                        yield delta
                ep.breaker.record_success(ticket)
                return
            except _Retryable as exc:
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
                    if attempt and usable and not self._another_ready(tried):
                        # the next to ask failed earlier in this request: its backoff still applies
                        await _sleep(random.uniform(0, min(self.backoff_max_s,
                                                           self.backoff_base_s * 2 ** (attempt - 1))))
                    continue
                ep.breaker.record_failure(ticket)
                attempt += 1
                if exc.retry_after is not None:  # later requests go elsewhere until it ends
                    self._cool_until[ep.base_url] = (
                        time.monotonic() + min(exc.retry_after, COOL_MAX_S), exc.status)
                if attempt > self.max_retries:
                    err = CloudRateLimitError if exc.status == 429 else CloudUnavailableError
                    # its wait as it is kept (COOL_MAX_S at most): a Retry-After of a day said a day
                    # here while the next request, a second later, said 299 s and the cloud was
                    # asked again after 300
                    asked = None if exc.retry_after is None else min(exc.retry_after, COOL_MAX_S)
                    raise err(f"The cloud failed after {attempt} attempts: {exc}", status_code=exc.status,
                              retry_after_s=asked) from exc
                if self._another_ready(tried) or (exc.retry_after or 0.0) > self.backoff_max_s:
                    delay = 0.0  # another endpoint has not failed, or this one is not waited for
                else:
                    delay = min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempt - 1))
                    delay = random.uniform(0, delay)  # full jitter
                    if exc.retry_after is not None and exc.retry_after <= self.backoff_max_s:
                        delay = max(delay, exc.retry_after)  # a longer one is not waited for (above)
                waited = ep.base_url if exc.retry_after is not None and delay >= exc.retry_after else None
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
              ) -> tuple[Endpoint, Ticket] | tuple[None, None]:
        """The endpoint to ask and its circuit's ticket (passed back with the outcome)."""
        ordered = (self.placer.order(self.endpoints, exclude, priority, seen) if self.placer is not None
                   else balanced(self.endpoints, exclude))
        return first_admitted(ordered) or (None, None)

    def _cooling(self) -> dict[str, tuple[float, int | None]]:
        """The endpoints whose Retry-After has not ended yet (the ended ones are forgotten)."""
        now, snapshot = time.monotonic(), dict(self._cool_until)  # one copy: other threads may add
        for url in [u for u, (until, _) in snapshot.items() if until <= now]:
            self._cool_until.pop(url, None)
            del snapshot[url]
        return snapshot

    def _another_ready(self, tried: set[str]) -> bool:
        cooling = self._cooling()
        return any(e.base_url not in tried and e.base_url not in cooling and e.breaker.would_allow()
                   for e in self.endpoints)

    def request_body(self, model: str, messages: Messages, params: GenerationParams,
                     omit: frozenset[str] = frozenset()) -> dict:
        """The chat completion request. vLLM's sampling fields go only when they are not off (our
        server and vLLM take a missing one as off), and never the ``omit`` ones (fields this
        endpoint refused): left out, or sent under their new name (``RENAMED``)."""
        body: dict[str, Any] = {
            "model": model, "messages": messages, "stream": True,
            "stream_options": {"include_usage": True}, "max_tokens": params.max_tokens,
            "temperature": params.temperature, "top_p": params.top_p,
        }
        if params.top_k > 0:  # 0 is off; the default (40) is sent, as the device samples with it
            body["top_k"] = params.top_k
        if params.min_p > 0:
            body["min_p"] = params.min_p
        if params.repeat_penalty != 1.0:
            body["repetition_penalty"] = params.repeat_penalty
        if params.seed is not None:
            body["seed"] = params.seed
        if params.stop:
            body["stop"] = list(params.stop)
        for name in omit:
            value = body.pop(name, None)
            if name in RENAMED and value is not None:
                body[RENAMED[name]] = value
        return body

    async def _post(self, ep: Endpoint, model: str, messages: Messages, params: GenerationParams,
                    stack: AsyncExitStack) -> tuple[Any, dict]:
        """POST the request and return the answer once it is 200 (else raise what it means), with
        the body that went (what it left out tells the stream what to do itself). A 400 or 422
        that refuses fields we can do without (``_refused_fields``) is sent again at once without
        them, and they are not sent to this endpoint for this model from then on. Each round must
        refuse a field not refused before, and there are few, so this ends."""
        import httpx

        key = (ep.base_url, model)
        self._recall(key)
        while True:
            refused = self._refused.get(key, frozenset())
            body = self.request_body(model, messages, params, refused)
            # httpx's read timeout bounds each read, not the whole answer: a server that trickles its
            # headers (or an error's body) a byte at a time would be waited on for ever. The bound
            # is what the per-step timeouts allow a server that does not trickle: a wait for a free
            # pooled connection (httpx's pool timeout is the read timeout), the connect, the head
            limit = self.connect_timeout_s + 2 * self.read_timeout_s
            async with _trickle_bound(limit, f"timeout talking to {ep.base_url}: no whole answer's head"):
                resp = await stack.enter_async_context(
                    self._client().stream("POST", f"{ep.base_url}/chat/completions", json=body,
                                          auth=self._auth.get(ep.base_url, httpx.USE_CLIENT_DEFAULT),
                                          params=self._query.get(ep.base_url), headers=_traced()))
                if resp.status_code == 200:
                    return resp, body
                resp, _ = await _read_capped(resp, MAX_ERROR_BYTES)
            new = _refused_fields(resp, body) - refused
            if not new:
                self._raise_for_status(resp, ep.base_url)
            learned = new - self._refused.get(key, frozenset())  # another request may have learned it
            self._refused[key] = self._refused.get(key, frozenset()) | new
            if learned and self._memory is not None and self._remembers(ep.base_url):
                self._memory.remember(ep.base_url, model, self._refused[key])
            if learned:
                sent = ", ".join(f"{n} {body[n]}" if n in ("temperature", "top_p") else n
                                 for n in sorted(learned))
                loses = "; ".join(dict.fromkeys(LOSES.get(n, "it samples without that filter")
                                                for n in sorted(learned)))
                log.warning("The cloud at %s (model %s) does not accept %s (HTTP %d: %s); it is sent "
                            "requests without %s from now on: %s", ep.base_url, model, sent,
                            resp.status_code, _error_of(resp)[0][:160],
                            "them" if len(learned) > 1 else "it", loses)

    def _remembers(self, base_url: str) -> bool:
        return self._remember_all or is_hosted(base_url)

    def _recall(self, key: tuple[str, str]) -> None:
        """Once per endpoint and model: take up what an earlier process learned it refuses, so
        this one's first request does not pay a refused round trip per field again."""
        if key in self._recalled or self._memory is None or not self._remembers(key[0]):
            return
        self._recalled.add(key)
        found = self._memory.recall(*key)
        if found is None:
            return
        fields, at = found
        new = fields - self._refused.get(key, frozenset())
        if not new:
            return
        self._refused[key] = self._refused.get(key, frozenset()) | new
        said = (*key, new)  # once per process: each HybridLLM made in it recalls the file again
        if said in _RECALLS_SAID:
            return
        _RECALLS_SAID.add(said)
        loses = "; ".join(dict.fromkeys(LOSES.get(n, "it samples without that filter") for n in sorted(new)))
        log.warning("The cloud at %s (model %s) refused %s when asked %s ago (kept in %s; delete it to "
                    "forget); it is sent requests without %s: %s", key[0], key[1], ", ".join(sorted(new)),
                    duration(time.time() - at), self._memory.path, "them" if len(new) > 1 else "it", loses)

    async def _stream_once(self, ep: Endpoint, messages: Messages,
                           params: GenerationParams) -> AsyncIterator[Delta]:
        import httpx

        model = await self._resolve_model(ep)
        finish, usage = None, None
        done = False
        # the stop sequences of a model that refused them ('stop' left out): applied here, to what
        # the cloud sends, as the server would have: the answer ends before the earliest one
        matcher: StopMatcher | None = None
        tail = ""  # text let through once the stream is closed (what the matcher held at the end)
        # what the cloud sent, in tokens: each piece at least one (a server sends about one token an
        # event), else ~4 characters a token; the call's count when the stream is closed at a stop
        # sequence before the cloud's own count, sent last, arrives
        received = 0
        other = ""  # the start of what came that is no event (an error's JSON, a mislabelled body)
        try:
            async with AsyncExitStack() as stack:
                resp, sent = await self._post(ep, model, messages, params, stack)
                if params.stop and "stop" not in sent:
                    matcher = StopMatcher(tuple(params.stop))
                ctype = resp.headers.get("content-type", "").split(";")[0].strip().lower()
                if ctype == "application/json":  # a server that ignores "stream": true
                    # bounded as a whole, as the head is: httpx's read timeout bounds each read, so
                    # a body that trickled in (a byte a second) held the request for days
                    async with _trickle_bound(2 * self.read_timeout_s,
                                              f"timeout talking to {ep.base_url}: no whole answer"):
                        resp, cut = await _read_capped(resp, MAX_BODY_BYTES)
                    if cut:
                        raise _Retryable(f"the answer from {ep.base_url} is over {MAX_BODY_BYTES >> 20} MiB "
                                         "(not an answer to this request; not read further)")
                    whole, final = _read_completion(resp, ep.base_url)
                    if matcher is not None:
                        text, hit = matcher.feed(whole.text)
                        whole = Delta(text if hit else text + matcher.flush())
                        if hit:  # the cloud's usage stays as it is: what it generated and bills
                            final.finish_reason = "stop"
                    if whole.text:
                        yield whole
                    yield final
                    return
                if ctype == "text/html":
                    raise _EndpointDown(f"{ep.base_url} answered a web page (text/html), not an event "
                                        "stream: is cloud_url the base URL of an OpenAI-compatible "
                                        "server? (a network's sign-in page does this too)", status=200,
                                        cause=f"a web page (text/html) from {ep.base_url}")
                # closed here, on this loop: left to the garbage collector, a stream broken off
                # mid-answer finalized after the loop had stopped ("Task was destroyed but it
                # is pending!" on stderr)
                lines = await stack.enter_async_context(aclosing(_lines(resp, ep.base_url)))
                # the longest wait for the next event: read_timeout_s until the first token, then
                # stall_timeout_s (read_timeout_s when that is None). Only events restart it: any
                # byte restarts httpx's read timeout, so a server that sent keepalive comments
                # (": ping") and no token held the call for ever
                quiet, stalls = self.read_timeout_s, False  # stalls: the stall timeout applies
                clock = asyncio.get_running_loop().time
                last_event = clock()
                pinged = False  # lines that are no event (keepalives) came since the last event
                events = False  # a "data:" line came: else what came is kept (its start) to say what it was
                # the event being read: its "data:" lines (an event's JSON may span several, joined
                # by line breaks as the SSE standard says) and its "event:" type ("error": its data
                # is the server's error, not a chunk)
                pending: list[str] = []
                pending_size, kind = 0, ""
                while True:
                    try:
                        line = await asyncio.wait_for(
                            anext(lines), None if quiet is None else last_event + quiet - clock())
                    except StopAsyncIteration:
                        if pending and finish is None:  # it ended in the middle of an event
                            data = "\n".join(pending)
                            if kind == "error":
                                raise _Retryable(f"the cloud reported an error mid-stream: "
                                                 f"{data[:200]}") from None
                            raise _Retryable(f"malformed event from {ep.base_url} (the stream ended in "
                                             f"it): {data[:80]!r}") from None
                        break
                    except TimeoutError:
                        if finish is not None:  # the answer is whole: only its count and [DONE] are late
                            break
                        if stalls:
                            raise _Retryable(f"the stream from {ep.base_url} stalled: no event for "
                                             f"{quiet:g} s") from None
                        raise _Retryable(f"timeout talking to {ep.base_url}: no event within {quiet:g} s "
                                         f"({'keepalives only' if pinged else 'ReadTimeout'})") from None
                    field, _, value = line.partition(":")
                    value = value.strip()
                    if field == "event":
                        kind = value
                    if field == "error" and value:  # llama.cpp's server: "error: {...}", no data line
                        pending, kind = [value], "error"
                    elif field == "data" and (value or pending):  # (an empty one alone: a keepalive)
                        pending.append(value)
                        pending_size += len(value)
                        if pending_size > MAX_LINE_CHARS:
                            raise _Retryable(f"the stream from {ep.base_url} sent an event over "
                                             f"{MAX_LINE_CHARS >> 20} M characters; not read further")
                    elif line or not pending:  # no event: a comment (": ping"), an id:, event: ...
                        kind = kind if line else ""  # a blank line ends the event, its type too
                        pinged = pinged or bool(line)
                        if not events and len(other) < MAX_ERROR_BYTES:
                            other += line[:MAX_ERROR_BYTES] + "\n"
                        continue
                    events, pinged = True, False
                    last_event = clock()
                    data = "\n".join(pending)
                    if data == "[DONE]":
                        done = True
                        break
                    try:
                        event: Any = json.loads(data)
                    except ValueError:
                        if field == "data":  # its JSON may go on in the next "data:" line
                            continue
                        event = None  # not JSON: an error event's text is its message
                    error_event = kind == "error"
                    pending, pending_size, kind = [], 0, ""
                    said = event.get("error") if isinstance(event, dict) else None
                    if error_event or said:  # OpenAI's {"error": {...}} chunk, or an error event
                        said = str(said or (data if event is None else event))[:200]
                        if finish is not None:  # the answer is whole already
                            log.info("the cloud at %s reported an error after the answer's end: %s",
                                     ep.base_url, said)
                            break
                        raise _Retryable(f"the cloud reported an error mid-stream: {said}")
                    try:
                        if event is None:
                            raise ValueError("not JSON")
                        texts, ended, counted = _read_event(event)
                    except (ValueError, TypeError, AttributeError) as exc:  # not the OpenAI shape
                        if finish is not None:  # after the answer's end: it was shown whole already
                            log.info("ignored a malformed event from %s after the answer's end: %r",
                                     ep.base_url, data[:80])
                            break
                        raise _Retryable(f"malformed event from {ep.base_url}: {data[:80]!r}") from exc
                    usage = counted or usage
                    finish = ended or finish
                    hit = False
                    for text in texts:
                        if self.stall_timeout_s is not None:
                            quiet, stalls = self.stall_timeout_s, True
                        received += estimate_text_tokens(text)  # ~4 characters a token
                        if matcher is not None:
                            text, hit = matcher.feed(text)
                            if hit:
                                tail = text  # passed on once the stream is closed
                                break
                        if text:
                            yield Delta(text)
                    if hit:
                        # a stop sequence: the answer is over for the caller. The stream is closed
                        # now (leaving the block), not read to its end, so the cloud's count, sent
                        # last, does not come: the call is counted from what the cloud sent, the
                        # text past the stop included (the prompt estimated, ~4 characters a
                        # token), short only of what it generated after this event before it saw
                        # the connection close
                        finish, done = "stop", True
                        if usage is None:
                            usage = Usage(estimate_tokens(messages), received)
                        break
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise self._unreachable(ep, exc) from exc
        except (httpx.TransportError, httpx.DecodingError) as exc:
            # DecodingError: a body its content-encoding cannot decode (a proxy's broken gzip): it
            # escaped as httpx's own error, a traceback, not an answer from the device
            if finish is None:
                what = ("timeout talking to" if isinstance(exc, httpx.TimeoutException)
                        else "an undecodable answer from" if isinstance(exc, httpx.DecodingError)
                        else "cannot reach")
                raise _Retryable(f"{what} {ep.base_url} ({type(exc).__name__})") from exc
            # the connection broke after the answer's finish_reason (before its count or [DONE]): the
            # answer is whole and was shown; failing it would have the device append to it
            log.info("the stream from %s broke after the answer's end (%s)", ep.base_url,
                     type(exc).__name__)
        if not done and finish is None:
            # the connection closed cleanly in the middle of the answer: never pass off a
            # truncated answer as finished
            raise _Retryable(f"the stream from {ep.base_url} ended before the answer did"
                             + _not_events(other))
        if matcher is not None:  # the end of an answer with no stop sequence: what was held back
            tail += matcher.flush()
        if tail:
            yield Delta(tail)
        yield Delta("", finish_reason=_finish_reason(finish), usage=usage or Usage())

    def _unreachable(self, ep: Endpoint, exc: Exception) -> _EndpointDown:
        """A connection that could not be made (refused, timed out, a name that does not resolve)."""
        import httpx

        if isinstance(exc, httpx.ConnectTimeout):
            why = f"no connection within {self.connect_timeout_s:g} s (ConnectTimeout)"
        else:
            why = f"{str(exc)[:120] or 'the connection failed'} ({type(exc).__name__})"
        return _EndpointDown(f"The cloud at {ep.base_url} cannot be reached: {why}",
                             cause=f"{why} to {ep.base_url}")

    def _warn_once(self, url: str, status: int, message: str) -> None:
        """A status that says the endpoint is misconfigured: a warning the first time per endpoint,
        so it stays visible though the device answers."""
        if (url, status) in self._warned:
            return
        self._warned.add((url, status))
        log.warning("%s; the device answers instead (logged once for %s)", message, url)

    def _raise_for_status(self, resp: Any, url: str = "", *, listing: bool = False) -> None:
        """Raise what a non-200 answer means (see the module's docstring). ``listing``: the answer
        to GET /models, which carries no request of the caller's to refuse."""
        status = resp.status_code
        message, code = _error_of(resp)
        try:
            where = str(resp.request.url)
        except RuntimeError:  # a response built without its request
            where = url
        cause = f"HTTP {status} from {where}"
        if status in RETRY_STATUS or status >= 500:
            raise _Retryable(f"HTTP {status}: {message}", status=status, cause=cause,
                             retry_after=retry_after_of(resp.headers))
        if status in (401, 403):
            raise CloudAuthError(
                f"The cloud refused the API key (HTTP {status}); set HYBRIDLLM_CLOUD_API_KEY "
                "or pass cloud_api_key=...", status_code=status)
        if not listing and status == 400 and (code == "context_length_exceeded"
                                              or CONTEXT_WORDS.search(message)):
            raise CloudUnavailableError(f"the cloud's context window cannot take this prompt (HTTP 400 "
                                        f"context_length_exceeded: {message})", status_code=400)
        if not listing and status == 400:
            raise InvalidRequestError(f"The cloud rejected the request (HTTP 400): {message}")
        if not listing and status == 422 and not (code == "context_length_exceeded"
                                                  or WINDOW_422_WORDS.search(message)):
            raise InvalidRequestError(f"The cloud rejected the request (HTTP 422, unprocessable): "
                                      f"{message}")
        if not listing and status in (413, 422):  # too large, or too long for its context window
            what = "too large" if status == 413 else "too long for its context window"
            text = f"The cloud at {where} answered HTTP {status} (request {what}): {message}"
            self._warn_once(url or where, status, text)
            raise CloudUnavailableError(text, status_code=status)
        if 300 <= status < 400:
            raise _EndpointDown(f"The cloud at {where} answered HTTP {status}, a redirect to "
                                f"{resp.headers.get('location') or 'nowhere'}: set cloud_url to the "
                                "address it points to (redirects are not followed)", status=status,
                                cause=f"{cause}, a redirect")
        raise _EndpointDown(f"The cloud at {where} answered HTTP {status}: {message} (is cloud_url the "
                            "base URL of an OpenAI-compatible server?)", status=status, cause=cause)

    async def aclose(self) -> None:
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()
        self.close()

    def close(self) -> None:
        """Close every loop's client (a loop that is still running closes its own)."""
        clients, self._clients = self._clients, {}
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for loop, client in clients.items():
            if loop.is_closed():
                continue
            if loop is current:
                loop.create_task(client.aclose())
                continue
            if loop.is_running():
                try:
                    asyncio.run_coroutine_threadsafe(client.aclose(), loop).result(timeout=5)
                except Exception:  # noqa: BLE001 - closing is best effort
                    pass
            else:
                loop.run_until_complete(client.aclose())


def _error_of(resp: Any) -> tuple[str, str]:
    """(message, code) of an error answer: OpenAI's ``{"error": {"message", "code"}}``, else its
    text (a proxy's page, FastAPI's ``{"detail": ...}``)."""
    try:
        error = resp.json().get("error")
    except (ValueError, AttributeError):  # not JSON, or JSON that is not an object
        error = None
    if isinstance(error, dict):
        return str(error.get("message") or error)[:300], str(error.get("code") or "")
    if isinstance(error, str):
        return error[:300], ""
    return " ".join(resp.text[:200].split()), ""


def _refused_fields(resp: Any, body: dict) -> frozenset[str]:
    """The fields of ``body`` that a 400 or 422 refuses and that the request can do without: an
    OPTIONAL_FIELDS one the server does not know (named anywhere in the answer: a 422 may list
    several), or a MODEL_FIELDS one the model does not take (named by the error's ``param`` or its
    message, as unsupported). Empty for any other refusal: a bad value of a field it takes ("Invalid
    value for 'temperature'") stays the caller's error."""
    if resp.status_code not in (400, 422):
        return frozenset()
    message, _ = _error_of(resp)
    try:
        error = resp.json().get("error")
        param = str(error.get("param") or "") if isinstance(error, dict) else ""
    except (ValueError, AttributeError):
        param = ""
    refused = set()
    text = f"{message} {param} {resp.text[:2000]}"
    if UNKNOWN_WORDS.search(text):
        refused |= {name for name in OPTIONAL_FIELDS if name in body and _names(text, name)}
    if UNSUPPORTED_WORDS.search(message):  # "Unsupported parameter", "Unsupported value"
        refused |= {name for name in MODEL_FIELDS
                    if name in body and (param == name or (not param and _names(message, name)
                                                           and (name not in QUOTED_ONLY
                                                                or _quoted(message, name))))}
    return frozenset(refused)


def _names(text: str, name: str) -> bool:
    """``text`` names the field ``name`` (a whole word: top_p is not top_k, nor max_tokens in
    max_completion_tokens)."""
    return re.search(rf"(?<![A-Za-z0-9_]){name}(?![A-Za-z0-9_])", text) is not None


def _quoted(text: str, name: str) -> bool:
    """``text`` names ``name`` in quotes ('stop', "stop", `stop`), as a field, not as a word."""
    return re.search(rf"['\"`]{name}['\"`]", text) is not None


def _read_event(event: dict) -> tuple[list[str], str | None, Usage | None]:
    """(texts, finish reason, usage) of one stream event; TypeError, ValueError or AttributeError
    when it is not shaped as OpenAI's chunk."""
    usage = _usage_of(event["usage"]) if event.get("usage") else None
    texts, finish = [], None
    for choice in event.get("choices") or []:
        text = (choice.get("delta") or {}).get("content") or ""
        if not isinstance(text, str):
            raise TypeError(f"content is {type(text).__name__}, not text")
        if text:
            texts.append(text)
        if choice.get("finish_reason"):
            finish = str(choice["finish_reason"])
    return texts, finish, usage


def _count(value: object) -> int | None:
    """A token count: a whole number >= 0 (12, 12.0 or "12", as before), else None."""
    if isinstance(value, bool):
        return None
    try:
        n = int(value)  # type: ignore[call-overload]
        whole = isinstance(value, int) or float(value) == n  # type: ignore[arg-type]  # not 12.5
    except (TypeError, ValueError, OverflowError):  # null, "abc", NaN, Infinity, a list
        return None
    return n if whole and n >= 0 else None


def _usage_of(u: object) -> Usage | None:
    """The cloud's count of an answer, or None when it is not OpenAI's shape (a string, a null or
    negative count): ignored with a warning, so the pipeline estimates the call's tokens. Before,
    such a count failed an answer that had come whole (the device then appended to it) or had a
    negative count cut the call's cost."""
    counts = [_count(u.get(k, 0)) for k in ("prompt_tokens", "completion_tokens")] \
        if isinstance(u, dict) else [None]
    if None in counts:
        log.warning("the cloud sent a token count that is not whole numbers (%s); it is ignored and "
                    "the call's tokens are estimated", repr(u)[:120])
        return None
    usage = Usage(*counts)  # type: ignore[arg-type]
    assert isinstance(u, dict)  # (counts came from it)
    energy = u.get("energy")  # our server's extension (cloud_server.energy)
    joules = energy.get("joules") if isinstance(energy, dict) else None
    if isinstance(joules, int | float) and not isinstance(joules, bool) and 0 <= joules < math.inf:
        usage.energy_j = float(joules)
        usage.energy_source = str(energy.get("source") or "server")  # type: ignore[union-attr]
    return usage


def _read_completion(resp: Any, where: str) -> tuple[Delta, Delta]:
    """The text and the final delta of a whole (non-streamed) chat completion."""
    try:
        body = resp.json()
        if body.get("error"):
            raise _Retryable(f"the cloud reported an error: {str(body['error'])[:200]}")
        choice = body["choices"][0]
        text = (choice.get("message") or {}).get("content") or ""
        if not isinstance(text, str):
            raise TypeError(f"content is {type(text).__name__}, not text")
        _, _, usage = _read_event({"usage": body.get("usage")})
    except (ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
        raise _Retryable(f"malformed answer from {where}: {resp.text[:80]!r}") from exc
    return Delta(text), Delta("", finish_reason=_finish_reason(choice.get("finish_reason")),
                              usage=usage or Usage())


# finish_reasons of servers that are not quite OpenAI's, as LiteLLM reads them: cut by the length
# limit (Anthropic's and Gemini's "max_tokens", Mistral's "model_length": its context window), cut
# by a filter (Gemini's "SAFETY"); and an answer the server gave up on (vLLM's "abort", Mistral's
# "error"): not whole, so not passed off as one
LENGTH_WORDS = {"length", "max_tokens", "model_length"}
FILTER_WORDS = {"content_filter", "content_filtered", "safety"}
BROKEN_WORDS = {"abort", "error"}


def _finish_reason(said: object) -> str:
    """The answer's finish_reason: "length" and "content_filter" (a hosted cloud's filter cut the
    answer: it is not whole, so not cached, and the caller is told), under the words of the
    servers above too; any other ("tool_calls", "eos_token", none) is "stop". An answer the cloud
    gave up on ("abort", "error") raises, as a stream that broke off. Before, a filtered answer
    read as "stop", was stored in the semantic cache and replayed as whole (and a cut or aborted
    one from a server with its own words still was)."""
    word = str(said).lower() if said else ""
    if word in BROKEN_WORDS:
        raise _Retryable(f"the cloud gave up on the answer (finish_reason {str(said)[:40]!r})")
    return "length" if word in LENGTH_WORDS else "content_filter" if word in FILTER_WORDS else "stop"


def _not_events(text: str) -> str:
    """What a stream that sent no event sent instead, for its error: the error of a JSON body
    (HTTP 200 with an error, under an event stream's content type or none), else its start."""
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("error"):
        return f": it sent no event but an error: {str(body['error'])[:200]}"
    start = " ".join(text.split())[:80]
    return f": it sent no event but {start!r} (is cloud_url an OpenAI-compatible server?)" if start else ""


async def _read_capped(resp: Any, limit: int) -> tuple[Any, bool]:
    """The answer with at most ``limit`` bytes of its body read (and whether it had more), as a
    response whose ``json()`` and ``text`` work; the streamed one is closed. Its content arrives
    decoded, so the copy leaves out the headers that describe the bytes on the wire."""
    import httpx

    data = bytearray()
    async with aclosing(resp.aiter_bytes()) as chunks:
        async for chunk in chunks:
            data += chunk
            if len(data) > limit:
                break
    await resp.aclose()  # read whole: its connection goes back to the pool; cut off: it is closed
    headers = [(k, v) for k, v in resp.headers.multi_items()
               if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
    return httpx.Response(resp.status_code, headers=headers, content=bytes(data[:limit]),
                          request=resp.request), len(data) > limit


async def _lines(resp: Any, where: str) -> AsyncGenerator[str, None]:
    """The lines of an event stream (ended by LF, CRLF or CR), like httpx's ``aiter_lines`` but
    with a bound: a line over ``MAX_LINE_CHARS`` (a server that sends without line breaks) raises
    instead of growing until memory runs out. A CRLF split between two reads is one line end (an
    empty line more would end an event whose JSON goes on in its next "data:" line)."""
    pending: list[str] = []  # the start of a line not ended yet
    size = 0
    after_cr = False  # the last read ended in CR: an LF first in the next ends no other line
    async with aclosing(resp.aiter_text()) as texts:
        async for text in texts:
            if after_cr and text.startswith("\n"):
                text, after_cr = text[1:], False
            if text:
                after_cr = text.endswith("\r")
            *ended, rest = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
            for line in ended:
                yield "".join(pending) + line
                pending, size = [], 0
            pending.append(rest)
            size += len(rest)
            if size > MAX_LINE_CHARS:
                raise _Retryable(f"the stream from {where} sent a line over {MAX_LINE_CHARS >> 20} M "
                                 "characters (not an event stream); not read further")
    if last := "".join(pending):
        yield last


@asynccontextmanager
async def _trickle_bound(limit: float, what: str) -> AsyncIterator[None]:
    """A bound on a whole step (a head, a model list): httpx's read timeout bounds each read, so a
    server that trickles its bytes one at a time would be waited on for ever. Past ``limit`` the
    step fails as "<what> within <limit> s (its bytes trickled in)", to be retried."""
    try:
        async with asyncio.timeout(limit):
            yield
    except TimeoutError:
        raise _Retryable(f"{what} within {limit:g} s (its bytes trickled in)") from None


async def _sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


def _traced() -> dict[str, str] | None:
    """X-Request-Id of the HTTP request being served (``hybridllm serve``): a question sent to the
    cloud carries it, so one id traces it through both servers."""
    rid = REQUEST_ID.get()
    return None if rid is None else {"X-Request-Id": rid}


def _api_root(url: str) -> str:
    """The endpoint's name: its API root (``.../v1``), without a ``user:password@`` or a query
    string (its parameters go with each request, ``_query_of``: an ``?api-version=`` or a ``?key=``
    was left in the path, ``.../v1?key=S/v1/chat/completions``, and every request failed)."""
    url = split_userinfo(url)[0].split("#", 1)[0].split("?", 1)[0].rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def _query_of(url: str) -> list[tuple[str, str]]:
    """The parameters of ``url``'s query string, sent with each request to that endpoint."""
    from urllib.parse import parse_qsl, urlsplit

    return parse_qsl(urlsplit(url).query, keep_blank_values=True)


def _factory(**kwargs: Any) -> CloudBackend:
    return CloudBackend(**kwargs)


register_backend("cloud", _factory)
