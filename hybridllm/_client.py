"""HybridLLM and AsyncHybridLLM: one call that answers on the device or in the cloud.

Both share one synchronous core (:class:`_Core`); the async client runs it in a worker thread,
so there is one pipeline to get right. A stream is a :class:`Stream` of :class:`Chunk` whose
``completion`` is set once it is exhausted; ``chat`` is a stream read to the end.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from ._config import HybridLLMConfig, load_config
from ._exceptions import (
    CloudRateLimitError,
    CloudUnavailableError,
    ConfigError,
    HybridLLMError,
    InvalidRequestError,
)
from ._stats import Stats
from ._types import Chunk, Completion, GenerationParams, Message, Usage, normalize_messages
from .backends.base import Backend

log = logging.getLogger("hybridllm")


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
    """The request pipeline, shared by the sync and async clients.

    cache lookup -> policies and router -> edge, cloud or cascade -> store in the cache -> stats.
    Every optional part (cache, cloud, policy) may be None; the edge backend is always there.
    """

    def __init__(self, *, edge: Backend, cloud: Any = None, cache: Any = None, policy: Any = None,
                 defaults: dict[str, Any], namespace: str = "default",
                 price_per_1k_tokens: float = 0.0) -> None:
        self.edge = edge
        self.cloud = cloud
        self.cache = cache
        self.policy = policy
        self.defaults = defaults
        self.namespace = namespace
        self.stats = Stats(price_per_1k_tokens=price_per_1k_tokens)
        self.cache_model = edge.model + ("|cloud" if cloud is not None else "")
        self._closed = False

    def params(self, overrides: dict[str, Any]) -> GenerationParams:
        merged = {**self.defaults, **{k: v for k, v in overrides.items() if v is not None}}
        return GenerationParams.from_kwargs(**merged)

    def prepare(self, messages: str | Sequence[Message],
                overrides: dict[str, Any]) -> tuple[list[Message], GenerationParams, _Options]:
        """Validate eagerly, so bad input raises at the call and not mid-iteration."""
        if self._closed:
            raise HybridLLMError("This client is closed; create a new HybridLLM.")
        opts = _Options.pop_from(overrides)
        return normalize_messages(messages), self.params(overrides), opts

    # -- the pipeline -----------------------------------------------------------------------
    def run(self, msgs: list[Message], params: GenerationParams, opts: _Options) -> Iterator[Chunk]:
        """Yield the answer's chunks; the last one carries the Completion."""
        start = time.perf_counter()
        namespace = opts.namespace or self.namespace
        use_cache = self.cache is not None and opts.cache and opts.route is None
        # one embedding of the question, shared by the cache lookup, the router and the store
        vec = self._embed(msgs) if use_cache else None
        shared: dict[str, Any] = {} if vec is None else {"embedding": vec}
        if use_cache:
            hit = self._cache_get(msgs, params, namespace, shared)
            if hit is not None:
                yield from self._serve_hit(hit, start)
                return
        decision = self._decide(msgs, opts, shared)
        final: Completion | None = None
        for chunk in self._answer(msgs, params, decision, start):
            if chunk.completion is not None:
                final = chunk.completion
            yield chunk
        if final is None:
            return
        if use_cache and final.text.strip():
            self._cache_put(msgs, params, namespace, final, pii=bool(decision.pii_kinds),
                            shared=shared)
        self.stats.record(final)

    def _embed(self, msgs: list[Message]) -> Any:
        embed = getattr(self.cache, "embed_query", None)
        if embed is None:
            return None
        try:
            return embed(msgs)
        except HybridLLMError as exc:  # a broken cache must not break answering
            log.warning("semantic cache embedding failed: %s", exc)
            return None

    def _decide(self, msgs: list[Message], opts: _Options, shared: dict[str, Any]) -> _Decision:
        if self.cloud is None:
            if opts.route == "cloud":
                raise ConfigError("route='cloud' needs a cloud endpoint: pass cloud_url=...")
            return _Decision("edge", "edge: no cloud configured", None, msgs, [], False)
        if self.policy is None:
            route = opts.route or "cloud"
            return _Decision(route, f"{route}: no router configured", None, msgs, [], False)
        d = self.policy.decide(msgs, force=opts.route,
                               prompt_tokens=self.edge.count_tokens(msgs), **shared)
        cascade = d.cascade if opts.cascade is None else (opts.cascade and d.route == "edge"
                                                          and d.score is not None)
        return _Decision(d.route, d.reason, d.score, d.messages_for_cloud, list(d.pii_kinds),
                         cascade)

    def _answer(self, msgs: list[Message], params: GenerationParams, d: _Decision,
                start: float) -> Iterator[Chunk]:
        if d.route == "cloud":
            if not self.cloud.is_available():
                yield from self._emit(self.edge, msgs, params, start, route=EDGE_FALLBACK,
                                      reason=f"{d.reason}; cloud circuit open", score=d.score)
                return
            try:
                yield from self._emit_cloud(msgs, params, d, start, route="cloud",
                                            reason=d.reason)
                return
            except _NoOutput as exc:  # nothing was streamed yet: the device answers instead
                log.info("cloud failed before answering (%s); answering on the device", exc.cause)
                yield from self._emit(self.edge, msgs, params, start, route=EDGE_FALLBACK,
                                      reason=f"{d.reason}; cloud failed: {exc.cause}",
                                      score=d.score)
                return
        if d.cascade and self.cloud is not None:
            yield from self._cascade(msgs, params, d, start)
            return
        yield from self._emit(self.edge, msgs, params, start, route="edge", reason=d.reason,
                              score=d.score)

    def _cascade(self, msgs: list[Message], params: GenerationParams, d: _Decision,
                 start: float) -> Iterator[Chunk]:
        """Edge first, held back; if its confidence is low, the cloud answers instead."""
        draft = self.edge.generate(msgs, dataclasses.replace(params, logprobs=True))
        lp = draft.mean_logprob if draft.mean_logprob is not None else float("-inf")
        if self.policy.should_escalate(lp) and self.cloud.is_available():
            try:
                yield from self._emit_cloud(msgs, params, d, start, route="edge->cloud",
                                            reason=f"{d.reason}; edge confidence {lp:.2f} too low")
                return
            except _NoOutput as exc:
                log.info("cascade: cloud failed (%s); keeping the edge answer", exc.cause)
        yield from self._replay(draft.text, self.edge.model, start, route="edge",
                                reason=f"{d.reason}; edge confident ({lp:.2f})", score=d.score,
                                usage=draft.usage, finish=draft.finish_reason,
                                ttft_ms=draft.ttft_ms)

    def _emit_cloud(self, msgs: list[Message], params: GenerationParams, d: _Decision,
                    start: float, *, route: str, reason: str) -> Iterator[Chunk]:
        """The cloud answers; if its stream breaks mid-answer, the device finishes the answer
        from the text already streamed (route ``"<route>->edge"``), so the caller never sees the
        failure. Raises ``_NoOutput`` when the cloud failed before its first token."""
        try:
            yield from self._emit(self.cloud, d.messages_for_cloud, params, start, route=route,
                                  reason=reason, score=d.score, record_budget=True)
        except _PartialOutput as exc:
            log.warning("cloud stream broke after %d characters (%s); the device finishes it",
                        len(exc.text), exc.cause)
            if self.policy is not None:  # the cloud's own count never arrived: ~4 chars a token
                self.policy.record_cloud_usage(max(1, len(exc.text) // 4))
            yield from self._emit(
                self.edge, msgs, params, start, route=f"{route}->edge", score=d.score,
                reason=f"{reason}; cloud stream broke after {len(exc.text)} characters "
                       f"({exc.cause}); the device finished the answer",
                prefix=exc.text, ttft_ms=exc.ttft_ms)

    def _emit(self, backend: Backend, msgs: list[Message], params: GenerationParams,
              start: float, *, route: str, reason: str, score: float | None,
              record_budget: bool = False, prefix: str = "",
              ttft_ms: float | None = None) -> Iterator[Chunk]:
        """Stream ``backend``'s answer as chunks, then one final chunk with the completion. With
        ``prefix`` (already sent to the caller, first token at ``ttft_ms``), the backend continues
        that answer."""
        ttft = ttft_ms
        parts: list[str] = [prefix] if prefix else []
        finish, usage = "stop", Usage()
        try:
            deltas = backend.stream_continuation(msgs, prefix, params) if prefix else \
                backend.stream(msgs, params)
            for delta in deltas:
                if delta.text:
                    if ttft is None:
                        ttft = (time.perf_counter() - start) * 1000
                    parts.append(delta.text)
                    yield Chunk(delta.text, route, backend.model)
                if delta.finish_reason is not None:
                    finish, usage = delta.finish_reason, delta.usage or usage
        except (CloudUnavailableError, CloudRateLimitError) as exc:
            if backend is not self.cloud:
                raise
            if parts:
                raise _PartialOutput(exc, "".join(parts), ttft) from exc
            raise _NoOutput(exc) from exc
        except NotImplementedError as exc:
            if not prefix:
                raise
            # the edge backend cannot continue the answer the cloud broke off
            raise CloudUnavailableError(
                f"the cloud stream broke mid-answer and {exc}; retry the request") from exc
        cost = 0.0
        if backend is self.cloud:
            cost = self.stats.cost(usage.total_tokens)
            if record_budget and self.policy is not None:
                self.policy.record_cloud_usage(usage.total_tokens)
        completion = Completion(
            text="".join(parts), route=route, reason=reason, model=backend.model, usage=usage,
            latency_ms=(time.perf_counter() - start) * 1000, ttft_ms=ttft, finish_reason=finish,
            score=score, cost_usd=cost,
        )
        yield Chunk("", route, backend.model, finish_reason=finish, completion=completion)

    def _replay(self, text: str, model: str, start: float, *, route: str, reason: str,
                score: float | None = None, similarity: float | None = None,
                usage: Usage | None = None, finish: str = "stop",
                ttft_ms: float | None = None) -> Iterator[Chunk]:
        """Stream a finished answer (a cache hit, a held-back cascade draft) word by word."""
        pieces = re.findall(r"\S*\s*", text) or [text]
        for piece in pieces:
            if piece:
                if ttft_ms is None:
                    ttft_ms = (time.perf_counter() - start) * 1000
                yield Chunk(piece, route, model)
        completion = Completion(
            text=text, route=route, reason=reason, model=model, usage=usage or Usage(),
            latency_ms=(time.perf_counter() - start) * 1000, ttft_ms=ttft_ms,
            finish_reason=finish, score=score, cache_similarity=similarity,
        )
        yield Chunk("", route, model, finish_reason=finish, completion=completion)

    def _serve_hit(self, hit: Any, start: float) -> Iterator[Chunk]:
        how = "exact repeat" if hit.verifier_prob is None else \
            f"similarity {hit.similarity:.3f}, verifier {hit.verifier_prob:.2f}"
        final = None
        for chunk in self._replay(hit.text, self.cache_model, start, route="cache",
                                  reason=f"cache hit ({how})", similarity=hit.similarity):
            final = chunk.completion or final
            yield chunk
        if final is not None:
            self.stats.record(final)

    def _cache_get(self, msgs: list[Message], params: GenerationParams, ns: str,
                   shared: dict[str, Any]) -> Any:
        try:
            return self.cache.get(msgs, model=self.cache_model, params_key=params.cache_key(),
                                  namespace=ns, **shared)
        except HybridLLMError as exc:  # a broken cache must not break answering
            log.warning("semantic cache lookup failed: %s", exc)
            return None

    def _cache_put(self, msgs: list[Message], params: GenerationParams, ns: str,
                   c: Completion, *, pii: bool, shared: dict[str, Any]) -> None:
        try:
            self.cache.put(msgs, c.text, model=self.cache_model, params_key=params.cache_key(),
                           namespace=ns, pii=pii, metadata={"route": c.route, "model": c.model},
                           **shared)
        except HybridLLMError as exc:
            log.warning("semantic cache store failed: %s", exc)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            for part in (self.edge, self.cloud, self.cache):
                if part is not None:
                    part.close()


EDGE_FALLBACK = "edge (cloud unavailable)"


class _NoOutput(Exception):
    """The cloud failed before streaming anything: safe to answer on the device instead."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _PartialOutput(Exception):
    """The cloud failed after streaming ``text``: the device continues from there."""

    def __init__(self, cause: Exception, text: str, ttft_ms: float | None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.text = text
        self.ttft_ms = ttft_ms


@dataclasses.dataclass
class _Decision:
    route: str
    reason: str
    score: float | None
    messages_for_cloud: list[Message]
    pii_kinds: list[str]
    cascade: bool


@dataclasses.dataclass
class _Options:
    """Per-call options that are not sampling parameters."""

    route: str | None = None  # force "edge" or "cloud"
    cache: bool = True  # look up and store in the semantic cache
    cascade: bool | None = None  # None: as the policy says
    namespace: str | None = None  # cache namespace (tenant or user)

    @classmethod
    def pop_from(cls, kwargs: dict[str, Any]) -> _Options:
        opts = cls(**{f.name: kwargs.pop(f.name) for f in dataclasses.fields(cls)
                      if f.name in kwargs})
        if opts.route not in (None, "edge", "cloud"):
            raise InvalidRequestError(f"route must be 'edge', 'cloud' or None, got {opts.route!r}.")
        return opts


class HybridLLM:
    """Answer chat requests from the cache, on the device or in the cloud, whichever fits.

    >>> llm = HybridLLM()                                   # device only, cache on
    >>> llm = HybridLLM(cloud_url="http://gpu-host:8000")   # + learned routing to the cloud
    >>> c = llm.chat("What is the capital of France?")
    >>> c.text, c.route, c.reason

    Settings (see :class:`hybridllm._config.HybridLLMConfig`) come from keyword arguments, then
    ``HYBRIDLLM_*`` environment variables, then a TOML file. Parts can be injected for tests or
    custom setups: ``edge=``, ``cloud=``, ``cache=`` (or ``cache=False``), ``policy=``.
    """

    def __init__(self, *, config: str | None = None, edge: Backend | None = None,
                 cloud: Backend | None = None, cache: Any = None, policy: Any = None,
                 progress: Any = None, **settings: Any) -> None:
        if cache is False:
            settings["cache"] = False
            cache = None
        cfg = load_config(config, **settings)
        self.config = cfg
        defaults = {"max_tokens": cfg.max_tokens, "temperature": cfg.temperature,
                    "top_p": cfg.top_p, "seed": cfg.seed}
        GenerationParams.from_kwargs(**{k: v for k, v in defaults.items() if v is not None})
        parts: list[Any] = []
        try:
            if edge is None:
                from .backends.llama_cpp import LlamaCppBackend

                edge = LlamaCppBackend(cfg.edge_model, n_ctx=cfg.n_ctx, n_threads=cfg.n_threads,
                                       progress=progress)
                parts.append(edge)
            if cloud is None and cfg.cloud_url:
                from .backends.cloud import CloudBackend

                cloud = CloudBackend(
                    base_url=cfg.cloud_url, api_key=cfg.cloud_api_key, model=cfg.cloud_model,
                    connect_timeout_s=cfg.cloud_connect_timeout_s,
                    read_timeout_s=cfg.cloud_read_timeout_s, max_retries=cfg.cloud_max_retries,
                    breaker_threshold=cfg.cloud_breaker_threshold,
                    breaker_cooldown_s=cfg.cloud_breaker_cooldown_s)
                parts.append(cloud)
            if cloud is not None and policy is None:
                policy = _make_policy(cfg, edge)
            if cache is None and cfg.cache:
                from .cache import SemanticCache

                cache = SemanticCache(cfg.cache_path, namespace=cfg.namespace,
                                      ttl_s=cfg.cache_ttl_s, max_entries=cfg.cache_max_entries,
                                      verifier=cfg.cache_verifier)
        except BaseException:
            for part in parts:
                part.close()
            raise
        self._core = _Core(edge=edge, cloud=cloud, cache=cache, policy=policy,
                           defaults=defaults, namespace=cfg.namespace,
                           price_per_1k_tokens=cfg.price_per_1k_tokens)

    @property
    def edge(self) -> Backend:
        return self._core.edge

    @property
    def cloud(self) -> Backend | None:
        return self._core.cloud

    @property
    def cache(self) -> Any:
        return self._core.cache

    def chat(self, messages: str | Sequence[Message], **params: Any) -> Completion:
        """Answer ``messages`` (a string or OpenAI-style messages) and return the Completion.

        Keyword options: sampling (max_tokens, temperature, top_p, top_k, seed, stop) and
        routing (route="edge"|"cloud", cache=False, cascade=True|False, namespace="tenant").
        """
        stream = self.stream(messages, **params)
        for _ in stream:
            pass
        if stream.completion is None:  # the core always ends with one; guard against a bad backend
            raise HybridLLMError("The backend ended without finishing the answer.")
        return stream.completion

    def stream(self, messages: str | Sequence[Message], **params: Any) -> Stream:
        """Stream the answer chunk by chunk. Breaking out of the loop stops generation."""
        msgs, gen_params, opts = self._core.prepare(messages, params)
        return Stream(self._core.run(msgs, gen_params, opts))

    def stats(self) -> dict[str, Any]:
        """Requests per route, cache hit rate, cloud fraction, latency/TTFT percentiles, cost."""
        return self._core.stats.snapshot()

    def close(self) -> None:
        self._core.close()

    def __enter__(self) -> HybridLLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _make_policy(cfg: HybridLLMConfig, edge: Backend) -> Any:
    from .router.budget import Budget
    from .router.policy import RoutingPolicy
    from .router.router import load_router

    router = load_router(cfg.router)
    if cfg.threshold is not None:
        router = dataclasses.replace(router, threshold=cfg.threshold)
    band = None
    if cfg.cascade:
        band = (max(0.0, router.threshold - 0.1), router.threshold)
    budget = Budget(max_cloud_calls_per_hour=cfg.max_cloud_calls_per_hour,
                    max_cloud_tokens_per_day=cfg.max_cloud_tokens_per_day)
    return RoutingPolicy(router, privacy=cfg.privacy, budget=budget,
                         edge_context_tokens=edge.context_length or cfg.n_ctx,
                         cascade_band=band)


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
