"""The proxy's answers: the JSON completion and the SSE stream, with their trace, usage and headers."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from ._exceptions import HybridLLMError
from ._finite import _finite
from ._masking import public_text  # a route's reason quotes the cloud URL it could not reach
from ._proxy_errors import code_of, status_of
from ._types import Chunk, Completion, estimate_text_tokens, estimate_tokens
from .wire import ChunkWriter, chat_completion, error_body, header_value
from .wire.responses import DONE, error_event

logger = logging.getLogger("hybridllm.proxy")


def _trace(c: Completion, usage: Mapping[str, int] | None = None) -> dict[str, Any]:
    return _finite({
        # the model that wrote the answer (the device's, the cloud's as its server names it); the
        # answer's own "model" repeats the request's name, which clients match on. A cache hit:
        # null, no model ran (its Completion names the cache's key, "edge|cloud:...")
        "model": None if c.route == "cache" else c.model,
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



def _completion_json(c: Completion, model: str, usage: dict[str, int]) -> dict[str, Any]:
    return chat_completion(
        id=f"chatcmpl-{uuid.uuid4().hex[:24]}", created=int(time.time()), model=model,
        text=c.text, finish_reason=c.finish_reason, usage=usage, hybridllm=_trace(c, usage),
        tool_calls=[call.to_dict() for call in c.tool_calls] or None,
    )


async def _sse(first: Chunk, stream: Any, rest: AsyncIterator[Chunk], writer: ChunkWriter,
               usage_of: Callable[[Completion], Awaitable[dict[str, int]]]) -> AsyncIterator[str]:
    yield writer.role()
    chunk: Chunk | None = first
    try:
        while chunk is not None:
            if chunk.text:
                yield writer.text(chunk.text)
            for piece in chunk.tool_calls:  # a tool call's start or more of its arguments
                yield writer.tool_call(piece.to_dict())
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
