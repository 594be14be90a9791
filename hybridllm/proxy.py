"""`hybridllm serve`: the OpenAI wire format on the device, routed through HybridLLM.

Any app that speaks to OpenAI (the official clients, LangChain, curl) gets hybrid routing by
pointing its base URL here. Each answer says how it was served: the ``x-hybridllm-route`` and
``x-hybridllm-reason`` headers, and a ``hybridllm`` field in the JSON (and in the last chunk). Each
answer carries an ``X-Request-Id`` (the client's or a new one), which a question sent to the cloud
carries too (``wire.middleware.RequestId``).

Requests are read and validated exactly as the cloud server does (``hybridllm.wire``: a body
size limit, strict JSON, the same request model and the same OpenAI-shaped 400s), plus an optional
``hybridllm`` object (``{"route": "edge", "cache": false, "cascade": true, "namespace": "t1"}``).
vLLM extensions the device cannot honour (``stop_token_ids``, ``ignore_eos``) are 400s here.
The proxy answers under whatever ``model`` name the request gives; ``/v1/models`` lists its names.
A request from a web page (``Origin``) is a 403 unless its origin is allowed (``--allow-origin``);
on loopback, one addressed to another name (``Host``: DNS rebinding) is a 403 unless that name is
allowed (``--allow-host``); and a password in a cloud URL never reaches a client (``public_text``).
A cache hit's usage counts its tokens (OpenAI's meaning); ``hybridllm.tokens_from_cache`` says none
was computed. A 429 or 503 says when to retry (``_retry_after_s``).
A client that hangs up cancels its answer on the device at once, and a shutdown drains as the cloud
server's does (``wire/shutdown.py``): new requests 503, the ones in flight get the grace period.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request  # the [proxy] (or [server]) extra; this module is imported only to serve
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from ._client import AsyncHybridLLM, HybridLLM
from ._config import public_text  # a route's reason quotes the cloud URL it could not reach
from ._exceptions import (
    CloudAuthError,
    CloudBudgetSpentError,
    CloudError,
    CloudRateLimitError,
    ConfigError,
    ContextWindowExceededError,
    EdgeBusyError,
    HybridLLMError,
    InvalidRequestError,
)
from ._loopback import LOOPBACK_NAMES, host_name, is_loopback, is_loopback_origin
from ._pipeline.failures import ForcedCloudOverBudgetError
from ._pipeline.ports import wait_of
from ._types import Chunk, Completion, estimate_text_tokens, estimate_tokens
from .wire import (
    DEFAULT_MAX_BODY_BYTES,
    ChatCompletionRequest,
    ChunkWriter,
    WireError,
    chat_completion,
    decode_json_object,
    error_body,
    header_value,
    is_large,
    parse_request,
    read_body,
)
from .wire.auth import ApiKeyChecker
from .wire.middleware import AnswerUnexpected, RequestId
from .wire.openapi import add_schemas, error_responses, ok_response, request_body
from .wire.requests import _STREAM_RULE
from .wire.responses import DONE, ChatCompletion, Health, ModelCard, ModelList, error_event
from .wire.shutdown import SHUTTING_DOWN, ClientGone, Drain, TrackRequests, unless_interrupted, until_expired
from .wire.sse import EventStreamResponse, client_gone, on_client_disconnect

logger = logging.getLogger("hybridllm.proxy")
API_KEYS_ENV = "HYBRIDLLM_SERVE_API_KEYS"


class HybridOptions(BaseModel):
    """Routing options of one request (the proxy's own extension of the wire format)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    route: Literal["edge", "cloud"] | None = None
    cache: bool | None = None
    cascade: bool | None = None
    # "" is no namespace (the client refuses it): a 400 naming hybridllm.namespace, and so documented
    namespace: Annotated[str, Field(min_length=1)] | None = None


# a message's content may not be an empty list of parts, and a user turn needs text (the checks of
# ProxyChatRequest._no_empty_turns; "\S": some character that is not white space)
_TEXT = {"type": "string", "pattern": "\\S"}
_TURN_RULE: dict[str, Any] = {
    "properties": {"content": {"not": {"type": "array", "maxItems": 0}}},
    "if": {"properties": {"role": {"const": "user"}}, "required": ["role"]},
    "then": {"properties": {"content": {"anyOf": [
        _TEXT, {"type": "array", "contains": {"properties": {"text": _TEXT}, "required": ["text"]}}]}}},
}


def _schema_extra(schema: dict[str, Any]) -> None:
    schema.update(_STREAM_RULE)
    messages = schema["properties"]["messages"]
    # HybridLLM answers a user: a conversation needs at least one user turn
    messages["contains"] = {"properties": {"role": {"const": "user"}}}
    messages["items"] = {"allOf": [messages["items"], _TURN_RULE]}


class ProxyChatRequest(ChatCompletionRequest):
    model_config = ConfigDict(json_schema_extra=_schema_extra)
    hybridllm: HybridOptions | None = None

    @model_validator(mode="after")
    def _needs_a_user_turn(self) -> ProxyChatRequest:
        if not any(m.role == "user" for m in self.messages):
            raise WireError("The messages hold no user turn: add {'role': 'user', 'content': ...}.",
                            param="messages")
        return self

    @model_validator(mode="after")
    def _no_empty_turns(self) -> ProxyChatRequest:
        """As the library refuses ``chat("")``: a user turn without text, or content that is an empty
        list of parts (which OpenAI refuses too), is a 400 naming the message."""
        for i, m in enumerate(self.messages):
            where = f"messages[{i}].content"
            if isinstance(m.content, list) and not m.content:
                raise WireError(f"{where} is an empty list of content parts: give at least one "
                                "{'type': 'text', 'text': '...'}, or a string.", param=where)
            if m.role == "user" and not m.text().strip():
                raise WireError(f"messages[{i}] is a user turn without text: write the question in "
                                f"its content, or leave the message out.", param=where)
        return self

    @field_validator("stop_token_ids")
    @classmethod
    def _no_stop_ids(cls, value: list[int] | None) -> list[int] | None:
        if value:
            raise ValueError("stop_token_ids are not supported by this server; use 'stop'")
        return value

    @field_validator("ignore_eos")
    @classmethod
    def _no_ignore_eos(cls, value: bool) -> bool:
        if value:
            raise ValueError("ignore_eos is not supported by this server")
        return value

    def chat_options(self) -> dict[str, Any]:
        """Keyword options for ``HybridLLM.chat``: sampling, then routing."""
        opts: dict[str, Any] = {
            "max_tokens": self.output_limit(),
            "temperature": self.temperature,
            "top_p": self.top_p,
            # the wire's -1 ("off", vLLM) is the client's 0
            "top_k": None if self.top_k is None else max(self.top_k, 0),
            "min_p": self.min_p,
            "repeat_penalty": self.repetition_penalty,
            "seed": self.seed,
            "stop": tuple(self.stop_list()) if self.stop is not None else None,
        }
        opts = {k: v for k, v in opts.items() if v is not None}
        if self.hybridllm is not None:
            opts.update(self.hybridllm.model_dump(exclude_none=True))
        return opts


def status_of(exc: HybridLLMError) -> tuple[int, str, str]:
    """(HTTP status, OpenAI error type, message) for an error of the SDK."""
    if isinstance(exc, InvalidRequestError | ConfigError):
        return 400, "invalid_request_error", str(exc)
    if isinstance(exc, CloudAuthError):
        return 502, "upstream_auth_error", (
            "The cloud refused this proxy's API key; set the key `hybridllm serve` sends to the "
            "cloud (cloud_api_key in the config or HYBRIDLLM_CLOUD_API_KEY)."
        )
    if isinstance(exc, CloudBudgetSpentError):
        # the budget's sentence (when there is room again) and the prompt's numbers: the operator's
        # own limits, nothing of the upstream
        return 429, "requests", str(exc)
    if isinstance(exc, EdgeBusyError):
        return 429, "requests", "The device model is busy; retry shortly."
    if isinstance(exc, CloudRateLimitError):  # the cloud's 429: its wait is the Retry-After
        if exc.prompt_tokens is not None:  # the device could not answer in the cloud's place
            return 429, "requests", (
                f"The cloud is rate-limiting this server, and the prompt ({exc.prompt_tokens} tokens) is "
                f"past the device model's context ({exc.context_length}, n_ctx), so the device cannot "
                "answer it instead; retry when the Retry-After header says.")
        return 429, "requests", "The cloud is rate-limiting this server; retry shortly."
    if isinstance(exc, CloudError):
        if exc.prompt_tokens is not None:  # the device could not answer in the cloud's place
            return 503, "upstream_unavailable", (
                f"The cloud is unavailable, and the prompt ({exc.prompt_tokens} tokens) is past the "
                f"device model's context ({exc.context_length}, n_ctx), so the device cannot answer it "
                "instead; retry shortly.")
        return 503, "upstream_unavailable", "The cloud is unavailable; retry shortly."
    return 500, "server_error", "The server had an error while processing your request."


def code_of(exc: BaseException) -> str | None:
    """OpenAI's error ``code`` for an error of the SDK that has one."""
    if isinstance(exc, ContextWindowExceededError):
        return "context_length_exceeded"  # the code OpenAI's clients (and LiteLLM) look for
    if isinstance(exc, CloudBudgetSpentError):
        return "cloud_budget_spent"  # a 429: wait and retry, the prompt is fine
    if isinstance(exc, CloudRateLimitError):
        return "cloud_rate_limited"  # a 429 of the cloud's, not of this server's device or budget
    return None


def _error(status: int, message: str, etype: str, param: str | None = None,
           code: str | None = None, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, etype, param=param, code=code), status, headers=headers)


