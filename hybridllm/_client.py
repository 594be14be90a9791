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
import concurrent.futures
import os
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from ._async_stream import ASYNC_CLIENT_CLOSED, AsyncStream
from ._config import HybridLLMConfig
from ._exceptions import ConfigError, HybridLLMError
from ._lifecycle import _OPEN_CLIENTS, _close_collected, _Live, _snapshot
from ._loop_thread import _LoopThread
from ._parts import _build_core
from ._pipeline import CachePort, Core, PolicyPort
from ._pipeline.request import Request
from ._stream import Stream
from ._types import Completion, Message
from .backends.base import Backend

VIEW_STOP_WAIT_S = 10.0  # at close, the longest wait for the answers of wrap() views to stop


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
        self._streams: weakref.WeakSet[Stream] = weakref.WeakSet()  # its answers: close() stops them
        # close() from two threads at once: the second waits for the first. It returned at once,
        # before the client was closed, and closed the parts (the cache) under a lookup still
        # running, which the first close() waits for (reentrant: a part's close may call it)
        self._close_lock = threading.RLock()

    def chat(self, messages: str | Sequence[Message], **params: Any) -> Completion:
        """Answer ``messages`` (a string or OpenAI-style messages) and return the Completion.

        Keyword options: sampling (max_tokens, temperature, top_p, top_k, min_p,
        repeat_penalty, presence_penalty, frequency_penalty, seed, stop), structured output
        (response_format={"type": "json_object"}, a json_schema dict, or a pydantic model class;
        ``Completion.parsed`` then holds the answer read as JSON; or vLLM's structured_outputs=
        {"json": schema} | {"regex": pattern} | {"choice": [strings]}), function calling (tools,
        tool_choice, parallel_tool_calls) and routing
        (route="edge"|"cloud", cache=False, cascade=True|False, namespace="tenant").
        """
        _, stream = self._open(messages, params)
        with stream:
            for _ in stream:
                pass
        if stream.completion is None:  # the pipeline always ends with one
            raise HybridLLMError("The backend ended without finishing the answer.")
        return stream.completion  # its .parsed set by the stream (a response_format request)

    def stream(self, messages: str | Sequence[Message], **params: Any) -> Stream:
        """Stream the answer chunk by chunk. Bad input raises here, before any chunk; leaving
        the loop or closing the stream stops generation."""
        return self._open(messages, params)[1]

    def _open(self, messages: str | Sequence[Message], params: dict[str, Any]) -> tuple[Request, Stream]:
        req = self._core.prepare(messages, params)
        req.inline_edge = True  # a device answer is generated on the reading thread
        stream = Stream(self._core.run(req), self._loop, owner=self)
        stream._structured = req.params.parses_json  # its completion gets .parsed (a JSON format)
        self._streams.add(stream)
        return req, stream

    def close(self) -> None:
        """Stop what is running, free the device model, end the client's threads."""
        with self._close_lock:
            self._finalizer.detach()
            _OPEN_CLIENTS.discard(self)
            # the views' answers end first, while the parts they use are still open (a loop that
            # is stuck, in a blocking call, holds close() up for VIEW_STOP_WAIT_S at most)
            # (in a forked child no thread runs the views' loops: nothing there could stop them)
            views = [] if self._core.forked else _snapshot(self._views)
            stops = [stop for view in views for stop in view._stop_for_owner()]
            if stops:
                concurrent.futures.wait(stops, timeout=VIEW_STOP_WAIT_S)
            # then its own answers being read, one at a time, each from its outermost generator.
            # Left to the loop's shutdown, the generators of an answer paused between two chunks
            # were closed all at once, each while the one above it closed it: a cloud answer
            # printed "aclose(): asynchronous generator is already running" tracebacks
            for stream in _snapshot(self._streams):
                if stream._used:  # (one never read has nothing running; reading it says closed)
                    stream._stop_for_client()
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
        _, stream = self._open(messages, params)
        async with stream:
            async for _ in stream:
                pass
        if stream.completion is None:
            raise HybridLLMError("The backend ended without finishing the answer.")
        return stream.completion  # its .parsed set by the stream (a response_format request)

    def stream(self, messages: str | Sequence[Message], **params: Any) -> AsyncStream:
        """An :class:`AsyncStream` of chunks; bad input raises here, at the call."""
        return self._open(messages, params)[1]

    def _open(self, messages: str | Sequence[Message], params: dict[str, Any]) -> tuple[Request, AsyncStream]:
        if self._closed:
            raise HybridLLMError(ASYNC_CLIENT_CLOSED)
        req = self._core.prepare(messages, params)
        stream = AsyncStream(self._core.run(req), owner=self)
        stream._structured = req.params.parses_json  # its completion gets .parsed (a JSON format)
        self._streams.add(stream)
        return req, stream

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
