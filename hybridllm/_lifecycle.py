"""A client's life: live objects refuse copies, a client dropped unclosed or open at exit is closed."""

from __future__ import annotations

import atexit
import threading
import warnings
import weakref
from typing import TYPE_CHECKING, Any

from ._loop_thread import _LoopThread
from ._pipeline import Core  # (imports backends.worker, whose atexit handler must come first)

if TYPE_CHECKING:
    from ._client import HybridLLM

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
