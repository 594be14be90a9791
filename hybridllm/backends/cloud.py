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
   server; the time its reader holds a delta is not the server's silence), apart from
   ``read_timeout_s``, which bounds the wait for the first token (keepalive
   comments are no event: they count as quiet, here and before the first token; headers that
   trickle in get ``connect_timeout_s + 2 * read_timeout_s`` in all, a whole answer sent as JSON
   ``2 * read_timeout_s``), and no answer is held in memory
   past a bound (``MAX_BODY_BYTES``, ``MAX_LINE_CHARS``; an error's first ``MAX_ERROR_BYTES``);
8. repeated failures open the endpoint's circuit (a 429 is none: the endpoint answers, and its
   ``Retry-After`` keeps requests away for as long as it asks, no longer), and the client fails fast with
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
import os
from collections.abc import Iterator
from typing import Any

from .._exceptions import ConfigError
from .._masking import split_userinfo
from .._types import GenerationParams, Messages
from .base import Backend, Delta, drain_loop, register_backend
from .circuit import MAX_COOLDOWN_S, CircuitBreaker, Endpoint, check_setting, check_url
from .cloud_http import _api_root, _query_of
from .cloud_retry import CloudCallStream, _Retrying
from .cloud_status import parse_retry_after, retry_after_of  # noqa: F401 - this module's public names
from .refusals import RefusalMemory


class CloudBackend(_Retrying, Backend):
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
        self._found_models: dict[str, str] = {}  # base URL -> the model its GET /models listed
        self._answered: str | None = None  # the model of the latest answer (``model``)
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self._transport = transport
        self._clients: dict[asyncio.AbstractEventLoop, Any] = {}
        self.placer = placer
        # base URL -> (when its Retry-After ends, on awake_clock; the status that asked for it)
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
        """The model's name. Configured (``model=``, cloud_model): that one, every endpoint is asked
        for it. Else each endpoint's own, the first its GET /models lists, and endpoints may serve
        different ones: the model asked for by the latest answer, "cloud" before any. Each answer names
        the model that wrote it (``Delta.model``, which the client's chunks and completion carry):
        as the server's answer names it (``model``: "gpt-4o-2024-08-06" for "gpt-4o"), else this."""
        return self._model or self._answered or "cloud"

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
                priority: str | None = None) -> CloudCallStream:
        """``priority``: "interactive" (the fastest endpoint) or "batch" (the lowest carbon
        intensity), when endpoints carry one (``carbon=``); else balanced by outstanding tokens.
        The stream says whether its request is at an endpoint now (``request_out``)."""
        return CloudCallStream(lambda out: self._astream(messages, params, priority, out))


def _factory(**kwargs: Any) -> CloudBackend:
    return CloudBackend(**kwargs)


register_backend("cloud", _factory)
