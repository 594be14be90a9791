"""HybridLLM and AsyncHybridLLM: one call that answers on the device or in the cloud.

Both share one synchronous core (:class:`_Core`); the async client runs it in a worker thread,
so there is one pipeline to get right. A stream is a :class:`Stream` of :class:`Chunk` whose
``completion`` is set once it is exhausted; ``chat`` is a stream read to the end.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from ._exceptions import HybridLLMError
from ._types import Chunk, Completion, GenerationParams, Message, Usage, normalize_messages
from .backends.base import Backend


class Stream:
    """Iterator of :class:`Chunk`. ``completion`` is available after the last chunk."""

    def __init__(self, chunks: Iterator[Chunk]) -> None:
        self._chunks = chunks
        self.completion: Completion | None = None

    def __iter__(self) -> Iterator[Chunk]:
        for chunk in self._chunks:
            if chunk.completion is not None:
                self.completion = chunk.completion
            yield chunk

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close:
            close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Core:
    """The request pipeline, shared by the sync and async clients."""

    def __init__(self, *, edge: Backend, defaults: dict[str, Any]) -> None:
        self.edge = edge
        self.defaults = defaults
        self._closed = False

    def params(self, overrides: dict[str, Any]) -> GenerationParams:
        merged = {**self.defaults, **{k: v for k, v in overrides.items() if v is not None}}
        return GenerationParams.from_kwargs(**merged)

    def prepare(self, messages: str | Sequence[Message],
                overrides: dict[str, Any]) -> tuple[list[Message], GenerationParams]:
        """Validate eagerly, so bad input raises at the call and not mid-iteration."""
        if self._closed:
            raise HybridLLMError("This client is closed; create a new HybridLLM.")
        return normalize_messages(messages), self.params(overrides)

    def run(self, msgs: list[Message], params: GenerationParams) -> Iterator[Chunk]:
        """Yield the answer's chunks; the last one carries the Completion."""
        yield from self._run_backend(self.edge, msgs, params, route="edge",
                                     reason="edge: the only backend configured")

    def _run_backend(self, backend: Backend, msgs: list[Message], params: GenerationParams, *,
                     route: str, reason: str) -> Iterator[Chunk]:
        start = time.perf_counter()
        ttft: float | None = None
        parts: list[str] = []
        finish, usage = "stop", Usage()
        for delta in backend.stream(msgs, params):
            if delta.text:
                if ttft is None:
                    ttft = (time.perf_counter() - start) * 1000
                parts.append(delta.text)
                yield Chunk(delta.text, route, backend.model)
            if delta.finish_reason is not None:
                finish, usage = delta.finish_reason, delta.usage or usage
        completion = Completion(
            text="".join(parts), route=route, reason=reason, model=backend.model, usage=usage,
            latency_ms=(time.perf_counter() - start) * 1000, ttft_ms=ttft, finish_reason=finish,
        )
        yield Chunk("", route, backend.model, finish_reason=finish, completion=completion)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.edge.close()


class HybridLLM:
    """Answer chat requests on the device (and, with the routing features, in the cloud).

    >>> llm = HybridLLM()                       # SmolLM2-135M-Instruct on llama.cpp
    >>> llm.chat("What is the capital of France?").text
    """

    def __init__(
        self,
        *,
        edge_model: str = "smollm2-135m-instruct",
        edge: Backend | None = None,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        max_tokens: int = 256,
        temperature: float = 0.7,
        top_p: float = 0.95,
        seed: int | None = None,
        progress: Any = None,
    ) -> None:
        defaults = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
                    "seed": seed}
        GenerationParams.from_kwargs(**{k: v for k, v in defaults.items() if v is not None})
        if edge is None:
            from .backends.llama_cpp import LlamaCppBackend

            edge = LlamaCppBackend(edge_model, n_ctx=n_ctx, n_threads=n_threads,
                                   progress=progress)
        self._core = _Core(edge=edge, defaults=defaults)

    @property
    def edge(self) -> Backend:
        return self._core.edge

    def chat(self, messages: str | Sequence[Message], **params: Any) -> Completion:
        """Answer ``messages`` (a string or OpenAI-style messages) and return the Completion."""
        stream = self.stream(messages, **params)
        for _ in stream:
            pass
        if stream.completion is None:  # the core always ends with one; guard against a bad backend
            raise HybridLLMError("The backend ended without finishing the answer.")
        return stream.completion

    def stream(self, messages: str | Sequence[Message], **params: Any) -> Stream:
        """Stream the answer chunk by chunk. Breaking out of the loop stops generation."""
        msgs, gen_params = self._core.prepare(messages, params)
        return Stream(self._core.run(msgs, gen_params))

    def close(self) -> None:
        self._core.close()

    def __enter__(self) -> HybridLLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_DONE = object()


class AsyncHybridLLM:
    """The async client: the same pipeline as :class:`HybridLLM`, run in a worker thread."""

    def __init__(self, **options: Any) -> None:
        self._sync = HybridLLM(**options)

    @classmethod
    def wrap(cls, client: HybridLLM) -> AsyncHybridLLM:
        self = cls.__new__(cls)
        self._sync = client
        return self

    async def chat(self, messages: str | Sequence[Message], **params: Any) -> Completion:
        return await asyncio.to_thread(self._sync.chat, messages, **params)

    async def stream(self, messages: str | Sequence[Message], **params: Any) -> AsyncIterator[Chunk]:
        """Async iterator of chunks; leaving the loop early stops generation in the thread."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        cancelled = threading.Event()
        stream = await asyncio.to_thread(self._sync.stream, messages, **params)

        def produce() -> None:
            try:
                for chunk in stream:
                    if cancelled.is_set():
                        break
                    loop.call_soon_threadsafe(queue.put_nowait, chunk)
            except BaseException as exc:  # forwarded to the consumer
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            finally:
                stream.close()
                loop.call_soon_threadsafe(queue.put_nowait, _DONE)

        worker = loop.run_in_executor(None, produce)
        try:
            while (item := await queue.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancelled.set()
            await asyncio.shield(worker)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._sync.close)

    async def __aenter__(self) -> AsyncHybridLLM:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
