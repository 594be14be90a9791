"""The sync client's private event loop thread, and how closing it stops what still runs there."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from typing import Any

from ._exceptions import HybridLLMError
from ._forks import FORKED, forked_from
from .backends.base import drain_loop

EXECUTOR_WAIT_S = 30.0  # at close, the longest wait for a running cache lookup or router call


class _LoopThread:
    """A private event loop on a daemon thread, started on first use. ``close`` cancels what is
    still running on it, so a thread waiting for a step gets an error instead of waiting for ever."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()  # where the thread runs: a fork of this process has no such thread

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
        if self._loop is not None and forked_from(self._pid):
            # its thread is not in this fork: a step handed to it was waited for for ever
            raise HybridLLMError(FORKED.format(pid=self._pid, here=os.getpid()))
        if self._loop is None:
            self._pid = os.getpid()
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
        if loop is not None and forked_from(self._pid):
            # a fork's copy: the thread is not here (waiting for it held a child's exit 50 s), and
            # the loop's self-pipe is the parent's (waking it here wakes the parent's loop)
            loop = thread = None
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
