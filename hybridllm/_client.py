"""HybridLLM and AsyncHybridLLM: one call that answers on the device or in the cloud.

Both drive one async pipeline (:mod:`._pipeline`). The async client runs it on the caller's event
loop; the sync client runs it on a private loop thread and hands chunks across. The device model
answers one request at a time in arrival order, and no caller holds a lock while it reads: for
the async client on the device's own thread; for the sync client on the caller's own thread once
its turn comes (an :class:`InlineRun`), so a device answer crosses no thread per token.

``stream()`` validates at the call and returns a :class:`Stream` (``AsyncStream``): iterate it
once, or use it as a context manager; ``completion`` is set once the answer is complete.

A client's threads and device model live until ``close()`` (``aclose()``). A stream keeps its
client alive while it is read; a client dropped without closing is closed when it is collected,
with a ResourceWarning; sync clients still open at interpreter exit are closed then (before
teardown, when the private loop thread can still run: a stream left open at exit used to wait
60 s for that thread).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import dataclasses
import os
import threading
import warnings
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from typing import Any

from ._config import HybridLLMConfig, load_config
from ._exceptions import ConfigError, HybridLLMError, StreamConsumedError
from ._pipeline import CachePort, Core, PolicyPort
from ._types import Chunk, Completion, Message
from .backends.base import Backend, call_guarded, drain_loop
from .backends.worker import InlineRun

CLOSED_MID_ANSWER = "The client was closed before this answer was complete."
ASYNC_CLIENT_CLOSED = "This client is closed; create a new AsyncHybridLLM."
# (it said "close() from another thread", for a close() in the reading loop itself too)
STREAM_CLOSED_MID_ANSWER = ("The stream was closed (its close() or aclose()) while it was being read, "
                            "before its answer was complete.")
CLOSED_BEFORE_END = ("This stream was closed before its answer was complete; call stream() again for "
                     "another answer.")
READ_ELSEWHERE = ("This stream is being read by another thread or task; a stream has one reader at a "
                  "time.")
VIEW_STOP_WAIT_S = 10.0  # at close, the longest wait for the answers of wrap() views to stop
EXECUTOR_WAIT_S = 30.0  # at close, the longest wait for a running cache lookup or router call
NOT_CLOSED = (
    "{name} was garbage-collected without {close}(); its device model and threads were released "
    "now. Call {close}() when done, or use `{with_} {name}(...) as llm:`."
)


class _Live:
    """A client or stream is one live thing (a loaded model, threads, an answer being read): a
    shallow copy shared them, so closing the copy closed the original (and deepcopy or pickle
    failed with "cannot pickle '_thread.lock' object"). Copy, deepcopy and pickle are refused."""

    def __reduce_ex__(self, protocol: object) -> Any:
        name = type(self).__name__
        raise TypeError(f"{name} cannot be copied or pickled: it holds a live device model, threads "
                        f"and connections. Share one {name} (between threads or tasks), or create a "
                        "new one in each process.")


class _LoopThread:
    """A private event loop on a daemon thread, started on first use. ``close`` cancels what is
    still running on it, so a thread waiting for a step gets an error instead of waiting for ever."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def on_loop_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            return self._running_loop()

    def _running_loop(self) -> asyncio.AbstractEventLoop:  # under the lock
        if self._closed:
            raise HybridLLMError("This client is closed; create a new HybridLLM.")
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="hybridllm-loop", daemon=True)
            self._thread.start()
        return self._loop

    def submit(self, coro: Any) -> concurrent.futures.Future:
        # under the lock: a step is either on the loop before close() cancels what runs there, or
        # refused; never scheduled on a loop that stops before running it (its reader would wait)
        with self._lock:
            try:
                loop = self._running_loop()
            except HybridLLMError:
                coro.close()  # never started: nothing to await
                raise
            return asyncio.run_coroutine_threadsafe(coro, loop)

    def close(self, before_stop: Any = None) -> None:
        """Refuse new steps, cancel the running ones (their waiting readers raise), call
        ``before_stop`` (closing the parts: nothing of theirs runs any more, and the loop still
        runs for what their closing needs), then stop the loop."""
        with self._lock:
            self._closed = True
            loop, thread, self._loop = self._loop, self._thread, None
        on_loop = thread is not None and threading.current_thread() is thread
        if loop is not None and thread is not None and not on_loop:
            # steps still running end as cancelled, and their waiting readers with them; answers
            # whose reader is between two steps (the sync client's device answer is generated on
            # the reader's thread, off the loop) are suspended, not running: closed here, so that
            # their cleanup runs now and not in a task left pending at exit
            try:
                asyncio.run_coroutine_threadsafe(drain_loop(cancel=True), loop).result(timeout=20)
            except (concurrent.futures.TimeoutError, RuntimeError):
                pass
            try:  # then the pool threads' jobs (a cache lookup, the router) end: the parts are
                # closed only when nothing of theirs runs, and no pool thread outlives close()
                asyncio.run_coroutine_threadsafe(loop.shutdown_default_executor(), loop).result(
                    timeout=EXECUTOR_WAIT_S)
            except (concurrent.futures.TimeoutError, RuntimeError):
                pass
        if before_stop is not None:
            before_stop()
        if loop is None or thread is None:
            return
        if on_loop:
            loop.call_soon(loop.stop)
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        if not loop.is_running():
            loop.close()


