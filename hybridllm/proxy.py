"""`hybridllm serve`: the OpenAI wire format on the device, routed through HybridLLM.

Any app that speaks to OpenAI (the official clients, LangChain, curl) gets hybrid routing by
pointing its base URL here. Each answer says how it was served: the ``x-hybridllm-route`` and
``x-hybridllm-reason`` headers, and a ``hybridllm`` field in the JSON (and in the last chunk).

Requests are read and validated exactly as the cloud server does (``hybridllm.wire``: a body
size limit, strict JSON, the same request model and the same OpenAI-shaped 400s), plus an optional
``hybridllm`` object (``{"route": "edge", "cache": false, "cascade": true, "namespace": "t1"}``).
vLLM extensions the device cannot honour (``stop_token_ids``, ``ignore_eos``) are 400s here.
The proxy answers under whatever ``model`` name the request gives; ``/v1/models`` lists its names.
A request from a web page (``Origin``) is a 403 unless its origin is allowed (``--allow-origin``),
and a password in a cloud URL never reaches a client (``public_text``).
A client that hangs up cancels its answer on the device at once, and a shutdown drains as the cloud
server's does (``wire/shutdown.py``): new requests 503, the ones in flight get the grace period.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

from fastapi import FastAPI, Request  # the [proxy] (or [server]) extra; this module is imported only to serve
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, field_validator, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

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
from ._pipeline import ForcedCloudOverBudgetError
from ._types import Chunk, Completion
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
from .wire.openapi import add_schemas, error_responses, ok_response, request_body
from .wire.requests import _STREAM_RULE
from .wire.responses import DONE, ChatCompletion, Health, ModelCard, ModelList, error_event
from .wire.shutdown import SHUTTING_DOWN, ClientGone, Drain, TrackRequests, unless_interrupted
from .wire.sse import EventStreamResponse, client_gone, on_client_disconnect

logger = logging.getLogger("hybridllm.proxy")
API_KEYS_ENV = "HYBRIDLLM_SERVE_API_KEYS"


class HybridOptions(BaseModel):
    """Routing options of one request (the proxy's own extension of the wire format)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    route: Literal["edge", "cloud"] | None = None
    cache: bool | None = None
    cascade: bool | None = None
    namespace: str | None = None


def _schema_extra(schema: dict[str, Any]) -> None:
    schema.update(_STREAM_RULE)
    # HybridLLM answers a user: a conversation needs at least one user turn
    schema["properties"]["messages"]["contains"] = {"properties": {"role": {"const": "user"}}}


class ProxyChatRequest(ChatCompletionRequest):
    model_config = ConfigDict(json_schema_extra=_schema_extra)
    hybridllm: HybridOptions | None = None

    @model_validator(mode="after")
    def _needs_a_user_turn(self) -> ProxyChatRequest:
        if not any(m.role == "user" for m in self.messages):
            raise WireError("The messages hold no user turn: add {'role': 'user', 'content': ...}.",
                            param="messages")
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
    if isinstance(exc, CloudRateLimitError):
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
    return None


def _error(status: int, message: str, etype: str, param: str | None = None,
           code: str | None = None, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, etype, param=param, code=code), status, headers=headers)


def _sdk_error(exc: HybridLLMError, llm: HybridLLM) -> JSONResponse:
    status, etype, message = status_of(exc)
    if status >= 500:
        logger.error("request failed: %s", type(exc).__name__)
    wait = "1"
    if isinstance(exc, CloudBudgetSpentError):  # an hour for a budget that never has room (a limit of 0)
        wait = retry_after(llm._core.ledger, never=3600)
    elif status == 503 and isinstance(exc, CloudError):  # when an endpoint's circuit lets one through
        wait = retry_after(llm._core.cloud, never=1)
    return _error(status, message, etype, code=code_of(exc),
                  headers={"Retry-After": wait} if status in (429, 503) else None)


def retry_after(part: Any, *, never: int) -> str:
    """Retry-After from ``part.retry_after_s()`` (the budget ledger: when its sliding windows have
    room again; the cloud backend: when an endpoint's circuit lets a request through), in whole
    seconds rounded up, at least 1; ``never`` when it says None or cannot say."""
    when = getattr(part, "retry_after_s", None)
    wait = when() if when is not None else None
    return str(never if wait is None else max(1, math.ceil(wait)))


def _trace(c: Completion) -> dict[str, Any]:
    return {"route": c.route, "reason": public_text(c.reason), "score": c.score,
            "cache_similarity": c.cache_similarity, "latency_ms": round(c.latency_ms, 1),
            "ttft_ms": None if c.ttft_ms is None else round(c.ttft_ms, 1),
            "cost_usd": c.cost_usd}


def _headers(route: str, reason: str | None = None) -> dict[str, str]:
    """Route headers; the reason may quote an error, so it is made one printable ASCII line."""
    h = {"x-hybridllm-route": header_value(route)}
    if reason:
        h["x-hybridllm-reason"] = header_value(public_text(reason))
    return h


# a page served from this machine (a local chat UI on http://localhost:3000) may call the proxy:
# a hostile site's page has its own origin, whatever address it makes the browser call
LOOPBACK_ORIGIN = re.compile(r"https?://(?:localhost|127\.0\.0\.1|\[::1\])(?::\d{1,5})?")


