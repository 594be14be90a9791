"""The FastAPI app: routes, authentication, model loading in the background.

    POST /v1/chat/completions   POST /v1/completions   GET /v1/models     (API key when configured)
    POST /tokenize              POST /detokenize                            (vLLM's; API key too)
    GET /health                 GET /metrics                                (open)

The app starts answering at once; the engine is built and started in a background task, and until
it is ready ``/health`` and the ``/v1`` routes answer 503. Request bodies are parsed by hand rather
than by FastAPI's body injection so that the order of checks is fixed: key (401), JSON (400),
fields (400), engine ready (503), model (404), context window (400), queue (429). On shutdown
(``hybridllm/wire/shutdown.py``) admission closes first (503, before the body is read), and what
is still running at the end of the grace period (a body still coming in too) ends with 503 or, for
a stream, an in-band error event and ``[DONE]``.

An engine that stops on its own once it was serving (its loop died) does not come back: with
``on_engine_dead`` (the CLI) the server then refuses new requests and ends those in flight at once
with a 500 (``engine_dead``) naming the engine's error, and calls ``on_engine_dead``, which shuts the
process down so that a supervisor restarts it, as vLLM's server does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel

from cloud_server.exceptions import EngineError
from hybridllm.wire import DEFAULT_MAX_BODY_BYTES, decode_json_object, is_large, parse_request, read_body
from hybridllm.wire.errors import WireError
from hybridllm.wire.middleware import RequestId
from hybridllm.wire.openapi import add_schemas, error_responses, ok_response, request_body
from hybridllm.wire.responses import ChatCompletion, Health, ModelCard, ModelList, TextCompletion, error_event
from hybridllm.wire.shutdown import ClientGone, Drain, TrackRequests, unless_interrupted, until_expired
from hybridllm.wire.sse import EventStreamResponse, client_gone

from .auth import ApiKeyChecker
from .cors import add_cors
from .errors import error_body, error_kind, error_response, install_error_handlers
from .lifespan import ServerState, _lifespan
from .metrics import ServerMetrics
from .protocol import CloudChatCompletionRequest as ChatCompletionRequest
from .protocol import CloudCompletionRequest as CompletionRequest
from .protocol import DetokenizeRequest, TokenizeRequest
from .serving import Engine, OpenAIServing

R = TypeVar("R", bound=BaseModel)


class Tokenized(BaseModel):
    """``/tokenize``'s answer (vLLM's shape)."""

    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class Detokenized(BaseModel):
    """``/detokenize``'s answer (vLLM's shape)."""

    prompt: str


async def _parse(request: Request, model_type: type[R], max_body_bytes: int, drain: Drain) -> R:
    """Read, decode and validate the body; a large one is decoded in a worker thread so the
    event loop keeps serving other requests (and /health) meanwhile. A body still coming in when
    the shutdown's grace period ends is given up at once (503), as the proxy does."""
    body = await until_expired(read_body(request, max_body_bytes), drain)

    def decode() -> R:
        return parse_request(model_type, decode_json_object(body))

    return await asyncio.to_thread(decode) if is_large(body) else decode()


def _shutdown_events(drain: Drain) -> str:
    """The in-band end of a stream cut by the shutdown: an OpenAI error event, then [DONE]; the
    error is the drain's (the shutdown, or the engine that died)."""
    exc = drain.error()
    return error_event(error_body(str(exc), error_kind(exc)))