class Stream(_Live):
    """The chunks of one answer, read once. ``completion`` is set after the last chunk.

    >>> with llm.stream("hi") as s:
    ...     for chunk in s:
    ...         print(chunk.text, end="")

    It is an iterator too, as an openai or httpx stream is: ``next(s)`` reads the next chunk, and a
    ``for`` loop after it reads on from there. Close it (or use ``with``) when not reading it to
    its end with ``next()``: leaving a ``for`` loop stops the answer, a pause between ``next()``
    calls does not.
    """

    def __init__(self, chunks: AsyncIterator[Chunk], loop: _LoopThread, owner: object = None) -> None:
        self._chunks = chunks
        self._loop = loop
        self._owner = owner  # the client: not collected (and closed) while its stream is read
        self._task: asyncio.Task | None = None
        self._used = False
        self._closed = False
        self._inline: InlineRun | None = None  # the device answer the reader's thread is generating
        self._reader: Iterator[Chunk] | None = None  # the chunks next() reads (after the first next())
        self._next_lock = threading.Lock()  # held by the thread in next()
        self.completion: Completion | None = None

    async def _next(self) -> Chunk:
        self._task = asyncio.current_task()
        return await anext(self._chunks)

    def __iter__(self) -> Iterator[Chunk]:
        if self._reader is not None and not self._closed:  # next() began it: a for loop reads on
            return self._read_on(self._reader)
        if self._used or self._closed:
            raise StreamConsumedError(
                "This stream was already read (or closed); a stream yields its answer once. "
                "Call stream() again for another answer, or read .completion."
            )
        self._used = True
        return self._iterate()

    def _read_on(self, reader: Iterator[Chunk]) -> Iterator[Chunk]:
        # leaving this for loop (break, an error) stops the answer, as leaving one begun without
        # next() does; it read the stream's own reader, left open, and the device generated the
        # rest of the answer (up to max_tokens) for no one before the next request could start
        try:
            yield from reader
        finally:
            self.close()

    def __next__(self) -> Chunk:
        # next() from two threads at once: the second got "ValueError: generator already executing"
        if not self._next_lock.acquire(blocking=False):
            raise StreamConsumedError(READ_ELSEWHERE)
        try:
            if self._reader is None:
                self._reader = self.__iter__()  # StreamConsumedError when already read or closed
            elif self._closed and self.completion is None:  # closed half way: not an end of the answer
                if self._loop.closed:
                    raise HybridLLMError(CLOSED_MID_ANSWER)
                raise StreamConsumedError(CLOSED_BEFORE_END)
            return next(self._reader)
        finally:
            self._next_lock.release()

    async def _resume(self, run: InlineRun) -> Chunk:
        run.deliver()  # the device answer's end (or error) back into the pipeline
        return await self._next()

    def _iterate(self) -> Iterator[Chunk]:
        try:
            step = self._next()
            started = False
            while True:
                try:
                    fut = self._loop.submit(step)
                except HybridLLMError:
                    if started:  # closed between two steps of this answer
                        raise HybridLLMError(CLOSED_MID_ANSWER) from None
                    raise
                started = True
                try:
                    chunk = fut.result()
                except StopAsyncIteration:
                    if self._closed and self.completion is None:  # close() from another thread
                        raise StreamConsumedError(STREAM_CLOSED_MID_ANSWER) from None
                    return
                except (concurrent.futures.CancelledError, Exception):
                    if self._loop.closed:  # the client's close() from another thread, mid-answer
                        raise HybridLLMError(CLOSED_MID_ANSWER) from None
                    if self._closed:  # this stream's close() from another thread, mid-answer
                        raise StreamConsumedError(STREAM_CLOSED_MID_ANSWER) from None
                    fut.cancel()
                    raise
                except BaseException:
                    fut.cancel()  # Ctrl-C while waiting: stop the pipeline too
                    raise
                if isinstance(chunk, InlineRun):
                    # the device answers on this thread: its chunks come straight from the
                    # model's token loop; leaving the loop here closes it and stops decoding
                    self._inline = chunk
                    try:
                        yield from chunk.chunks()
                    finally:
                        self._inline = None
                    self._check_open()
                    step = self._resume(chunk)
                    continue
                if chunk.completion is not None:
                    self.completion = chunk.completion
                yield chunk
                self._check_open()
                step = self._next()
        finally:
            self.close()

    def _check_open(self) -> None:
        """Between two chunks: a close() from another thread ends the reader with an error, not
        with a shorter answer passed off as finished."""
        if self._closed and self.completion is None:
            raise StreamConsumedError(STREAM_CLOSED_MID_ANSWER)

    async def _aclose(self) -> None:
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])
        await self._chunks.aclose()  # type: ignore[attr-defined]

    def close(self) -> None:
        """Stop generating (the device stops at its next token, the cloud call is dropped)."""
        if self._closed:
            return
        self._closed = True
        run = self._inline
        if run is not None:  # the device answers on the reader's thread: it stops at its next token
            run.cancel()
        reader = self._reader  # (kept: next() after the end raises StopIteration again)
        if reader is not None and not getattr(reader, "gi_running", True):
            # suspended between two next() calls: its own cleanup runs now (a device answer frees
            # its turn), not whenever it is collected
            try:
                reader.close()  # type: ignore[attr-defined]
            except ValueError:  # another thread resumed it meanwhile: it ends at the closed check
                pass
        if self._loop.on_loop_thread():
            # closed on the loop's own thread: a stream read with next() and dropped is a cycle
            # (its reader holds it), collected by whichever thread the garbage collector runs on;
            # waiting there for a step of that same loop stalled it, and every answer of the
            # client, for the 60 s timeout. The step runs once this returns
            try:
                self._loop.submit(self._aclose())
            except HybridLLMError:
                pass  # the client is closed: its close() stopped the answer
            return
        try:
            self._loop.submit(self._aclose()).result(timeout=60)
        except (HybridLLMError, RuntimeError, concurrent.futures.TimeoutError, asyncio.CancelledError,
                concurrent.futures.CancelledError):  # (the client's close() cancelled this close)
            pass  # the client's loop is gone or stuck: nothing more to stop

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncStream(_Live):
    """The async :class:`Stream`: ``async for`` once, or ``async with``; ``completion`` after.
    ``await anext(s)`` reads the next chunk (as with an openai AsyncStream), and ``async for``
    after it reads on from there."""

    def __init__(self, chunks: AsyncIterator[Chunk], owner: object = None) -> None:
        self._chunks = chunks
        self._owner = owner  # the client: not collected (and closed) while its stream is read
        self._used = False
        self._closed = False
        self._step: asyncio.Future[Chunk] | None = None  # the chunk the reader waits for
        self._client_closed = False  # stopped by its client's aclose(): the reader is told so
        # anext() began reading. It reads through _next() itself, not through a generator kept on
        # the stream: a generator's frame holds the stream, and that cycle, once dropped half
        # way, was collected with every generator under it at once, each closed on its own while
        # the one above closed it ("aclose(): asynchronous generator is already running", logged)
        self._stepping = False
        self._loop: asyncio.AbstractEventLoop | None = None  # where it is read: a sync close() stops it there
        self.completion: Completion | None = None

    def __aiter__(self) -> AsyncIterator[Chunk]:
        if self._stepping and not self._closed:  # anext() began it: async for reads on
            return self._iterate()
        self._begin()
        return self._iterate()

    def _begin(self) -> None:
        if self._client_closed:
            raise HybridLLMError(ASYNC_CLIENT_CLOSED)
        if self._used or self._closed:
            raise StreamConsumedError(
                "This stream was already read (or closed); a stream yields its answer once."
            )
        self._used = True

    async def __anext__(self) -> Chunk:
        if self._step is not None:  # another task waits for a chunk: refused, its answer left whole
            # (it raised "asynchronous generator is already running" and closed the answer)
            raise StreamConsumedError(READ_ELSEWHERE)
        if not self._stepping:
            self._begin()  # (raises when read or closed)
            self._stepping = True
        elif self._closed and self.completion is None:  # closed half way: not an end of the answer
            if self._client_closed:
                raise self._cut_off()
            raise StreamConsumedError(CLOSED_BEFORE_END)
        try:
            return await self._next()
        except BaseException:  # the end, an error, a cancelled reader: the answer is closed
            await self.aclose()
            raise

    async def _iterate(self) -> AsyncGenerator[Chunk, None]:
        try:
            while True:
                try:
                    chunk = await self._next()
                except StopAsyncIteration:
                    return
                yield chunk
        finally:
            await self.aclose()

    async def _next(self) -> Chunk:
        """The next chunk; ``StopAsyncIteration`` after the last."""
        if self._closed:  # aclose() from another task, between two chunks
            if self.completion is None:
                raise self._cut_off()
            raise StopAsyncIteration
        self._loop = asyncio.get_running_loop()
        # each chunk is awaited as its own task, so that aclose() from another task can stop the
        # one the reader waits for (an async generator cannot be closed while it runs:
        # "aclose(): asynchronous generator is already running")
        self._step = step = asyncio.ensure_future(self._anext())
        try:
            chunk = await step
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closed and step.cancelled() and not (task is not None and task.cancelling()):
                raise self._cut_off() from None
            raise  # the reader's own task was cancelled
        finally:
            self._step = None
        if chunk.completion is not None:
            self.completion = chunk.completion
        return chunk

    async def _anext(self) -> Chunk:
        return await anext(self._chunks)

    def _cut_off(self) -> HybridLLMError:
        """The error of a reader whose answer was stopped half way from outside (as the sync
        :class:`Stream` says it)."""
        if self._client_closed:
            return HybridLLMError(CLOSED_MID_ANSWER)
        return StreamConsumedError(STREAM_CLOSED_MID_ANSWER)

    async def _stop_for_client(self) -> None:
        """The client's aclose(): stop this answer; its reader gets ``HybridLLMError``."""
        self._client_closed = True
        await self.aclose()

    def _stop_from_thread(self) -> concurrent.futures.Future | None:
        """The sync client's close() (from any thread): stop this answer on the loop that reads it;
        the reader gets ``HybridLLMError``. Returns what to wait for (None: nothing can be)."""
        self._client_closed = True
        loop = self._loop
        if loop is None or loop.is_closed() or not loop.is_running():
            self._closed = True  # never read, or its loop is gone: the next read raises
            return None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:  # close() called on the reader's own loop: it stops once this returns
            loop.create_task(self.aclose())
            return None
        try:
            return asyncio.run_coroutine_threadsafe(self.aclose(), loop)
        except RuntimeError:  # the loop closed meanwhile
            self._closed = True
            return None

    async def aclose(self) -> None:
        """Stop generating; from another task, the reader gets ``StreamConsumedError``."""
        if not self._closed:
            self._closed = True
            step = self._step
            if step is not None and not step.done():  # a reader in another task waits for a chunk
                step.cancel()
                await asyncio.wait([step])
            await self._chunks.aclose()  # type: ignore[attr-defined]

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _build_core(
    *,
    config: str | os.PathLike[str] | None,
    edge: Backend | None,
    cloud: Backend | None,
    cache: CachePort | bool | None,
    policy: PolicyPort | None,
    progress: Any,
    settings: dict[str, Any],
) -> tuple[HybridLLMConfig, Core]:
    """Settings -> parts -> the pipeline. ``cache`` is a cache object, or True/False/None for
    "the default one" / "none" / "as configured"."""
    _check_parts(edge=edge, cloud=cloud, cache=cache, policy=policy)
    if config is not None and not isinstance(config, (str, os.PathLike)):
        # a dict or a HybridLLMConfig raised a bare TypeError from deep in the path handling
        raise ConfigError(f"config= is the path of a TOML file; got {type(config).__name__}. Pass "
                          "settings as keyword arguments instead (HybridLLM(max_tokens=128, ...)).")
    if isinstance(cache, bool):
        settings["cache"] = cache
        cache = None
    cfg = load_config(config, **settings)
    store: CachePort | None = cache
    defaults = {
        "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": cfg.top_k,
        "min_p": cfg.min_p,
        "repeat_penalty": cfg.repeat_penalty,
        "seed": cfg.seed,
    }
    made: list[Any] = []
    try:
        if edge is None:
            from .backends.base import create_backend

            edge = create_backend(  # "llama_cpp" or "onnx"
                cfg.edge_backend,
                model=cfg.edge_model,
                n_ctx=cfg.n_ctx,
                n_threads=cfg.n_threads,
                progress=progress,
            )
            made.append(edge)
        if cloud is None and cfg.cloud_url:
            from .backends.cloud import CloudBackend

            cloud = CloudBackend(
                base_url=cfg.cloud_url,
                api_key=cfg.cloud_api_key,
                model=cfg.cloud_model,
                connect_timeout_s=cfg.cloud_connect_timeout_s,
                read_timeout_s=cfg.cloud_read_timeout_s,
                stall_timeout_s=cfg.cloud_stall_timeout_s,
                max_retries=cfg.cloud_max_retries,
                breaker_threshold=cfg.cloud_breaker_threshold,
                breaker_cooldown_s=cfg.cloud_breaker_cooldown_s,
                carbon=cfg.cloud_endpoints or None,  # hybridllm.carbon: region, gCO2/kWh
                joules_per_token=cfg.cloud_joules_per_token,
            )
            made.append(cloud)
        if cloud is not None and policy is None:
            policy = _make_policy(cfg, edge)
        if store is None and cfg.cache:
            from .cache import SemanticCache

            store = SemanticCache(
                cfg.cache_path,
                namespace=cfg.namespace,
                ttl_s=cfg.cache_ttl_s,
                max_entries=cfg.cache_max_entries,
                verifier=cfg.cache_verifier,
            )
        ledger = None
        if cloud is not None:
            ledger = cfg.budget()
        core = Core(
            edge=edge,
            cloud=cloud,
            cache=store,
            policy=policy,
            ledger=ledger,
            defaults=defaults,
            namespace=cfg.namespace,
            price_per_1k_tokens=cfg.price_per_1k_tokens,
            cache_min_logprob=cfg.cache_min_logprob,
            edge_max_waiting=cfg.edge_max_waiting,
            edge_wait_timeout_s=cfg.edge_wait_timeout_s,
        )
    except BaseException:
        for part in made:
            part.close()
        raise
    return cfg, core


