"""``evaluate_pairs``: texts embedded once for several verifiers, and pairs looked up on threads.

Before, every call embedded each pair's two texts one lookup at a time (45 s of CPU on 3,000 QQP
pairs, twice when a second verifier was scored on the same pairs) and verified the pairs one after
the other on one core."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import hybridllm.cache._candidates as candidates_module
import hybridllm.cache.embedder as embedder_module
import hybridllm.cache.evaluate as evaluate_module
from hybridllm.cache.evaluate import PairSet

from .fakes import FakeEmbedder


class _Embedder(FakeEmbedder):
    """The fake embedder, reading whole every text but those holding ``unread``."""

    def __init__(self, unread: str = "\0") -> None:
        super().__init__()
        self.unread = unread

    def fits(self, *texts: str) -> bool:
        return not any(self.unread in t for t in texts)


def _use(monkeypatch: pytest.MonkeyPatch, embedder: _Embedder) -> _Embedder:
    """``embedder`` as the process-wide one, for ``embed_pairs`` and for a cache's first put."""
    monkeypatch.setattr(embedder_module, "get_embedder", lambda: embedder)
    monkeypatch.setattr(candidates_module, "get_embedder", lambda: embedder)
    return embedder


def _pairs(n: int) -> PairSet:
    words = ["python", "rust", "cooking", "rice", "france", "paris", "guitar", "chess", "sleep", "tea"]
    a, b, labels = [], [], []
    for i in range(n):
        x, y = words[i % 10], words[(i * 7 + 3) % 10]
        a.append(f"how do I learn {x} and {y}")
        # fake cosines 0.96 (a hit at cosine's 0.95) and 0.71 (a miss)
        b.append(f"how do I learn {x} and {y} {x}" if i % 3 else f"how do I learn {y} or {x}")
        labels.append(i % 2)
    return PairSet(a, b, labels)


def _hits(monkeypatch: pytest.MonkeyPatch, pairs: PairSet, **kwargs: object) -> np.ndarray:
    """The per-pair hits ``evaluate_pairs`` counts."""
    seen: list[np.ndarray] = []
    real = evaluate_module.pair_metrics

    def keep(hits, labels):
        seen.append(np.asarray(hits, dtype=bool))
        return real(hits, labels)

    monkeypatch.setattr(evaluate_module, "pair_metrics", keep)
    evaluate_module.evaluate_pairs(pairs, verifier="cosine", **kwargs)
    return seen[-1]


def test_given_vectors_are_not_embedded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _use(monkeypatch, _Embedder())
    pairs = _pairs(60)
    vectors = evaluate_module.embed_pairs(pairs)
    assert set(vectors) == set(pairs.text_a) | set(pairs.text_b)
    assert fake.calls == len(vectors)  # each distinct text once
    with_vectors = _hits(monkeypatch, pairs, vectors=vectors)
    assert fake.calls == len(vectors)  # the lookups embedded nothing
    assert np.array_equal(with_vectors, _hits(monkeypatch, pairs))  # the outcomes of embedding
    assert with_vectors.any() and not with_vectors.all()


def test_the_length_check_still_runs_with_given_vectors(monkeypatch: pytest.MonkeyPatch) -> None:
    """A text the embedder does not read whole is served on an exact repeat only, vectors or not."""
    pairs = PairSet(["how do I learn python tail"], ["how do I learn python tail please"], [1])
    vec = np.zeros(384, dtype=np.float32)
    vec[0] = 1.0
    vectors = dict.fromkeys(pairs.text_a + pairs.text_b, vec)  # cosine 1.0: a hit if read whole
    _use(monkeypatch, _Embedder())
    assert _hits(monkeypatch, pairs, vectors=vectors).tolist() == [True]
    _use(monkeypatch, _Embedder(unread="tail"))
    assert _hits(monkeypatch, pairs, vectors=vectors).tolist() == [False]


def test_threads_give_each_pair_its_lone_outcome_and_progress_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _use(monkeypatch, _Embedder())
    pairs = _pairs(200)
    alone = _hits(monkeypatch, pairs, workers=1)
    calls: list[tuple[int, int, str]] = []

    def progress(done: int, total: int) -> None:
        calls.append((done, total, threading.current_thread().name))

    assert np.array_equal(_hits(monkeypatch, pairs, workers=4, progress=progress), alone)
    assert [(d, t) for d, t, _ in calls] == [(i, 200) for i in range(1, 201)]
    assert {name for _, _, name in calls} == {threading.current_thread().name}
    with pytest.raises(ValueError, match="workers"):
        evaluate_module.evaluate_pairs(pairs, verifier="cosine", workers=0)


def test_default_threads_follow_the_cpus_and_the_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evaluate_module, "usable_cpus", lambda: 2)
    assert evaluate_module._workers(None, 3000) == 2
    assert evaluate_module._workers(None, 5) == 1  # a handful of pairs starts no pool
    monkeypatch.setattr(evaluate_module, "usable_cpus", lambda: 64)
    assert evaluate_module._workers(None, 3000) == 8