def _sdk_error(exc: HybridLLMError, llm: HybridLLM, device: DeviceClock) -> JSONResponse:
    status, etype, message = status_of(exc)
    if status >= 500:
        logger.error("request failed: %s", type(exc).__name__)
    headers = None
    if status in (429, 503):
        headers = {"Retry-After": str(_retry_after_s(exc, llm, device))}
    return _error(status, message, etype, code=code_of(exc), headers=headers)


DEVICE_WAIT_MAX_S = 60  # past a minute a queue estimate is a guess; the client asks again then
CLOUD_WAIT_MAX_S = 300  # the longest the cloud backend leaves an endpoint alone (COOL_MAX_S)
NEVER_S = 3600  # a budget that never has room (a limit of 0): ask again in an hour


def _retry_after_s(exc: HybridLLMError, llm: HybridLLM, device: DeviceClock) -> int:
    """Retry-After (whole seconds, rounded up, at least 1) for a 429 or 503, from what is known:
    - a spent budget: when its sliding windows have room again (the error's, else the ledger's);
    - a busy device: the queue ahead served one answer at a time, (waiting + the running one) x
      the device's recent time per answer (``DeviceClock``; 1 s before one is timed), at most
      ``DEVICE_WAIT_MAX_S``;
    - the cloud: its own Retry-After or its circuit's cooldown (the error's, else the soonest
      endpoint's), at most ``CLOUD_WAIT_MAX_S``; 1 s when nothing is known."""
    wait: float | None
    if isinstance(exc, CloudBudgetSpentError):
        wait = exc.retry_after_s
        if wait is None:
            wait = wait_of(llm._core.ledger)
        return _whole_s(wait, unknown=NEVER_S)
    if isinstance(exc, EdgeBusyError):
        ahead = llm._core.edge_worker.num_waiting + 1
        wait = ahead * (device.service_s or 1.0)
        return _whole_s(wait, unknown=1, cap=DEVICE_WAIT_MAX_S)
    wait = exc.retry_after_s if isinstance(exc, CloudError) else None
    if wait is None:
        wait = wait_of(llm._core.cloud)
    return _whole_s(wait, unknown=1, cap=CLOUD_WAIT_MAX_S)


