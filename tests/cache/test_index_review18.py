"""The index refuses a bad vector before changing anything, and search returns k ids past
exact_limit (review 18)."""

from __future__ import annotations

import numpy as np
import pytest

from hybridllm.cache.index import BucketIndex, FlatIndex


def _unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.mark.parametrize(
    "bad",
    [np.ones(3), np.ones(5), np.ones((2, 4)), 1.0, np.full(4, np.nan), np.array([1e40, 0, 0, 0])],
    ids=["short", "long", "matrix", "scalar", "nan", "inf-in-float32"],
)
def test_bad_vector_refused_without_a_phantom_entry(bad):
    index = FlatIndex(4, capacity=1)
    index.add("kept", np.array([1.0, 0, 0, 0]))
    with pytest.raises(ValueError, match="index holds"):
        index.add("new", bad)
    assert "new" not in index and len(index) == 1
    with pytest.raises(ValueError, match="index holds"):
        index.add("kept", bad)  # a replacement keeps the old vector
    np.testing.assert_array_equal(index.vector("kept"), [1.0, 0, 0, 0])
    assert [i for i, _ in index.search(np.array([1.0, 0, 0, 0]), 10)] == ["kept"]


def test_bucket_add_of_a_bad_vector_loses_nothing():
    index = BucketIndex(4)
    index.add("a", "e1", np.array([1.0, 0, 0, 0]))
    with pytest.raises(ValueError):
        index.add("b", "e1", np.ones(3))  # a move to another bucket with a bad vector
    assert index.bucket_size("a") == 1 and index.bucket_size("b") == 0
    np.testing.assert_array_equal(index.vector("e1"), [1.0, 0, 0, 0])
    with pytest.raises(ValueError):
        index.add("c", "e2", np.full(4, np.nan))
    assert len(index) == 1 and "c" not in index._buckets  # no empty bucket kept


def test_nan_vector_cannot_poison_the_projection():
    rng = np.random.default_rng(0)
    index = FlatIndex(8, exact_limit=20, reduced_dim=4, num_candidates=5)
    vecs = _unit(rng, 30, 8)
    for i, v in enumerate(vecs[:10]):
        index.add(str(i), v)
    with pytest.raises(ValueError):
        index.add("nan", np.full(8, np.nan))
    for i, v in enumerate(vecs[10:], start=10):
        index.add(str(i), v)
    assert not index.is_exact
    ids, sims = zip(*index.search(vecs[3], 3), strict=True)
    assert ids[0] == "3" and np.isfinite(sims).all()


def test_query_of_another_length_is_a_clear_error():
    index = FlatIndex(4, capacity=1)
    index.add("a", np.array([1.0, 0, 0, 0]))
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        index.search(np.ones(3), 1)


def test_k_above_num_candidates_past_exact_limit():
    rng = np.random.default_rng(1)
    index = FlatIndex(8, exact_limit=20, reduced_dim=4, num_candidates=5)
    vecs = _unit(rng, 40, 8)
    for i, v in enumerate(vecs):
        index.add(str(i), v)
    assert not index.is_exact
    found = index.search(vecs[0], 12)
    assert len(found) == 12  # before: 5, num_candidates
    sims = [s for _, s in found]
    assert sims == sorted(sims, reverse=True)
    # all 40 asked for: every id, with its exact cosine, best first
    everything = index.search(vecs[0], 100)
    assert len(everything) == 40
    exact = vecs @ vecs[0]
    np.testing.assert_allclose([s for _, s in everything], np.sort(exact)[::-1], rtol=1e-5, atol=1e-6)


def test_empty_bucket_and_top_k_above_its_size():
    index = BucketIndex(4)
    assert index.search("none", np.array([1.0, 0, 0, 0]), 10) == []
    index.add("b", "x", np.array([1.0, 0, 0, 0]))
    index.add("b", "y", np.array([0, 1.0, 0, 0]))
    assert [i for i, _ in index.search("b", np.array([1.0, 0, 0, 0]), 10)] == ["x", "y"]
