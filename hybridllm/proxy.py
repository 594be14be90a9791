"""`hybridllm serve`: the OpenAI wire format on the device, routed through HybridLLM.

Any app that speaks to OpenAI (the official clients, LangChain, curl) gets hybrid routing by
pointing its base URL here. Each answer says how it was served: the ``x-hybridllm-route`` and
``x-hybridllm-reason`` headers, and a ``hybridllm`` field in the JSON (and in each stream chunk).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request  # the [server] extra; this module is imported only to serve
from fastapi.responses import JSONResponse, StreamingResponse

from ._client import AsyncHybridLLM, HybridLLM
from ._exceptions import (
    CloudAuthError,
    CloudError,
    ConfigError,
    HybridLLMError,
    InvalidRequestError,
)
from ._types import Chunk, Completion

SAMPLING_FIELDS = {"max_tokens": int, "max_completion_tokens": int, "temperature": float,
                   "top_p": float, "seed": int}
IGNORED_FIELDS = {"model", "messages", "stream", "stream_options", "stop", "n", "user",
                  "presence_penalty", "frequency_penalty", "logit_bias", "response_format",
                  "hybridllm"}


def _error(status: int, message: str, etype: str, param: str | None = None) -> Any:
    return JSONResponse(status_code=status, content={
        "error": {"message": message, "type": etype, "param": param, "code": None}})


def _status_for(exc: HybridLLMError) -> tuple[int, str]:
    if isinstance(exc, InvalidRequestError):
        return 400, "invalid_request_error"
    if isinstance(exc, CloudAuthError):
        return 502, "upstream_auth_error"
    if isinstance(exc, CloudError):
        return 503, "upstream_unavailable"
    if isinstance(exc, ConfigError):
        return 400, "invalid_request_error"
    return 500, "server_error"


def parse_request(body: Any) -> tuple[list[dict], dict[str, Any], bool, bool]:
    """(messages, options for HybridLLM.chat, stream?, include usage in stream?)."""
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object.")
    if "messages" not in body:
        raise InvalidRequestError("'messages' is required.")
    opts: dict[str, Any] = {}
    for name, typ in SAMPLING_FIELDS.items():
        if body.get(name) is None:
            continue
        value = body[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                typ is int and not isinstance(value, int)):
            raise InvalidRequestError(f"'{name}' must be a {typ.__name__}.")
        opts["max_tokens" if name == "max_completion_tokens" else name] = value
    if body.get("n", 1) != 1:
        raise InvalidRequestError("Only n=1 is supported.")
    stop = body.get("stop")
    if stop is not None:
        opts["stop"] = (stop,) if isinstance(stop, str) else tuple(stop)
    extra = body.get("hybridllm") or {}
    if not isinstance(extra, dict):
        raise InvalidRequestError("'hybridllm' must be an object such as {\"route\": \"edge\"}.")
    for key in ("route", "cache", "cascade", "namespace"):
        if key in extra:
            opts[key] = extra[key]
    stream_options = body.get("stream_options") or {}
    return body["messages"], opts, bool(body.get("stream")), bool(
        stream_options.get("include_usage"))


def _trace(c: Completion) -> dict[str, Any]:
    return {"route": c.route, "reason": c.reason, "score": c.score,
            "cache_similarity": c.cache_similarity, "latency_ms": round(c.latency_ms, 1),
            "ttft_ms": None if c.ttft_ms is None else round(c.ttft_ms, 1),
            "cost_usd": c.cost_usd}


def _headers(route: str, reason: str | None = None) -> dict[str, str]:
    h = {"x-hybridllm-route": route}
    if reason:
        h["x-hybridllm-reason"] = reason.encode("ascii", "replace").decode()[:300]
    return h


def create_app(llm: HybridLLM, *, model_name: str = "hybridllm") -> FastAPI:
    app = FastAPI(title="hybridllm local proxy")
    allm = AsyncHybridLLM.wrap(llm)
    created = int(time.time())

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return llm.stats()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        ids = [model_name, llm.edge.model]
        return {"object": "list", "data": [
            {"id": i, "object": "model", "created": created, "owned_by": "hybridllm"} for i in ids]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "The request body is not valid JSON.", "invalid_request_error")
        try:
            messages, opts, stream, include_usage = parse_request(body)
            model = body.get("model") or model_name
            if not stream:
                c = await allm.chat(messages, **opts)
                return JSONResponse(_completion_json(c, model), headers=_headers(c.route, c.reason))
            chunks = allm.stream(messages, **opts).__aiter__()
            first = await chunks.__anext__()  # routing is decided: the header can say where
        except HybridLLMError as exc:
            status, etype = _status_for(exc)
            return _error(status, str(exc), etype)
        return StreamingResponse(_sse(first, chunks, model, include_usage),
                                 media_type="text/event-stream", headers=_headers(first.route))

    return app


def _completion_json(c: Completion, model: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion",
        "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": c.text},
                     "finish_reason": c.finish_reason}],
        "usage": c.usage.to_dict(), "hybridllm": _trace(c),
    }


async def _sse(first: Chunk, rest: AsyncIterator[Chunk], model: str,
               include_usage: bool) -> AsyncIterator[bytes]:
    cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    created = int(time.time())

    def event(delta: dict[str, Any], finish: str | None, **extra: Any) -> bytes:
        payload = {"id": cid, "object": "chat.completion.chunk", "created": created,
                   "model": model, "choices": [{"index": 0, "delta": delta,
                                                "finish_reason": finish}], **extra}
        return f"data: {json.dumps(payload)}\n\n".encode()

    yield event({"role": "assistant", "content": ""}, None)
    chunk: Chunk | None = first
    try:
        while chunk is not None:
            if chunk.text:
                yield event({"content": chunk.text}, None)
            if chunk.completion is not None:
                c = chunk.completion
                yield event({}, c.finish_reason, hybridllm=_trace(c))
                if include_usage:
                    usage = {"id": cid, "object": "chat.completion.chunk", "created": created,
                             "model": model, "choices": [], "usage": c.usage.to_dict()}
                    yield f"data: {json.dumps(usage)}\n\n".encode()
            chunk = await rest.__anext__()
    except StopAsyncIteration:
        pass
    except HybridLLMError as exc:
        status, etype = _status_for(exc)
        err = {"error": {"message": str(exc), "type": etype, "code": status}}
        yield f"data: {json.dumps(err)}\n\n".encode()
    finally:
        await rest.aclose()  # type: ignore[attr-defined]
    yield b"data: [DONE]\n\n"