def cross_site(origin: str) -> WireError:
    """The refusal of a request a web page sent (browsers add ``Origin``; programs do not). A page
    on any site the user visits can POST to 127.0.0.1 without asking first (a "simple" request,
    ``text/plain``): unrefused, it would use the device and force the operator's cloud."""
    shown = header_value(origin, 200)
    return WireError(f"This server does not answer requests from web pages (Origin: {shown}): any site "
                     "could otherwise use it. To let this page call it, start `hybridllm serve` with "
                     f"--allow-origin {shown}.", status=403, code="origin_not_allowed")


def create_app(llm: HybridLLM, *, model_name: str = "hybridllm", api_keys: list[str] | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, allow_origins: list[str] | None = None,
               ) -> FastAPI:
    """The proxy's ASGI app. With ``api_keys``, ``/v1`` routes need ``Authorization: Bearer KEY``.
    A request from a web page (an ``Origin`` header) is a 403 unless ``allow_origins`` holds its
    origin (or ``*``); those get CORS headers. ``app.state.drain`` is its shutdown state
    (``wire.shutdown.GracefulServer`` drains it)."""
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

    def admit(request: Request) -> None:
        origin = request.headers.get("origin")
        if (origin is not None and origin.rstrip("/") not in origins and "*" not in origins
                and not LOOPBACK_ORIGIN.fullmatch(origin)):
            raise cross_site(origin)
        checker.check(request.headers.get("authorization"))

    defs: dict[str, Any] = {}

    @app.exception_handler(WireError)
    async def on_wire_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, WireError)
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
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

    @app.get("/health", responses={200: {"model": Health}, 503: {"model": Health}})
    async def health() -> JSONResponse:
        if drain.is_closing:  # a supervisor or load balancer stops sending here
            return JSONResponse({"status": "shutting_down"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/stats", responses=error_responses(*auth))
    async def stats(request: Request) -> dict[str, Any]:
        admit(request)
        return llm.stats()

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
        body = await read_body(request, max_body_bytes)

        def decode() -> ProxyChatRequest:
            return parse_request(ProxyChatRequest, decode_json_object(body))

        req = await asyncio.to_thread(decode) if is_large(body) else decode()
        messages, opts = req.chat_messages(), req.chat_options()
        try:
            if not req.stream:
                c = await unless_interrupted(request, allm.chat(messages, **opts), drain)
                return JSONResponse(_completion_json(c, req.model), headers=_headers(c.route, c.reason))
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
                          headers={"Retry-After": retry_after(llm._core.ledger, never=3600)})
        except HybridLLMError as exc:
            return _sdk_error(exc, llm)
        except ClientGone:
            return client_gone()
        writer = ChunkWriter(id=f"chatcmpl-{uuid.uuid4().hex[:24]}", created=int(time.time()),
                             model=req.model, chat=True, include_usage=req.include_usage())
        # the response cancels the stream (and the device's work) when the client hangs up or the
        # shutdown's grace period ends; then the client reads an in-band error and [DONE]
        return EventStreamResponse(_sse(first, stream, chunks, writer), _headers(first.route),
                                   stop=drain.expired, last_events=_SHUTDOWN_EVENTS)

    app.add_exception_handler(ClientDisconnect, on_client_disconnect)
    app.add_middleware(TrackRequests, drain=drain)
    # the pages allowed may read the answers (and ask first: a preflight OPTIONS)
    app.add_middleware(CORSMiddleware, allow_origins=origins, allow_origin_regex=LOOPBACK_ORIGIN.pattern,
                       allow_methods=["GET", "POST"],
                       allow_headers=["authorization", "content-type"],
                       expose_headers=["x-hybridllm-route", "x-hybridllm-reason", "retry-after"])

    add_schemas(app, defs)
    return app


_SHUTDOWN_EVENTS = error_event(error_body(SHUTTING_DOWN, "server_error", code="server_shutting_down"))


def _completion_json(c: Completion, model: str) -> dict[str, Any]:
    return chat_completion(
        id=f"chatcmpl-{uuid.uuid4().hex[:24]}", created=int(time.time()), model=model,
        text=c.text, finish_reason=c.finish_reason, usage=c.usage.to_dict(), hybridllm=_trace(c),
    )


async def _sse(first: Chunk, stream: Any, rest: AsyncIterator[Chunk],
               writer: ChunkWriter) -> AsyncIterator[str]:
    yield writer.role()
    chunk: Chunk | None = first
    try:
        while chunk is not None:
            if chunk.text:
                yield writer.text(chunk.text)
            if chunk.completion is not None:
                c = chunk.completion
                yield writer.finish(c.finish_reason, hybridllm=_trace(c))
                if writer.include_usage:
                    yield writer.usage(c.usage.to_dict())
            try:
                chunk = await rest.__anext__()
            except StopAsyncIteration:
                chunk = None
        yield DONE
    except Exception as exc:
        # Headers are sent: report in-band, as OpenAI does; never the exception's own text.
        status, etype, message = status_of(exc if isinstance(exc, HybridLLMError) else HybridLLMError())
        logger.error("stream failed: %s", type(exc).__name__)
        yield error_event(error_body(message, etype, code=code_of(exc) or status))
    finally:
        await stream.aclose()
