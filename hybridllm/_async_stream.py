"""AsyncStream: the async client's answer, read once, chunk by chunk, on the caller's event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncGenerator, AsyncIterator

from ._exceptions import HybridLLMError, StreamConsumedError
from ._lifecycle import _Live
from ._stream import (
    CLOSED_BEFORE_END,
    CLOSED_MID_ANSWER,
    READ_ELSEWHERE,
    STREAM_CLOSED_MID_ANSWER,
    _read_again,
)
from ._types import Chunk, Completion, read_parsed

ASYNC_CLIENT_CLOSED = "This client is closed; create a new AsyncHybridLLM."


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
        self._structured = False  # a response_format request: its completion gets .parsed

    def __aiter__(self) -> AsyncIterator[Chunk]:
        if self._stepping and not self._closed:  # anext() began it: async for reads on
            if self._step is not None:  # another task waits in anext(): refused, its answer left whole
                raise StreamConsumedError(READ_ELSEWHERE)
            return self._read_on()
        self._begin()
        return self._iterate()

    async def _read_on(self) -> AsyncGenerator[Chunk, None]:
        # each chunk is read as anext() reads it: reading _next() here met another task's anext()
        # with "RuntimeError: anext(): asynchronous generator is already running", and its cleanup
        # closed the answer under that task. A refusal (READ_ELSEWHERE) closes nothing; any other
        # error has closed the answer in __anext__, and leaving the loop (break, an error) closes it
        while True:
            try:
                chunk = await self.__anext__()
            except StopAsyncIteration:
                return
            try:
                yield chunk
            except BaseException:  # the loop was left here: its answer stops, as in _iterate
                await self.aclose()
                raise

    def _begin(self) -> None:
        if self._client_closed:
            raise HybridLLMError(ASYNC_CLIENT_CLOSED)
        if self._used or self._closed:
            raise StreamConsumedError(_read_again(self._closed, self.completion))
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
            if self._structured:
                read_parsed(chunk.completion)
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
