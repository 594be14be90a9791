"""Stream: the sync client's answer, read once, chunk by chunk, on the caller's thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import weakref
from collections.abc import AsyncIterator, Iterator

from ._exceptions import HybridLLMError, StreamConsumedError
from ._lifecycle import _Live
from ._loop_thread import _LoopThread
from ._types import Chunk, Completion, read_parsed
from .backends.worker import InlineRun

CLOSED_MID_ANSWER = "The client was closed before this answer was complete."
# (it said "close() from another thread", for a close() in the reading loop itself too)
STREAM_CLOSED_MID_ANSWER = ("The stream was closed (its close() or aclose()) while it was being read, "
                            "before its answer was complete.")
CLOSED_BEFORE_END = ("This stream was closed before its answer was complete; call stream() again for "
                     "another answer.")
ALREADY_READ = ("This stream was already read; a stream yields its answer once. Call stream() again for "
                "another answer, or read .completion.")
UNFINISHED_READ = ("This stream is already being read, or was left half way (leaving its loop stops its "
                   "answer); a stream yields its answer once: call stream() again for another answer.")
READ_ELSEWHERE = ("This stream is being read by another thread or task; a stream has one reader at a "
                  "time.")


def _read_again(closed: bool, completion: Completion | None) -> str:
    """Why a stream cannot be read again: it was read to its end, or its answer was cut off (a
    ``break``, a ``close()``), or is still being read (an async loop left half way is closed a
    moment later, by the event loop). Only a whole answer has a ``.completion`` to read: the
    message said to read it for a cut-off one too, where it is None."""
    if completion is not None:
        return ALREADY_READ
    return CLOSED_BEFORE_END if closed else UNFINISHED_READ


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
        self._client_closed = False  # stopped by its client's close(): the reader is told so
        self._inline: InlineRun | None = None  # the device answer the reader's thread is generating
        self._reader: Iterator[Chunk] | None = None  # the chunks next() reads (after the first next())
        self._next_lock = threading.Lock()  # held by the thread in next()
        self.completion: Completion | None = None
        self._structured = False  # a response_format request: its completion gets .parsed

    async def _next(self) -> Chunk:
        self._task = asyncio.current_task()
        return await anext(self._chunks)

    def __iter__(self) -> Iterator[Chunk]:
        if self._reader is not None and not self._closed:  # next() began it: a for loop reads on
            if self._next_lock.locked():  # another thread is in next(): refused, its answer left whole
                raise StreamConsumedError(READ_ELSEWHERE)
            return self._read_on()
        self._begin()
        return self._iterate()

    def _begin(self) -> None:
        if self._used or self._closed:
            raise StreamConsumedError(_read_again(self._closed, self.completion))
        self._used = True

    def _read_on(self) -> Iterator[Chunk]:
        # leaving this for loop (break, an error) stops the answer, as leaving one begun without
        # next() does; it read the stream's own reader, left open, and the device generated the
        # rest of the answer (up to max_tokens) for no one before the next request could start.
        # Each chunk is read as next() reads it: a `yield from` the reader met another thread's
        # next() with "ValueError: generator already executing" (and closed that thread's answer),
        # and after a close() from another thread between two chunks it ended as if complete
        # A refusal (READ_ELSEWHERE: an iterator taken before another thread entered next()) closes
        # nothing: it closed that thread's answer after one chunk
        refused = False
        try:
            while True:
                try:
                    chunk = self.__next__()
                except StopIteration:
                    return
                except StreamConsumedError as exc:
                    refused = exc.args[:1] == (READ_ELSEWHERE,)
                    raise
                yield chunk
        finally:
            if not refused:
                self.close()

    def __next__(self) -> Chunk:
        # next() from two threads at once: the second got "ValueError: generator already executing"
        if not self._next_lock.acquire(blocking=False):
            raise StreamConsumedError(READ_ELSEWHERE)
        try:
            if self._reader is None:
                self._begin()  # StreamConsumedError when already read or closed
                # the reader kept on the stream holds it weakly: with ``self`` in its frame the two
                # were a cycle, so a stream read with next() and dropped was closed
                # only at the next cyclic GC, and meanwhile a device answer was generated to its
                # end for no one as soon as another request came
                self._reader = Stream._iterate(weakref.proxy(self))
            elif self._closed and self.completion is None:  # closed half way: not an end of the answer
                if self._client_closed or self._loop.closed:
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
                        raise self._cut_off() from None
                    return
                except (concurrent.futures.CancelledError, Exception):
                    if self._closed or self._loop.closed:  # a close() from another thread, mid-answer
                        raise self._cut_off() from None
                    fut.cancel()
                    raise
                except BaseException:
                    fut.cancel()  # Ctrl-C while waiting: stop the pipeline too
                    raise
                if isinstance(chunk, InlineRun):
                    # the device answers on this thread: its chunks come straight from the
                    # model's token loop; leaving the loop here closes it and stops decoding
                    self._inline = chunk
                    if self._closed:
                        # closed before this thread took the run: close() found no run to cancel;
                        # cancelled, it does not wait for its turn (it ends below)
                        chunk.cancel()
                    try:
                        yield from chunk.chunks()
                    finally:
                        self._inline = None
                    self._check_open()
                    step = self._resume(chunk)
                    continue
                if chunk.completion is not None:
                    self.completion = chunk.completion
                    if self._structured:
                        read_parsed(chunk.completion)
                yield chunk
                self._check_open()
                step = self._next()
        finally:
            self.close()

    def _check_open(self) -> None:
        """Between two chunks: a close() from another thread ends the reader with an error, not
        with a shorter answer passed off as finished."""
        if self._closed and self.completion is None:
            raise self._cut_off()

    def _cut_off(self) -> HybridLLMError:
        """The error of a reader whose answer was stopped half way from outside: by the client's
        close() (which stops its streams first), else by this stream's close()."""
        if self._client_closed or self._loop.closed:
            return HybridLLMError(CLOSED_MID_ANSWER)
        return StreamConsumedError(STREAM_CLOSED_MID_ANSWER)

    def _stop_for_client(self) -> None:
        """The client's close(): this answer stops as close() stops it, its whole pipeline closed
        from its outermost generator, and the reader gets ``HybridLLMError``."""
        self._client_closed = True
        self.close()

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
            run.cancel()  # a reader still waiting for its turn wakes and ends (InlineRun.cancel)
        reader = self._reader  # (kept: next() after the end raises StopIteration again)
        if reader is not None and not getattr(reader, "gi_running", True):
            # suspended between two next() calls: its own cleanup runs now (a device answer frees
            # its turn), not whenever it is collected
            try:
                reader.close()  # type: ignore[attr-defined]
            except ValueError:  # another thread resumed it meanwhile: it ends at the closed check
                pass
            except ReferenceError:
                # closed by __del__ when the garbage collector took the stream (a cycle, or at
                # exit): the reader's cleanup found the stream gone ("Exception ignored in
                # Stream.__del__", printed) and the rest of this close was skipped
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

    def __del__(self) -> None:
        # dropped unclosed, half read with next(): stop its answer now (the device frees its turn)
        if getattr(self, "_reader", None) is not None and not self._closed:
            self.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
