"""A real uvicorn server run on a thread for the length of a ``with`` block (tests only)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def serving(server: Any, start_s: float = 10.0) -> Iterator[None]:
    """Run ``server`` (a ``uvicorn.Server`` or our ``GracefulServer``) on a daemon thread, wait until
    it has started, and stop it (``should_exit``) when the block ends, however it ends."""
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + start_s
        while not server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=15)