# an injected part is checked for what the pipeline calls on it, so that a wrong object (a model
# name passed as edge="smollm2", cache="yes") fails at construction, naming the argument, and not
# with an AttributeError deep inside the first answer (or at close)
_PART_NEEDS = {
    "edge": ("stream",),
    "cloud": ("stream",),
    "cache": ("get", "put"),
    "policy": ("decide",),
}
_PART_WHAT = {
    "edge": "a Backend (hybridllm.Backend); to pick a model by name use edge_model=",
    "cloud": "a Backend (hybridllm.Backend); to use an endpoint by URL use cloud_url=",
    "cache": "True, False or a cache object with get() and put() (hybridllm.cache.SemanticCache)",
    "policy": "a routing policy with decide() (hybridllm.router.RoutingPolicy)",
}


def _check_parts(**parts: Any) -> None:
    for name, part in parts.items():
        if part is None or (name == "cache" and isinstance(part, bool)):
            continue
        if isinstance(part, type):  # the class itself has the methods, unbound: refused here, not
            # at the first answer (an EdgeError) or, for a cache, never (every lookup failed, logged)
            raise ConfigError(f"{name}= must be {_PART_WHAT[name]}; got the class {part.__name__}, "
                              f"not an instance: pass {part.__name__}(...).")
        missing = [m for m in _PART_NEEDS[name] if not callable(getattr(part, m, None))]
        if missing:
            lacks = ", ".join(f"{m}()" for m in missing)
            raise ConfigError(f"{name}= must be {_PART_WHAT[name]}; got {part!r} (no {lacks}).")


