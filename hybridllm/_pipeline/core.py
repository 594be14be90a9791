"""The request pipeline shared by HybridLLM and AsyncHybridLLM: one async core, four steps.

    lookup   the semantic cache (the question embedded once, reused by the router and the store)
    plan     the prompt counted once with the device's tokenizer; policy + router -> one Decision
             with its reason; a prompt the device cannot hold goes to the cloud (or fails: with
             ContextWindowExceededError where no cloud may take it, with CloudBudgetSpentError or
             CloudUnavailableError where it cannot now); a cloud call reserves its room in the
             budget ledger, and a spent budget or an open circuit turns a cloud decision into an
             edge one
    execute  edge (on its own thread), cloud (httpx AsyncClient), cascade, or cloud->edge
             continuation when a cloud stream breaks mid-answer
    record   the cache store (confident answers only), the stats; the ledger's reservation is
             settled with the call's real tokens, or released when no call answered

Every optional part (cache, cloud, policy, budget) may be None; the edge is always there.

Core (here) runs the steps; each lives in its own module of this package: lookup and record in
``cache_steps``, plan in ``plan``, execute in ``execute`` (streamed by ``emit`` and ``answer``), the
ledger and the cost in ``accounting``; the request in ``request``, the parts' ports in ``ports``,
the failures in ``failures``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from contextlib import aclosing
from typing import Any

from .._exceptions import ConfigError, HybridLLMError, InvalidRequestError
from .._forks import FORKED, forked_from
from .._stats import Stats
from .._tools import uses_tools
from .._types import Chunk, GenerationParams, Message, check_option_names, normalize_messages
from ..backends.base import Backend
from ..backends.worker import EdgeWorker
from .accounting import _account, _tokens_of
from .cache_steps import _CacheSteps, cache_model_of
from .emit import Chunks
from .execute import _Executor
from .ports import CachePort, LedgerPort, PolicyPort
from .request import Options, Request

log = logging.getLogger("hybridllm")


class Core(_CacheSteps, _Executor):
    def __init__(
        self,
        *,
        edge: Backend,
        cloud: Backend | None = None,
        cache: CachePort | None = None,
        policy: PolicyPort | None = None,
        ledger: LedgerPort | None = None,
        defaults: dict[str, Any] | None = None,
        namespace: str = "default",
        price_per_1k_tokens: float = 0.0,
        cache_min_logprob: float | None = None,
        edge_max_waiting: int = 64,
        edge_wait_timeout_s: float | None = 300.0,
    ) -> None:
        self.edge = edge
        self.cloud = cloud
        self.cache = cache
        self.policy = policy
        self.ledger = ledger
        self.defaults = {k: v for k, v in (defaults or {}).items() if v is not None}
        self.namespace = namespace
        self.cache_min_logprob = cache_min_logprob
        self.stats = Stats(price_per_1k_tokens=price_per_1k_tokens)
        # an answer is keyed by what can make it: the edge model and the cloud model, or with no
        # cloud_model the cloud's endpoints (cache_model_of), so changing either serves none of
        # the old one's answers
        self.cache_model = cache_model_of(edge, cloud)
        self.edge_worker = EdgeWorker(edge, max_waiting=edge_max_waiting, wait_timeout_s=edge_wait_timeout_s)
        # a forced cloud route skips the budget for a library caller (its own money) and is held
        # to it where callers are not the budget's owner (hybridllm serve's HTTP clients)
        self.budget_binds_forced_cloud = False
        self.close_timeout_s = 30.0  # how long close() waits for the device's current step
        self._closed = False
        self._pid = os.getpid()  # a fork has none of the client's threads: refused there (prepare)
        self._cache_write_failed = False
        self._cache_embed_failed = False  # an embedder that cannot load says so once, not per request
        self._edge_tools: bool | None = None  # the device model reads tools (asked at the first)
        GenerationParams.from_kwargs(**self.defaults)  # bad defaults fail at construction

    # -- validation, at the call --------------------------------------------------------------
    def prepare(self, messages: str | Sequence[Message], params: dict[str, Any]) -> Request:
        if self._closed:
            raise HybridLLMError("This client is closed; create a new HybridLLM.")
        if self.forked:
            # the sync client's loop thread is not in the child (its call waited for ever), nor the
            # device worker (the async client's waited edge_wait_timeout_s, then said "busy")
            raise HybridLLMError(FORKED.format(pid=self._pid, here=os.getpid()))
        overrides = dict(params)
        opts = Options.pop_from(overrides)
        check_option_names(overrides, routing=[f.name for f in dataclasses.fields(Options)])
        if opts.route == "cloud" and self.cloud is None:
            raise ConfigError("route='cloud' needs a cloud endpoint: pass cloud_url=...")
        merged = {**self.defaults, **{k: v for k, v in overrides.items() if v is not None}}
        req = Request(normalize_messages(messages), GenerationParams.from_kwargs(**merged), opts)
        if req.calls_tools:  # a model that reads tools: the cloud's, or the device's
            req.edge_tools = self._edge_calls_tools()
            if self.cloud is None and not req.edge_tools:
                raise ConfigError(f"tools need a model whose chat template lists them, and the device "
                                  f"model ({self.edge.model}) has none: pass cloud_url=... (the cloud "
                                  "model calls them), or use an edge_model whose template lists tools "
                                  "(qwen2.5-coder-0.5b-instruct).")
            if opts.route == "edge" and not req.edge_tools:
                raise InvalidRequestError(f"route='edge' cannot take tools: the device model "
                                          f"({self.edge.model}) has no tool format in its chat template. "
                                          "Leave out route, or the tools.")
        return req

    @property
    def forked(self) -> bool:
        """Whether this process is a fork of the one that built the client (none of its threads runs here)."""
        return forked_from(self._pid)

    def _edge_calls_tools(self) -> bool:
        """Whether the device model can be given tools (its ``calls_tools()``, asked once; a custom
        edge without it, or whose answer raises, cannot)."""
        if self._edge_tools is None:
            probe = getattr(self.edge, "calls_tools", None)
            try:
                self._edge_tools = bool(probe()) if callable(probe) else False
            except Exception as exc:  # noqa: BLE001 - a custom backend's: it calls no tools
                log.warning("the edge backend's calls_tools() raised %s; tools go to the cloud",
                            type(exc).__name__)
                self._edge_tools = False
        return self._edge_tools

    # -- the pipeline -------------------------------------------------------------------------
    async def run(self, req: Request) -> Chunks:
        """Yield the answer's chunks; the last one carries the Completion."""
        start = time.perf_counter()
        # a request with tools, or a conversation with calls and results in it, is never served
        # from the cache nor kept there: its answer depends on what the tools did
        use_cache = (self.cache is not None and req.options.cache and req.options.route is None
                     and not uses_tools(req.messages, req.params.tools))
        answered = False  # the stats have the answer, with its cloud calls' cost
        try:
            vec, hit = await self._lookup(req) if use_cache else (None, None)
            decision = None if hit is not None else await self._plan(req, vec)
            source = self._replay_hit(hit, start) if hit is not None else self._execute(req, decision, start)  # type: ignore[arg-type]
            final: Chunk | None = None
            async with aclosing(source) as chunks:
                async for chunk in chunks:
                    if chunk.completion is not None:  # (an InlineRun has none: passed on)
                        final = chunk  # held back until recorded, so a caller that stops at the
                        continue  # finish chunk still leaves stats and cache complete
                    yield chunk
            if final is not None and final.completion is not None:
                if decision is None:  # a cache hit: it saved the call that made the answer it replays
                    self.stats.record(final.completion, avoided_tokens=_tokens_of(hit))
                else:
                    cloud_tokens = _account(self.stats, req, final.completion)
                    answered = True  # _record's first step: the stats take the answer
                    await self._record(req, decision, final.completion, vec, use_cache, cloud_tokens)
                # the ledger settles before the last chunk goes out (the finally finds nothing left):
                # a reader that stopped at the finish chunk and kept the stream held the call's
                # reservation (prompt + max_tokens) while stats() already counted its real tokens
                self._settle(req, answered=answered)
                yield final
        finally:
            self._settle(req, answered=answered)

    async def aclose(self) -> None:
        if not self._closed and self.cloud is not None and not self.forked:  # (a fork's: see close)
            try:
                await self.cloud.aclose()  # its connections on this loop
            except Exception as exc:  # noqa: BLE001 - the device model is freed all the same
                _close_failed(self.cloud, "cloud", exc)
        # off the loop: close() waits for the device's current step (a long prompt's prefill took
        # 1.3 s on SmolLM2, up to close_timeout_s), and the app's loop must keep running meanwhile
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        if not self._closed and self.forked:
            # a forked child's copy: the parts are the parent's (a sqlite cache closed here can
            # checkpoint the parent's database under it, a connection's close talks on the parent's
            # socket); they go with the child's memory when it exits
            self._closed = True
        if not self._closed:
            self._closed = True
            edge: Backend | None = self.edge
            if not self.edge_worker.close(timeout_s=self.close_timeout_s):
                # freeing a llama.cpp / ONNX Runtime model under the thread still running it
                # would crash the process: it stays loaded until that step ends and the process exits
                log.warning("the device model was still generating %.0f s after close(); it is left "
                            "loaded instead of being freed under the running step", self.close_timeout_s)
                edge = None
            for side, part in (("edge", edge), ("cloud", self.cloud), ("cache", self.cache)):
                # (a cache= with get() and put() alone has nothing to close: not a failure to log)
                if part is not None and (side != "cache" or callable(getattr(part, "close", None))):
                    try:
                        part.close()
                    except Exception as exc:  # noqa: BLE001 - one part's failure must not keep the others open
                        _close_failed(part, side, exc)


def _close_failed(part: object, side: str, exc: Exception) -> None:
    """A part whose close() raised: said as a warning (the original in the debug log), not raised, so
    that the client's other parts and its threads are closed too and a ``with`` block's own result
    (or error) stands."""
    name = getattr(part, "name", None) or side
    log.warning("closing the %s part %r (%s) failed: %s: %s; the client's other parts were closed",
                side, name, type(part).__name__, type(exc).__name__, exc)
    log.debug("the %s part's close() error", side, exc_info=exc)
