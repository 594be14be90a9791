"""How many CPUs this process may use: the device backends, the embedder and the cloud engine
size their thread pools by it."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs this process may run on (a container's cpuset, ``taskset``), not the machine's:
    ``os.cpu_count()`` counts every core of the host, so a container allowed 2 of 64 ran 64
    threads on 2 cores, threads that spin while they wait for each other (SmolLM2 on llama.cpp
    pinned to one CPU: 39 tok/s with 1 thread, 19 with 8, 13 with 16)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS, Windows: no affinity call
        return os.cpu_count() or 1
