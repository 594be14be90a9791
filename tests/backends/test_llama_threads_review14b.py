"""With n_threads left out, llama.cpp gets one thread per CPU this process may run on (a
container's cpuset, ``taskset``), not one per core of the host: os.cpu_count() counted every core,
so a container given 2 of 64 cores ran 64 spinning threads on 2."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.real


def test_default_threads_follow_the_cpus_this_process_may_use(smollm2_path, monkeypatch) -> None:
    from hybridllm.backends.llama_cpp import LlamaCppBackend

    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # the host
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)  # ours: one CPU
    backend = LlamaCppBackend(str(smollm2_path), n_ctx=256)
    try:
        assert backend.n_threads == 1
        assert backend._llm.context_params.n_threads == 1
        assert backend._llm.context_params.n_threads_batch == 1
    finally:
        backend.close()


def test_an_explicit_n_threads_is_kept(smollm2_path, monkeypatch) -> None:
    from hybridllm.backends.llama_cpp import LlamaCppBackend

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    backend = LlamaCppBackend(str(smollm2_path), n_ctx=256, n_threads=2)
    try:
        assert backend.n_threads == 2 and backend._llm.context_params.n_threads == 2
    finally:
        backend.close()
