"""A lookup never serves a candidate on a comparison with NaN, and a caller's embedding that is
not one real vector of the cache's length is refused, nothing stored."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

from hybridllm._exceptions import ConfigError, InvalidRequestError
from hybridllm.cache import SemanticCache

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {"temperature": 0}}


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


class FixedVerifier:
    """A verifier that gives every pair the same probability."""

    kind = "fixed"

    def __init__(self, prob: float, *, threshold: float = 0.5, min_similarity: float = 0.1) -> None:
        self.prob, self.threshold, self.min_similarity = prob, threshold, min_similarity

    def predict(self, queries, cached, q_vecs, c_vecs, *, at_least=None) -> np.ndarray:
        return np.full(len(queries), self.prob)


def test_a_nan_threshold_serves_nothing(tmp_path: Path) -> None:
    """Before: ``probs[best] < nan`` is False, so a candidate scored 0.01 ("How do I learn Rust?"
    for "How do I learn Python?") was served."""
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=FixedVerifier(0.01, threshold=float("nan")),
                          embedder=FakeEmbedder())
    cache.put(user("How do I learn Python?"), "Practice daily.", **KW)
    assert cache.get(user("How do I learn Rust?"), **KW) is None
    assert cache.stats()["misses"] == 1


def test_a_nan_probability_is_no_score_and_does_not_hide_a_real_one(tmp_path: Path) -> None:
    """Before: np.argmax picked the NaN over a real 0.99, and the lookup was a miss."""

    class NanFirst(FixedVerifier):
        def predict(self, queries, cached, q_vecs, c_vecs, *, at_least=None) -> np.ndarray:
            probs = np.full(len(queries), 0.99)
            probs[0] = np.nan
            return probs

    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=NanFirst(0.0), embedder=FakeEmbedder())
    cache.put(user("how do I learn python"), "Practice daily.", **KW)
    cache.put(user("how do I learn python fast"), "Practice more.", **KW)
    hit = cache.get(user("how do I learn python quickly"), **KW)
    assert hit is not None and hit.verifier_prob == pytest.approx(0.99)


@pytest.mark.parametrize("bad", [float("nan"), 1.5, -2.0])
def test_a_verifier_s_own_min_similarity_is_checked(tmp_path: Path, bad: float) -> None:
    """Before: only a min_similarity given to the cache was checked; a verifier's NaN (a damaged
    file) was taken, and then every candidate passed the cosine stage."""
    with pytest.raises(ConfigError, match="verifier's min_similarity.*FixedVerifier"):
        SemanticCache(tmp_path / "c.sqlite3", verifier=FixedVerifier(0.9, min_similarity=bad),
                      embedder=FakeEmbedder())


def test_a_nan_row_in_the_index_is_never_a_candidate(tmp_path: Path) -> None:
    """The store refuses a NaN vector and so does put; were one to reach the index, ``sim <
    min_similarity`` was False for it and the nearest-first cosine-only lookup served it. The
    index itself refuses it too now (review 18), keeping the entry's vector as it was."""
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, embedder=FakeEmbedder())
    eid = cache.put(user("How do I learn Python?"), "Practice daily.", **KW)
    bucket = cache._entries[eid].bucket
    with pytest.raises(ValueError, match="finite"):
        cache._index.add(bucket, eid, np.full(384, np.nan, dtype=np.float32))
    assert cache.get(user("What is the capital of France?"), **KW) is None
    assert cache.get(user("How do I learn Python?"), **KW) is not None


def _vec(text: str) -> np.ndarray:
    return FakeEmbedder().embed_one(text)


@pytest.mark.parametrize(
    "make",
    [
        lambda v: v.astype(np.complex64) * (1 + 1j),  # imaginary part dropped with a warning before
        lambda v: np.array([str(x) for x in v]),  # texts parsed as numbers before
        lambda v: v.reshape(2, -1),  # a [2, 192] matrix flattened into one vector before
    ],
    ids=["complex", "strings", "matrix"],
)
def test_an_embedding_that_is_not_one_real_vector_is_refused(tmp_path: Path, make) -> None:
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, embedder=FakeEmbedder())
    cache.put(user("How do I learn Python fast?"), "Practice.", **KW)  # a bucket to search
    bad = make(_vec("How do I learn Python?"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the complex cast's warning was the only word before
        with pytest.raises(InvalidRequestError, match="embedding"):
            cache.put(user("How do I learn Python?"), "x", embedding=bad, **KW)
        with pytest.raises(InvalidRequestError, match="embedding"):
            cache.get(user("How do I learn Python?"), embedding=bad, **KW)
    assert cache.stats()["entries"] == 1


def test_a_row_vector_is_still_one_embedding(tmp_path: Path) -> None:
    """``model.encode([question])`` gives a [1, dim] row: taken as the vector, as before."""
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, embedder=FakeEmbedder())
    vec = _vec("How do I learn Python?")
    assert cache.put(user("How do I learn Python?"), "Practice.", embedding=vec[None, :], **KW)
    hit = cache.get(user("learn python how do I"), embedding=vec[:, None], **KW)
    assert hit is not None and hit.text == "Practice."


@pytest.mark.parametrize("scale", [1e20, 1e-25])
def test_a_finite_vector_far_from_unit_length_is_normalized_not_refused(tmp_path: Path, scale: float) -> None:
    """Before: its float32 sum of squares overflowed to inf (or underflowed to 0) and the vector
    was refused as "not finite" (or zero), with a numpy overflow warning."""
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, embedder=FakeEmbedder())
    vec = (_vec("How do I learn Python?") * np.float32(scale)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.put(user("How do I learn Python?"), "Practice.", embedding=vec, **KW)
    hit = cache.get(user("learn python how do I"), **KW)
    assert hit is not None and hit.similarity == pytest.approx(1.0, abs=1e-5)


def test_threads_putting_and_getting_one_question_agree(tmp_path: Path) -> None:
    """One entry, whatever the interleaving; every get is a miss or the answer written."""
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, embedder=FakeEmbedder())
    seen: list[object] = []
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(20):
                if i % 2:
                    cache.put(user("How do I learn Python?"), "Practice daily.", **KW)
                else:
                    hit = cache.get(user("How do I learn Python?"), **KW)
                    seen.append(hit and hit.text)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors and not any(t.is_alive() for t in threads)
    assert set(seen) <= {None, "Practice daily."}
    assert cache.stats()["entries"] == 1
    cache.close()
