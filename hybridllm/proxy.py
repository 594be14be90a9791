"""`hybridllm serve`: the OpenAI wire format on the device, routed through HybridLLM.

Any app that speaks to OpenAI (the official clients, LangChain, curl) gets hybrid routing by
pointing its base URL here. Each answer says how it was served: the ``x-hybridllm-route`` and
``x-hybridllm-reason`` headers, and a ``hybridllm`` field in the JSON (and in the chunk with the
``finish_reason``; the usage chunk, when asked for, comes after it). Each
answer carries an ``X-Request-Id`` (the client's or a new one), which a question sent to the cloud
carries too (``wire.middleware.RequestId``).

Requests are read and validated exactly as the cloud server does (``hybridllm.wire``: a body
size limit, strict JSON, the same request model and the same OpenAI-shaped 400s), plus an optional
``hybridllm`` object (``{"route": "edge", "cache": false, "cascade": true, "namespace": "t1"}``).
vLLM extensions the device cannot honour (``stop_token_ids``, ``ignore_eos``) are 400s here.
The proxy answers under whatever ``model`` name the request gives (at most 1024 characters: every
chunk repeats it; ``hybridllm.model`` names the model that wrote the answer); ``/v1/models``
lists its names.
A request from a web page (``Origin``) is a 403 unless its origin is allowed (``--allow-origin``);
on loopback, one addressed to another name (``Host``: DNS rebinding) is a 403 unless that name is
allowed (``--allow-host``); and a password in a cloud URL never reaches a client (``public_text``).
A cache hit's usage counts its tokens (OpenAI's meaning); ``hybridllm.tokens_from_cache`` says none
was computed. A 429 or 503 says when to retry (``_proxy_errors._retry_after_s``).
A client that hangs up cancels its answer on the device at once, and a shutdown drains as the cloud
server's does (``wire/shutdown.py``): new requests 503, the ones in flight get the grace period.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request  # the [proxy] (or [server]) extra; this module is imported only to serve
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ._client import AsyncHybridLLM, HybridLLM
from ._exceptions import HybridLLMError
from ._loopback import (
    host_name,  # noqa: F401 - re-exported: test_loopback_serve10 checks proxy.host_name
    is_loopback_origin,
)
from ._pipeline.failures import ForcedCloudOverBudgetError
from ._proxy_answers import _completion_json, _finite, _headers, _sse, _usage_of
from ._proxy_errors import (
    CLOUD_WAIT_MAX_S,  # noqa: F401 - re-exported: test_proxy_retry_after_review14 imports it from here
    DEVICE_WAIT_MAX_S,  # noqa: F401 - re-exported: test_busy_retry_after_proxy9 imports it from here
    NEVER_S,
    DeviceClock,
    _error,
    _sdk_error,
    retry_after,
)
from ._proxy_guards import (
    HostAllowlist,
    LoopbackCORS,
    cross_site,
    serve_hosts,  # noqa: F401 - re-exported: _serve_cli (and tests) import it from here
)
from ._proxy_request import ProxyChatRequest
from ._types import Completion
from .wire import (
    DEFAULT_MAX_BODY_BYTES,
    ChunkWriter,
    WireError,
    decode_json_object,
    error_body,
    is_large,
    parse_request,
    read_body,
)
from .wire.auth import ApiKeyChecker
from .wire.middleware import AnswerUnexpected, RequestId
from .wire.openapi import add_schemas, error_responses, ok_response, request_body
from .wire.responses import ChatCompletion, Health, ModelCard, ModelList, error_event
from .wire.shutdown import (
    SHUTTING_DOWN,
    ClientGone,
    Drain,
    TrackRequests,
    in_background,
    unless_interrupted,
    until_expired,
)
from .wire.sse import EventStreamResponse, client_gone, on_client_disconnect
from .wire.urls import url_hint

logger = logging.getLogger("hybridllm.proxy")
API_KEYS_ENV = "HYBRIDLLM_SERVE_API_KEYS"


def create_app(llm: HybridLLM, *, model_name: str = "hybridllm", api_keys: list[str] | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, allow_origins: list[str] | None = None,
               allow_hosts: list[str] | None = None) -> FastAPI:
    """The proxy's ASGI app. With ``api_keys``, ``/v1`` routes need ``Authorization: Bearer KEY``.
    A request from a web page (an ``Origin`` header) is a 403 unless ``allow_origins`` holds its
    origin (or ``*``); those get CORS headers. With ``allow_hosts`` (``serve_hosts``), a request
    whose Host header names none of them is a 403 (DNS rebinding); None answers any Host.
    ``app.state.drain`` is its shutdown state (``wire.shutdown.GracefulServer`` drains it)."""
    app = FastAPI(title="hybridllm local proxy", docs_url=None, redoc_url=None)
    drain = app.state.drain = Drain(_shutting_down)
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
        message = (f"Invalid URL ({request.method} {request.url.path}){url_hint(request)}"
                   if exc.status_code == 404 else str(exc.detail))
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
            return JSONResponse({"status": "shutting_down"}, status_code=503, headers=_SHUTDOWN_WAIT)
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
                   **error_responses(400, *auth, 408, 413, 429, 500, 502, 503)},
    )
    async def chat(request: Request) -> Any:
        admit(request)
        drain.check_open()
        body = await until_expired(read_body(request, max_body_bytes), drain)

        def decode() -> ProxyChatRequest:
            return parse_request(ProxyChatRequest, decode_json_object(body))

        req = await asyncio.to_thread(decode) if is_large(body) else decode()
        messages, opts = req.chat_messages(), req.chat_options()
        # tools with tool_choice "none" are shown to no model: the device answers them (an agent's
        # last turn, for a text answer), as the library does; refused here, that turn was a 400
        if req.calls_tools(messages) and llm._core.cloud is None and not llm._core._edge_calls_tools():
            raise WireError(f"tools need a model whose chat template lists them, and this server has "
                            f"no cloud and its device model ({llm.edge.model}) has none: start `hybridllm "
                            "serve` with --cloud-url URL (or set cloud_url in its config file or "
                            "HYBRIDLLM_CLOUD_URL), or with a --model whose chat template lists tools "
                            "(qwen2.5-coder-0.5b-instruct); or leave out tools.", param="tools")
        if opts.get("route") == "edge" and req.calls_tools(messages) and not llm._core._edge_calls_tools():
            # the library's refusal names its keyword (route='edge'), with no param
            raise WireError(f"hybridllm.route='edge' cannot take tools: the device model ({llm.edge.model}) "
                            "has no tool format in its chat template, so only the cloud model calls "
                            "them. Leave out hybridllm.route, or the tools (or send tool_choice 'none' "
                            "for a text answer).", param="hybridllm.route")
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
            except WireError:  # the shutdown's 503 goes now, not after the device's step
                in_background(stream.aclose())
                raise
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


# a 503 of the shutdown says when to retry, as every 503 here does: this server knows nothing of
# when it (or another behind the same address) answers again, so the "nothing known" wait, 1 s
_SHUTDOWN_WAIT = {"Retry-After": "1"}


def _shutting_down() -> WireError:
    """The shutdown's 503 (``wire.shutdown.shutting_down``) with its Retry-After."""
    return WireError(SHUTTING_DOWN, status=503, type="server_error", code="server_shutting_down",
                     headers=_SHUTDOWN_WAIT)


_SHUTDOWN_EVENTS = error_event(error_body(SHUTTING_DOWN, "server_error", code="server_shutting_down"))
