"""Long lists embed on several threads, each text alone: the same vectors as one thread, to the bit."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from hybridllm.cache import embedder as embedder_module
from hybridllm.cache import get_embedder

pytestmark = pytest.mark.real


def _questions(shared_data: Path, n: int) -> list[str]:
    out: list[str] = []
    with open(shared_data / "paraphrase" / "qqp_pairs.jsonl") as fh:
        for line in fh:
            row = json.loads(line)
            out += [row["text_a"], row["text_b"]]
            if len(out) >= n:
                break
    return out[:n]


def test_threads_give_the_one_thread_vectors_and_ordered_progress(shared_data: Path) -> None:
    emb = get_embedder()
    texts = _questions(shared_data, 96)
    one = emb.embed(texts, workers=1)
    seen: list[tuple[int, int]] = []
    names: set[str] = set()
    run = emb.run

    def spy(batch):  # which threads ran the batches
        names.add(threading.current_thread().name)
        return run(batch)

    emb.run = spy  # type: ignore[method-assign]
    try:
        many = emb.embed(texts, workers=3, progress=lambda d, t: seen.append((d, t)))
    finally:
        del emb.run
    np.testing.assert_array_equal(many, one)
    assert len(names) > 1 and all(n.startswith("hybridllm-embed") for n in names)
    # progress from the calling thread, counting up to the whole list
    assert [d for d, _ in seen] == list(range(1, 97)) and {t for _, t in seen} == {96}


def test_a_few_texts_stay_on_the_calling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert embedder_module._default_workers(3) == 1  # a cache lookup, a request: no pool
    assert embedder_module._default_workers(9772) == 8
    assert embedder_module._default_workers(40) == 2  # at least 16 batches a thread
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert embedder_module._default_workers(9772) == 2  # the CPUs this process may use


def test_a_failing_batch_raises_and_drops_the_rest() -> None:
    emb = get_embedder()
    calls: list[int] = []
    run = emb.run

    def failing(batch):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return run(batch)

    emb.run = failing  # type: ignore[method-assign]
    try:
        with pytest.raises(RuntimeError, match="boom"):
            emb.embed([f"question number {i}" for i in range(400)], workers=2)
    finally:
        del emb.run
    assert len(calls) < 400  # the batches not started were cancelled, not run


def test_workers_must_be_positive() -> None:
    with pytest.raises(ValueError, match="workers"):
        get_embedder().embed(["a"], workers=0)