def _make_policy(cfg: HybridLLMConfig, edge: Backend) -> PolicyPort:
    from .router.policy import RoutingPolicy
    from .router.router import load_router

    router = load_router(cfg.router)
    if cfg.threshold is not None:
        router = dataclasses.replace(router, threshold=cfg.threshold)
    band = (max(0.0, router.threshold - 0.1), router.threshold) if cfg.cascade else None
    return RoutingPolicy(
        router, privacy=cfg.privacy, cascade_band=band,
        edge_context_tokens=call_guarded(lambda: edge.context_length, edge, "edge") or cfg.n_ctx,
    )


class _Surface(_Live):
    """What both clients share: construction, the parts, stats. The constructor's signature is
    the clients' own (a type checker and an IDE see every part's type); each client sets up the
    rest in ``_start``."""

    _core: Core
    config: HybridLLMConfig

    def __init__(
        self,
        *,
        config: str | os.PathLike[str] | None = None,
        edge: Backend | None = None,
        cloud: Backend | None = None,
        cache: CachePort | bool | None = None,
        policy: PolicyPort | None = None,
        progress: Any = None,
        **settings: Any,
    ) -> None:
        self.config, self._core = _build_core(
            config=config,
            edge=edge,
            cloud=cloud,
            cache=cache,
            policy=policy,
            progress=progress,
            settings=settings,
        )
        self._start()

    def _start(self) -> None:
        """The client's own state, once the parts are built."""

    @property
    def edge(self) -> Backend:
        return self._core.edge

    @property
    def cloud(self) -> Backend | None:
        return self._core.cloud

    @property
    def cache(self) -> CachePort | None:
        return self._core.cache

    def stats(self) -> dict[str, Any]:
        """Requests per route, cache hit rate, cloud fraction, latency/TTFT percentiles, cost,
        and the cloud budget's ledger (calls and tokens in the last hour and day)."""
        out = self._core.stats.snapshot()
        if self._core.ledger is not None:
            out["budget"] = self._core.ledger.usage()
        return out


