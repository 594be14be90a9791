"""Closing the llama.cpp backend safely: a gate that keeps ``close`` out while a call is inside the
native model, and a hook that closes every backend still open at interpreter exit.

Split from ``llama_cpp`` (its size); ``llama_cpp._Gate`` is this ``_Gate``.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from .._exceptions import EdgeError

if TYPE_CHECKING:
    from .llama_cpp import LlamaCppBackend

_CLOSED = "The llama.cpp backend is closed; create a new LlamaCppBackend to generate again."
_CLOSED_MID_ANSWER = (
    "The llama.cpp backend was closed while it was generating; the answer is incomplete. Create a "
    "new LlamaCppBackend to generate again."
)


class _Gate:
    """Lets any number of calls into the native model at once, and ``close`` in only when none
    is inside: freeing the model under a running decode crashed the process (SIGSEGV)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._inside = 0
        self.closed = False

    @contextmanager
    def enter(self, closed_message: str = _CLOSED) -> Iterator[None]:
        with self._cond:
            if self.closed:
                raise EdgeError(closed_message)
            self._inside += 1
        try:
            yield
        finally:
            with self._cond:
                self._inside -= 1
                self._cond.notify_all()

    def close(self, timeout_s: float | None = None) -> bool:
        """Shut the gate and wait for the calls inside (one token step at most); False if it was
        shut already, or if a call is still inside after ``timeout_s``."""
        with self._cond:
            first = not self.closed
            self.closed = True
            empty = self._cond.wait_for(lambda: self._inside == 0, timeout_s)
        return first and empty


EXIT_WAIT_S = 10.0  # at exit, how long a running generation may take to stop (its current step)
_OPEN: weakref.WeakSet[LlamaCppBackend] = weakref.WeakSet()  # backends with a model loaded


@atexit.register
def _close_at_exit() -> None:
    """Close every backend still open when the interpreter exits. A backend used directly (not
    through HybridLLM's worker, which has its own hook) went on decoding on a daemon thread while
    the process tore llama.cpp down under it: the same crash at exit the worker's hook prevents."""
    for backend in list(_OPEN):
        backend._close(EXIT_WAIT_S)