# What these statuses mean on this server, beyond ``hybridllm.wire.openapi``'s common wording.
_ERROR_TEXT = {
    500: "The engine failed: a failed step ends the requests in it; a dead engine (code engine_dead) "
         "ends every request and the server exits for a supervisor to restart it; or an internal error",
    503: "The model is loading, the engine is not running, or the server is shutting down "
         "(code server_shutting_down)",
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The error responses a /v1 route documents. Every /v1 route can answer 500 (once the engine
    died, ``ready_serving`` refuses with engine_dead) and 503 (loading, shutting down)."""
    responses = error_responses(*statuses)
    for status, text in _ERROR_TEXT.items():
        if status in responses:
            responses[status]["description"] = text
    return responses


def _drop_validation_422(app: FastAPI) -> None:
    """FastAPI lists a 422 on every route with a parameter; this server never answers it (a
    validation error is a 400, OpenAI's way), so the document must not promise it."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        doc = build()
        for operations in doc.get("paths", {}).values():
            for operation in operations.values():
                operation.get("responses", {}).pop("422", None)
        schemas = doc.get("components", {}).get("schemas", {})
        for unused in ("HTTPValidationError", "ValidationError"):
            schemas.pop(unused, None)
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


def _build_router(app: FastAPI, checker: ApiKeyChecker, max_body_bytes: int) -> APIRouter:
    state: ServerState = app.state.server
    defs: dict[str, Any] = {}
    auth = (401,) if checker.is_enabled else ()
    post_errors = _errors(400, *auth, 404, 408, 413, 429, 500, 503)  # 408: a body that came too slowly

    async def require_key(request: Request) -> None:
        checker.check(request.headers.get("authorization"))

    v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_key)])

    async def complete(request: Request, req: ChatCompletionRequest | CompletionRequest) -> Any:
        serving = state.ready_serving()
        state.check_model(req.model)
        # Tokenizing a long prompt takes a while: off the event loop.
        prepared = await asyncio.to_thread(serving.prepare, req)
        drain = state.drain
        try:
            generation = await unless_interrupted(request, serving.admit(prepared), drain)
            if prepared.stream:
                return EventStreamResponse(serving.stream_events(prepared, generation), stop=drain.expired,
                                           last_events=lambda: _shutdown_events(drain))
            body = await unless_interrupted(request, serving.full_response(prepared, generation), drain)
        except ClientGone:
            return client_gone()
        return JSONResponse(body)

    @v1.post(
        "/chat/completions",
        openapi_extra=request_body(ChatCompletionRequest, defs),
        responses={**ok_response(ChatCompletion, streams=True), **post_errors},
    )
    async def chat_completions(request: Request) -> Any:
        state.drain.check_open()  # closing: 503 at once, not after a body that may come slowly
        req = await _parse(request, ChatCompletionRequest, max_body_bytes, state.drain)
        return await complete(request, req)

    @v1.post(
        "/completions",
        openapi_extra=request_body(CompletionRequest, defs),
        responses={**ok_response(TextCompletion, streams=True), **post_errors},
    )
    async def completions(request: Request) -> Any:
        state.drain.check_open()
        req = await _parse(request, CompletionRequest, max_body_bytes, state.drain)
        return await complete(request, req)

    # vLLM's tokenizer routes (at the root, as vLLM serves them; the API key guards them too)
    top = APIRouter(dependencies=[Depends(require_key)])
    util_errors = _errors(400, *auth, 404, 408, 413, 500, 503)

    async def tokenizer_answer(request: Request, body_type: type[R],
                               answer: Callable[[OpenAIServing, R], dict[str, Any]]) -> Any:
        state.drain.check_open()
        req = await _parse(request, body_type, max_body_bytes, state.drain)
        serving = state.ready_serving()
        model = getattr(req, "model", None)
        if model is not None:
            state.check_model(model)
        return JSONResponse(await asyncio.to_thread(answer, serving, req))

    @top.post("/tokenize", openapi_extra=request_body(TokenizeRequest, defs),
              responses={200: {"model": Tokenized}, **util_errors})
    async def tokenize(request: Request) -> Any:
        return await tokenizer_answer(request, TokenizeRequest, OpenAIServing.tokenize)

    @top.post("/detokenize", openapi_extra=request_body(DetokenizeRequest, defs),
              responses={200: {"model": Detokenized}, **util_errors})
    async def detokenize(request: Request) -> Any:
        return await tokenizer_answer(request, DetokenizeRequest, OpenAIServing.detokenize)

    app.include_router(top)
    add_schemas(app, defs)

    def model_card() -> dict[str, Any]:
        engine = state.engine
        return {
            "id": state.model_name,
            "object": "model",
            "created": state.created,
            "owned_by": "hybridllm",
            "max_model_len": engine.max_model_len if engine is not None else None,
        }

    # HEAD as well as GET, as /health answers (RFC 9110): a probe of the model list got 405
    @v1.head("/models", include_in_schema=False)
    @v1.get("/models", response_model=ModelList, responses=_errors(*auth, 500, 503))
    async def list_models() -> dict[str, Any]:
        state.ready_serving()
        return {"object": "list", "data": [model_card()]}

    @v1.head("/models/{model_id:path}", include_in_schema=False)
    @v1.get("/models/{model_id:path}", response_model=ModelCard,
            responses=_errors(*auth, 404, 500, 503))
    async def get_model(model_id: str) -> dict[str, Any]:
        state.ready_serving()
        state.check_model(model_id)
        return model_card()  # the list's card: it lacked max_model_len, which vLLM's carries

    return v1


