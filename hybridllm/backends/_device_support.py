"""What the device backends (llama.cpp, ONNX Runtime) share beside the interface: the check of
their settings, the stop-string matcher (the cloud client and the pipeline use it too) and the
return of a closed model's memory to the system.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

from .._cpus import usable_cpus
from .._exceptions import ConfigError

_MAX_THREADS = 512  # GGML_MAX_N_THREADS: llama.cpp's own limit (past it a decode crawled or hung)


def check_device_settings(n_ctx: Any, n_threads: Any, n_batch: Any = 1) -> None:
    """Refuse device-model settings llama.cpp would crash on, hang on or blame on the model file;
    both device backends check them by these rules, before anything loads (the ONNX backend has
    no n_batch)."""

    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    if not whole(n_ctx) or n_ctx < 0:
        raise ConfigError(
            f"n_ctx must be a whole number of tokens (0: the model's own context length), got {n_ctx!r}."
        )
    if n_threads is not None and (not whole(n_threads) or not 1 <= n_threads <= _MAX_THREADS):
        raise ConfigError(
            f"n_threads must be a whole number from 1 to {_MAX_THREADS} (leave it out for all "
            f"{usable_cpus()} cores this process may use), got {n_threads!r}."
        )
    if not whole(n_batch) or n_batch < 1:
        raise ConfigError(f"n_batch must be a whole number of tokens, at least 1, got {n_batch!r}.")


class StopMatcher:
    """Holds back text that may be the start of a stop string; cuts at the first full match. Shared by
    the device backends, the cloud client (a model that refuses ``stop``) and the pipeline (stops
    matched in restored text under privacy="redact")."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit, whether a stop string was hit)."""
        buf = self.pending + text
        if not self.stops:
            self.pending = ""
            return buf, False
        # the match that ends first, as text fed one character at a time would meet it (the
        # earlier start where two end together): cutting at the earliest start instead let a long
        # stop found whole in one piece win over a short one inside it that ends sooner, so the
        # answer depended on how the text was split into pieces
        hits = [(i + len(s), i) for s in self.stops if (i := buf.find(s)) >= 0]
        if hits:
            self.pending = ""
            return buf[: min(hits)[1]], True
        hold = 0
        for stop in self.stops:  # longest suffix of buf that is a proper prefix of a stop
            for k in range(min(len(stop) - 1, len(buf)), hold, -1):
                if buf.endswith(stop[:k]):
                    hold = k
                    break
        self.pending = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


def return_freed_memory() -> bool:
    """Give the heap's free pages back to the system (glibc's ``malloc_trim``), for a device
    backend's close(); False where the C library has none (macOS, musl).

    A model's runtime state (ONNX Runtime's repacked weights and KV cache, llama.cpp's vocabulary,
    graph and sampler) lives in many heap allocations under glibc's mmap threshold; freeing them
    leaves the pages in the process. Closing an ONNX SmolLM2 backend kept about 200 MB of the 360 MB
    it had added, and each load-and-close cycle kept more (232, 262, 298 MB after three); with the
    trim the process went back to within 55 MB of where it began (llama.cpp: 22-35 MB, now 5-9).
    """
    if sys.platform != "linux":
        return False
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True