def _whole_s(wait: float | None, *, unknown: int, cap: int | None = None) -> int:
    """``wait`` in whole seconds, rounded up, at least 1 and at most ``cap``; ``unknown`` for None
    or NaN. A custom cloud's ``retry_after_s()`` (or its error's) may say inf or NaN, which
    ``math.ceil`` refuses: that turned the 429/503 into a 500. inf is "very long": ``cap``, or
    ``unknown`` where there is none (a budget: ask again in an hour); -inf is no wait."""
    if wait is None or math.isnan(wait) or (cap is None and wait == math.inf):
        return unknown
    return max(1, math.ceil(min(max(wait, 0.0), math.inf if cap is None else cap)))


class DeviceClock:
    """The device model's recent time per answer, for a busy device's Retry-After."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.service_s: float | None = None
        self._last_end: float | None = None

    def record(self, c: Completion) -> None:
        if c.route.split(" ")[0] != "edge":  # "edge", "edge (cloud unavailable)": the device alone
            return
        now = self.clock()
        latency = c.latency_ms / 1000
        # the device answers one request at a time: it started this one when the request came or
        # when the previous answer ended, whichever was later, so the answer took the smaller of
        # its latency and the time since that end (a wait in the queue is not the device's time)
        took = latency if self._last_end is None else min(latency, now - self._last_end)
        self._last_end = now
        # a moving average: the newest answer weighs a quarter, so the estimate follows load
        self.service_s = took if self.service_s is None else 0.75 * self.service_s + 0.25 * took


def retry_after(part: Any, *, never: int) -> str:
    """Retry-After from ``part.retry_after_s()`` (the budget ledger: when its sliding windows have
    room again; the cloud backend: when an endpoint's circuit lets a request through), in whole
    seconds rounded up, at least 1; ``never`` when it says None or cannot say."""
    return str(_whole_s(wait_of(part), unknown=never))


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinity (in dicts and lists too) made None: JSON has no such
    number. A custom router's NaN score or a custom cloud's NaN cost or energy made a finished
    answer a 500 (``JSONResponse`` refuses them) and a stream's last chunk a bare ``NaN`` that no
    client but Python's can parse; null is "not known", as an absent score is."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _trace(c: Completion, usage: Mapping[str, int] | None = None) -> dict[str, Any]:
    return _finite({
        "route": c.route, "reason": public_text(c.reason), "score": c.score,
        "cache_similarity": c.cache_similarity, "latency_ms": round(c.latency_ms, 1),
        "ttft_ms": None if c.ttft_ms is None else round(c.ttft_ms, 1),
        "cost_usd": c.cost_usd,
        # the usage's tokens that came out of the semantic cache: none was computed or paid for
        "tokens_from_cache": usage["total_tokens"] if c.route == "cache" and usage else None})


def _count_cache_hit(edge: Any, messages: list[dict[str, str]], text: str) -> dict[str, int]:
    """OpenAI usage of a cache hit: its prompt and answer in the device model's tokens, what the
    device would have reported had it answered (the library's Completion says 0/0: nothing ran).
    The answer's tokens are those it adds as the start of the model's own turn (``prefix``);
    without a tokenizer, about 4 characters a token."""
    estimate = estimate_text_tokens(text)
    try:
        tokenize = getattr(edge, "tokenize", None)
        if tokenize is not None:
            prompt = len(tokenize(messages))
            completion = len(tokenize(messages, prefix=text)) - prompt if text else 0
        else:
            prompt = edge.count_tokens(messages)
            completion = estimate
    except Exception as exc:  # noqa: BLE001 - a count must not fail an answer; closed model, ...
        logger.warning("could not count a cache hit's tokens: %s", type(exc).__name__)
        prompt, completion = None, estimate
    if not isinstance(prompt, int):
        prompt = estimate_tokens(messages)
    completion = max(completion, 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


async def _usage_of(c: Completion, edge: Any, messages: list[dict[str, str]]) -> dict[str, int]:
    if c.route != "cache":
        return c.usage.to_dict()
    return await asyncio.to_thread(_count_cache_hit, edge, messages, c.text)


def _headers(route: str, reason: str | None = None) -> dict[str, str]:
    """Route headers; the reason may quote an error, so it is made one printable ASCII line."""
    h = {"x-hybridllm-route": header_value(route)}
    if reason:
        h["x-hybridllm-reason"] = header_value(public_text(reason))
    return h


class LoopbackCORS(CORSMiddleware):
    """CORS for the origins allowed and for every page served from this machine (a local chat UI on
    http://localhost:3000, http://127.0.0.2:8000): the same test as the Origin check
    (``is_loopback_origin``). A hostile site's page has its own origin, whatever address it makes
    the browser call."""

    def is_allowed_origin(self, origin: str) -> bool:
        return is_loopback_origin(origin) or super().is_allowed_origin(origin)


def cross_site(origin: str) -> WireError:
    """The refusal of a request a web page sent (browsers add ``Origin``; programs do not). A page
    on any site the user visits can POST to 127.0.0.1 without asking first (a "simple" request,
    ``text/plain``): unrefused, it would use the device and force the operator's cloud."""
    shown = header_value(origin, 200)
    return WireError(f"This server does not answer requests from web pages (Origin: {shown}): any site "
                     "could otherwise use it. To let this page call it, start `hybridllm serve` with "
                     f"--allow-origin {shown}.", status=403, code="origin_not_allowed")


def serve_hosts(bound: str, allowed: list[str]) -> list[str] | None:
    """The Host names ``hybridllm serve`` answers when bound to ``bound`` (None: any).

    On loopback a DNS-rebinding page (a site whose name the attacker points at 127.0.0.1 after the
    page loaded) is same-origin to the browser, so it sends no ``Origin`` and can read GET answers;
    its requests still carry the site's name as Host. So: the loopback names, the bound address and
    ``allowed`` (a reverse proxy's public name). On another address the operator exposed the server
    to a network that reaches it under names and addresses this process cannot know: any Host,
    unless ``allowed`` names some; ``*`` is any Host."""
    if "*" in allowed:
        return None
    try:
        address = ipaddress.ip_address(host_name(bound))
    except ValueError:
        address = None
    if not is_loopback(bound) and not allowed:
        return None
    names = [*LOOPBACK_NAMES, *allowed]
    if address is not None and not address.is_unspecified:  # 0.0.0.0 is no name a client uses
        names.append(str(address))
    return list(dict.fromkeys(host_name(n) for n in names))


def wrong_host(host: str, allowed: list[str]) -> WireError:
    shown = header_value(host, 200)
    return WireError(
        f"This server does not answer requests addressed to {shown!r} (the Host header): a web page "
        f"could otherwise read it through DNS rebinding. It answers {', '.join(allowed)}. If clients "
        f"reach it under that name (a reverse proxy, a LAN name), start `hybridllm serve` with "
        f"--allow-host {host_name(shown) or shown}.", status=403, code="host_not_allowed")


class HostAllowlist:
    """ASGI middleware: a request whose Host header names none of ``hosts`` is a 403, on every
    path. A request without Host (HTTP/1.0) is let through: every browser sends one. A list that
    holds a loopback name admits every loopback address (``is_loopback``: 127.0.0.2 too): a page
    whose Host is such an address was itself served from this machine, no rebinding site."""

    def __init__(self, app: ASGIApp, hosts: list[str]) -> None:
        self.app = app
        self.hosts = {host_name(h) for h in hosts}
        self.shown = list(dict.fromkeys(hosts))
        self.loopback = any(is_loopback(h) for h in hosts)

    def admits(self, host: str) -> bool:
        return host_name(host) in self.hosts or (self.loopback and is_loopback(host))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
            if host is not None and not self.admits(host):
                response = JSONResponse(wrong_host(host, self.shown).body(), 403)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(llm: HybridLLM, *, model_name: str = "hybridllm", api_keys: list[str] | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, allow_origins: list[str] | None = None,
               allow_hosts: list[str] | None = None) -> FastAPI:
    """The proxy's ASGI app. With ``api_keys``, ``/v1`` routes need ``Authorization: Bearer KEY``.
    A request from a web page (an ``Origin`` header) is a 403 unless ``allow_origins`` holds its
    origin (or ``*``); those get CORS headers. With ``allow_hosts`` (``serve_hosts``), a request
    whose Host header names none of them is a 403 (DNS rebinding); None answers any Host.
    ``app.state.drain`` is its shutdown state (``wire.shutdown.GracefulServer`` drains it)."""
    app = FastAPI(title="hybridllm local proxy", docs_url=None, redoc_url=None)
    drain = app.state.drain = Drain()
    allm = AsyncHybridLLM.wrap(llm)
    # a library caller that forces the cloud spends its own budget; an HTTP client must not spend
    # past the operator's (max_cloud_calls_per_hour, ...): refused with 429, never sent, and held
    # by the same reservation as routed requests, so concurrent forced requests cannot overshoot
    llm._core.budget_binds_forced_cloud = True
    created = int(time.time())
    checker = ApiKeyChecker(api_keys or [])
    origins = [o.rstrip("/") for o in allow_origins or []]
    auth = (401, 403) if checker.is_enabled else (403,)
    device = app.state.device_clock = DeviceClock()

    def admit(request: Request) -> None:
        origin = request.headers.get("origin")
        if (origin is not None and origin.rstrip("/") not in origins and "*" not in origins
                and not is_loopback_origin(origin)):
            raise cross_site(origin)
        checker.check(request.headers.get("authorization"))

    defs: dict[str, Any] = {}

    @app.exception_handler(WireError)
    async def on_wire_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, WireError)
        headers = dict(exc.headers)  # a 408's Connection: close (WireError sets it)
        if exc.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return JSONResponse(exc.body(), exc.status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        message = (f"Invalid URL ({request.method} {request.url.path})" if exc.status_code == 404
                   else str(exc.detail))
        return _error(exc.status_code, message, "invalid_request_error", headers=exc.headers)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.error("internal error: %s", type(exc).__name__)
        return _error(500, "The server had an error while processing your request.", "server_error")

    # HEAD as well as GET, as the cloud server answers (a monitor's `curl -I` probe got 405)
    @app.head("/health", include_in_schema=False)
    @app.get("/health", responses={200: {"model": Health}, 503: {"model": Health}})
    async def health() -> JSONResponse:
        if drain.is_closing:  # a supervisor or load balancer stops sending here
            return JSONResponse({"status": "shutting_down"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/stats", responses=error_responses(*auth))
    async def stats(request: Request) -> dict[str, Any]:
        admit(request)
        return _finite(llm.stats())  # a cloud's NaN energy stays in its totals: null, not a 500

    ids = list(dict.fromkeys([model_name, llm.edge.model]))

    def card(model_id: str) -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": created, "owned_by": "hybridllm"}

    @app.get("/v1/models", response_model=ModelList, responses=error_responses(*auth))
    async def models(request: Request) -> dict[str, Any]:
        admit(request)
        return {"object": "list", "data": [card(i) for i in ids]}

    # the openai client's models.retrieve(); a name the list does not hold is OpenAI's 404
    @app.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=error_responses(*auth, 404))
    async def model(request: Request, model_id: str) -> dict[str, Any]:
        admit(request)
        if model_id not in ids:
            raise WireError(f"The model '{model_id}' does not exist; this server lists "
                            f"{', '.join(repr(i) for i in ids)} (GET /v1/models).",
                            status=404, param="model", code="model_not_found")
        return card(model_id)

    @app.post(
        "/v1/chat/completions",
        openapi_extra=request_body(ProxyChatRequest, defs,
                                   neutral_only={"ignore_eos": False, "stop_token_ids": []}),
        responses={**ok_response(ChatCompletion, streams=True),
                   **error_responses(400, *auth, 413, 429, 500, 502, 503)},
    )
    async def chat(request: Request) -> Any:
        admit(request)
        drain.check_open()
        body = await until_expired(read_body(request, max_body_bytes), drain)

        def decode() -> ProxyChatRequest:
            return parse_request(ProxyChatRequest, decode_json_object(body))

        req = await asyncio.to_thread(decode) if is_large(body) else decode()
        messages, opts = req.chat_messages(), req.chat_options()
        if opts.get("route") == "cloud" and llm._core.cloud is None:
            # the library's own refusal says "pass cloud_url=...", a keyword no HTTP client or
            # operator of this server can pass: name the server's setting
            raise WireError("hybridllm.route='cloud' needs a cloud endpoint, and this server has "
                            "none: start `hybridllm serve` with --cloud-url URL (or set cloud_url "
                            "in its config file or HYBRIDLLM_CLOUD_URL), or leave out "
                            "hybridllm.route to be answered on the device.", param="hybridllm.route")
        try:
            if not req.stream:
                c = await unless_interrupted(request, allm.chat(messages, **opts), drain)
                device.record(c)
                usage = await _usage_of(c, llm.edge, messages)
                return JSONResponse(_completion_json(c, req.model, usage),
                                    headers=_headers(c.route, c.reason))
            stream = allm.stream(messages, **opts)
            chunks = stream.__aiter__()
            try:  # routing is decided with the first chunk: the header can say where
                first = await unless_interrupted(request, chunks.__anext__(), drain)
            except BaseException:
                await stream.aclose()
                raise
        except ForcedCloudOverBudgetError as exc:
            return _error(429, f"This server's cloud budget is spent ({exc.reason}); retry later, or "
                          "leave out hybridllm.route='cloud' to be answered on the device.",
                          "requests", code="cloud_budget_spent",
                          headers={"Retry-After": retry_after(llm._core.ledger, never=NEVER_S)})
        except HybridLLMError as exc:
            return _sdk_error(exc, llm, device)
        except ClientGone:
            return client_gone()
        writer = ChunkWriter(id=f"chatcmpl-{uuid.uuid4().hex[:24]}", created=int(time.time()),
                             model=req.model, chat=True, include_usage=req.include_usage())

        async def usage_of(c: Completion) -> dict[str, int]:
            device.record(c)
            return await _usage_of(c, llm.edge, messages)

        sse = _sse(first, stream, chunks, writer, usage_of)
        # the response cancels the stream (and the device's work) when the client hangs up or the
        # shutdown's grace period ends; then the client reads an in-band error and [DONE]
        return EventStreamResponse(sse, _headers(first.route),
                                   stop=drain.expired, last_events=_SHUTDOWN_EVENTS)

    app.add_exception_handler(ClientDisconnect, on_client_disconnect)
    app.add_middleware(AnswerUnexpected, handler=on_unexpected)  # innermost: just outside the routes
    app.add_middleware(TrackRequests, drain=drain)
    # the pages allowed may read the answers (and ask first: a preflight OPTIONS). Any request
    # header: the openai JS client sends x-stainless-* (and others their own), and a preflight
    # naming one was a 400; so was Chrome's for a public page calling this private address
    # (Private Network Access). The origin is the gate, and the key is still checked.
    app.add_middleware(LoopbackCORS, allow_origins=origins, allow_methods=["GET", "POST"],
                       allow_headers=["*"], allow_private_network=True,
                       expose_headers=["x-hybridllm-route", "x-hybridllm-reason", "retry-after",
                                       "x-request-id"])
    if allow_hosts is not None:  # a rebinding page's request reaches nothing else
        app.add_middleware(HostAllowlist, hosts=allow_hosts)
    # outermost: every answer (a 403 above too) carries X-Request-Id; a question the cloud answers
    # carries it there (backends.cloud), and the error lines written meanwhile name it
    app.add_middleware(RequestId, log_names=("hybridllm.proxy", "hybridllm", "hybridllm.cloud"))

    add_schemas(app, defs)
    return app


_SHUTDOWN_EVENTS = error_event(error_body(SHUTTING_DOWN, "server_error", code="server_shutting_down"))


def _completion_json(c: Completion, model: str, usage: dict[str, int]) -> dict[str, Any]:
    return chat_completion(
        id=f"chatcmpl-{uuid.uuid4().hex[:24]}", created=int(time.time()), model=model,
        text=c.text, finish_reason=c.finish_reason, usage=usage, hybridllm=_trace(c, usage),
    )


async def _sse(first: Chunk, stream: Any, rest: AsyncIterator[Chunk], writer: ChunkWriter,
               usage_of: Callable[[Completion], Awaitable[dict[str, int]]]) -> AsyncIterator[str]:
    yield writer.role()
    chunk: Chunk | None = first
    try:
        while chunk is not None:
            if chunk.text:
                yield writer.text(chunk.text)
            if chunk.completion is not None:
                c = chunk.completion
                usage = await usage_of(c)
                yield writer.finish(c.finish_reason, hybridllm=_trace(c, usage))
                if writer.include_usage:
                    yield writer.usage(usage)
            try:
                chunk = await rest.__anext__()
            except StopAsyncIteration:
                chunk = None
        yield DONE
    except Exception as exc:
        # Headers are sent: report in-band, as OpenAI does; never the exception's own text.
        _, etype, message = status_of(exc if isinstance(exc, HybridLLMError) else HybridLLMError())
        logger.error("stream failed: %s", type(exc).__name__)
        # code: a string or null, as in OpenAI's error objects and the proxy's JSON errors (was the
        # HTTP status, an integer); the type tells a 503 from a 500 here as there
        yield error_event(error_body(message, etype, code=code_of(exc)))
    finally:
        await stream.aclose()