class HybridLLM(_Surface):
    """Answer chat requests from the cache, on the device or in the cloud, whichever fits.

    >>> llm = HybridLLM()                                   # device only, cache on
    >>> llm = HybridLLM(cloud_url="http://gpu-host:8000")   # + learned routing to the cloud
    >>> c = llm.chat("What is the capital of France?")
    >>> c.text, c.route, c.reason

    Settings (see :class:`hybridllm._config.HybridLLMConfig`) come from keyword arguments, then
    ``HYBRIDLLM_*`` environment variables, then a TOML file. Parts can be injected for tests or
    custom setups: ``edge=``, ``cloud=``, ``cache=`` (an object, or True/False), ``policy=``.
    Threads may share one client.
    """

    def _start(self) -> None:
        self._loop = _LoopThread()
        # the finalizer holds the parts, never the client (that would keep it alive for ever)
        self._finalizer = weakref.finalize(self, _close_collected, self._loop, self._core, "HybridLLM")
        self._finalizer.atexit = False  # at exit: _close_open_clients, with no warning
        _OPEN_CLIENTS.add(self)
        # its AsyncHybridLLM.wrap() views: close() stops their answers too (they run on the
        # caller's loops, not on this client's loop thread, and ran on to their end after close())
        self._views: weakref.WeakSet[AsyncHybridLLM] = weakref.WeakSet()
        # close() from two threads at once: the second waits for the first. It returned at once,
        # before the client was closed, and closed the parts (the cache) under a lookup still
        # running, which the first close() waits for (reentrant: a part's close may call it)
        self._close_lock = threading.RLock()

    def chat(self, messages: str | Sequence[Message], **params: Any) -> Completion:
        """Answer ``messages`` (a string or OpenAI-style messages) and return the Completion.

        Keyword options: sampling (max_tokens, temperature, top_p, top_k, min_p,
        repeat_penalty, seed, stop) and routing (route="edge"|"cloud", cache=False,
        cascade=True|False, namespace="tenant").
        """
        with self.stream(messages, **params) as stream:
            for _ in stream:
                pass
        if stream.completion is None:  # the pipeline always ends with one
            raise HybridLLMError("The backend ended without finishing the answer.")
        return stream.completion

    def stream(self, messages: str | Sequence[Message], **params: Any) -> Stream:
        """Stream the answer chunk by chunk. Bad input raises here, before any chunk; leaving
        the loop or closing the stream stops generation."""
        req = self._core.prepare(messages, params)
        req.inline_edge = True  # a device answer is generated on the reading thread
        return Stream(self._core.run(req), self._loop, owner=self)

    def close(self) -> None:
        """Stop what is running, free the device model, end the client's threads."""
        with self._close_lock:
            self._finalizer.detach()
            _OPEN_CLIENTS.discard(self)
            # the views' answers end first, while the parts they use are still open (a loop that
            # is stuck, in a blocking call, holds close() up for VIEW_STOP_WAIT_S at most)
            stops = [stop for view in _snapshot(self._views) for stop in view._stop_for_owner()]
            if stops:
                concurrent.futures.wait(stops, timeout=VIEW_STOP_WAIT_S)
            self._loop.close(before_stop=self._core.close)

    def __enter__(self) -> HybridLLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncHybridLLM(_Surface):
    """The async client: the same pipeline on the caller's event loop (the cloud over httpx's
    AsyncClient, the device model on its own thread), the same surface as :class:`HybridLLM`."""

    def _start(self) -> None:
        self._owner: HybridLLM | None = None
        self._streams: weakref.WeakSet[AsyncStream] = weakref.WeakSet()  # what aclose() stops
        self._closed = False
        self._closed_done = False  # aclose() ran to its end
        self._closing: asyncio.Future[None] | None = None  # the aclose() under way
        self._finalizer: weakref.finalize[Any, Any] | None = weakref.finalize(
            self, _close_collected, None, self._core, "AsyncHybridLLM")
        self._finalizer.atexit = False  # at exit the device worker stops itself (backends.worker)

    @classmethod
    def wrap(cls, client: HybridLLM) -> AsyncHybridLLM:
        """An async view of ``client``: the same parts, cache and stats. It keeps ``client`` alive
        and never closes it (its ``aclose()`` stops only its own streams): close ``client`` when done;
        its ``close()`` stops the view's answers too."""
        # (an AttributeError from deep inside, before); _Surface's sync kind, not the name HybridLLM,
        # which a test or an app may have patched with a factory
        if not isinstance(client, _Surface) or isinstance(client, AsyncHybridLLM):
            hint = ": use it as it is" if isinstance(client, AsyncHybridLLM) else ""
            raise ConfigError(f"AsyncHybridLLM.wrap() takes a HybridLLM; got {type(client).__name__}{hint}.")
        self = cls.__new__(cls)
        self.config, self._core = client.config, client._core
        self._owner = client
        self._streams = weakref.WeakSet()
        self._closed = False
        self._closed_done = False
        self._closing = None
        self._finalizer = None
        client._views.add(self)
        return self

    def _stop_for_owner(self) -> list[concurrent.futures.Future]:
        """The wrapped client's close(), from any thread: each answer still streaming ends with
        ``HybridLLMError`` on its own loop. Returns the stops to wait for."""
        stops = [stream._stop_from_thread() for stream in _snapshot(self._streams)]
        return [stop for stop in stops if stop is not None]

    async def chat(self, messages: str | Sequence[Message], **params: Any) -> Completion:
        async with self.stream(messages, **params) as stream:
            async for _ in stream:
                pass
        if stream.completion is None:
            raise HybridLLMError("The backend ended without finishing the answer.")
        return stream.completion

    def stream(self, messages: str | Sequence[Message], **params: Any) -> AsyncStream:
        """An :class:`AsyncStream` of chunks; bad input raises here, at the call."""
        if self._closed:
            raise HybridLLMError(ASYNC_CLIENT_CLOSED)
        req = self._core.prepare(messages, params)
        stream = AsyncStream(self._core.run(req), owner=self)
        self._streams.add(stream)
        return stream

    async def aclose(self) -> None:
        """Stop the answers still streaming (their readers get ``HybridLLMError``, as with the
        sync client's close()), then free the device model and the cloud's connections; a
        :meth:`wrap` view leaves its sync client's parts open."""
        self._closed = True  # no new stream from here
        while not self._closed_done:
            running = self._closing
            if running is None or running.done() or running.get_loop() is not asyncio.get_running_loop():
                # its own task: a cancelled caller (asyncio.timeout) cancels it, as before
                self._closing = running = asyncio.ensure_future(self._aclose())
                await running
                return
            # another task's aclose() is under way: return once it is done, as the sync client's
            # second close() does (it returned at once, before the device model was freed)
            await asyncio.wait([running])

    async def _aclose(self) -> None:
        for stream in list(self._streams):  # each ends its cloud call (accounted) or device job
            await stream._stop_for_client()
        if self._owner is None:
            await self._core.aclose()
        # done only now: an aclose() cancelled half way (asyncio.timeout, wait_for) left the device
        # model loaded for ever, and a second aclose() returned at once; now that one closes the
        # rest, and a client never closed whole is still closed when collected
        self._closed_done = True
        if self._finalizer is not None:
            self._finalizer.detach()

    async def __aenter__(self) -> AsyncHybridLLM:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