def create_app(
    engine_factory: Callable[[], Engine],
    *,
    api_keys: list[str] | None = None,
    served_model_name: str | None = None,
    on_load_error: Callable[[BaseException], None] | None = None,
    system_prompt: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    energy: str = "auto",
    power_watts: float | None = None,
    on_engine_dead: Callable[[EngineError], None] | None = None,
    allow_origins: list[str] | None = None,
) -> FastAPI:
    """The ASGI app; ``engine_factory`` builds an unstarted engine (run in a worker thread).
    ``system_prompt`` is put first in chat requests that carry no system message; a body over
    ``max_body_bytes`` is refused with 413 before it is read whole. ``energy``: "auto" measures
    per-request energy here (``cloud_server.energy``; ``power_watts`` forces an estimate from that
    figure), "remote" records what the engine's outputs carry (the cluster's replicas measure),
    "off" neither. ``on_engine_dead`` is called once the engine has stopped by itself while serving
    (the requests in flight ended first, with a 500 naming its error); without it such a server
    answers 503 until it is restarted. ``allow_origins``: web page origins (``*``: any) that may
    call it from a browser, with CORS; none by default."""
    app = FastAPI(title="hybridllm cloud server", lifespan=_lifespan, docs_url=None, redoc_url=None)
    state = ServerState(engine_factory, served_model_name, on_load_error, system_prompt or None,
                        on_engine_dead=on_engine_dead)
    app.state.server = state

    def engine_stats() -> dict[str, Any] | None:
        return state.engine.stats() if state.engine is not None else None

    metrics = ServerMetrics(engine_stats, lambda: state.model_name)
    app.state.metrics = metrics
    app.state.energy_mode, app.state.power_watts = energy, power_watts
    if energy != "off":
        from cloud_server.energy import EnergyAccounting

        metrics.energy = EnergyAccounting(None, metrics.registry, lambda: state.model_name)
    install_error_handlers(app, on_status=metrics.record_rejection)

    async def on_wire_error(request: Request, exc: Exception) -> Response:
        """As ``install_error_handlers`` answers, with the error's own headers: a 408 (a body that
        came too slowly) closes the connection, whose unread rest would be taken for a request."""
        response = error_response(exc)
        response.headers.update(getattr(exc, "headers", None) or {})
        metrics.record_rejection(response.status_code)
        return response

    app.add_exception_handler(WireError, on_wire_error)

    # HEAD as well as GET (RFC 9110 requires both; FastAPI's GET routes lack HEAD, so a monitor's
    # HEAD probe got 405): the same answer, its body left out by the server
    @app.head("/health", include_in_schema=False)
    @app.get("/health", responses={200: {"model": Health}, 503: {"model": Health}})
    async def health() -> Response:
        if state.drain.is_closing:  # a load balancer stops sending here
            return JSONResponse({"status": "shutting_down"}, status_code=503)
        engine = state.engine
        if engine is not None and engine.is_ready:
            body: dict[str, Any] = {"status": "ok", "model": state.model_name}
            detail = getattr(engine, "health_detail", None)  # a cluster: replicas up / wanted
            if callable(detail):
                body.update(detail())
            return JSONResponse(body, status_code=503 if body["status"] == "unavailable" else 200)
        # loaded once but no longer running (its loop ended) is an error, not "loading": it does
        # not come back by itself
        status = "error" if state.load_error is not None or engine is not None else "loading"
        return JSONResponse({"status": status}, status_code=503)

    @app.head("/metrics", include_in_schema=False)
    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                         "description": "Prometheus text format"}},
    )
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    app.include_router(_build_router(app, ApiKeyChecker(api_keys or []), max_body_bytes))
    _drop_validation_422(app)
    app.add_middleware(TrackRequests, drain=state.drain)
    add_cors(app, allow_origins or [])  # outside the drain: its 503 carries the CORS headers too
    # outermost: every answer carries X-Request-Id (the client's, as the proxy forwards its own, or a
    # new one) and the error lines written while serving it name it
    app.add_middleware(RequestId, log_names=("cloud_server.api",))
    return app