_OPEN_CLIENTS: weakref.WeakSet[HybridLLM] = weakref.WeakSet()


def _snapshot(items: weakref.WeakSet[Any]) -> list[Any]:
    """A weak set's members, read from a thread while another may add to it."""
    while True:
        try:
            return list(items)
        except RuntimeError:  # "set changed size during iteration": read it again
            pass


@atexit.register  # registered after backends.worker's handler, so it runs before it (LIFO)
def _close_open_clients() -> None:
    """Close the sync clients still open at exit while their loop threads can still run. Later,
    in teardown, daemon threads are frozen: a stream closed then (a generator collected with the
    module's globals) would wait for its loop thread until its timeout."""
    for client in list(_OPEN_CLIENTS):
        try:
            client.close()
        except Exception:  # noqa: BLE001 - one client's failure must not keep the others open
            pass


def _close_collected(loop: _LoopThread | None, core: Core, name: str) -> None:
    """A client collected without close(): release its parts, then say so (ResourceWarning)."""

    def release() -> None:
        if loop is not None:
            loop.close(before_stop=core.close)
        else:
            core.close()

    if (loop is not None and loop.on_loop_thread()) or core.edge_worker.on_worker_thread():
        # collected on one of its own threads (a cycle collected mid-answer): the model must not be
        # freed under that thread's feet, so close from a thread that can wait for it to stop
        threading.Thread(target=release, name="hybridllm-close", daemon=True).start()
    else:
        release()
    with_ = "async with" if loop is None else "with"
    close = "aclose" if loop is None else "close"
    warnings.warn(NOT_CLOSED.format(name=name, close=close, with_=with_), ResourceWarning, stacklevel=1)
