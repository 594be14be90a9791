"""The exact index against brute force, through adds, replaces and removals."""

from __future__ import annotations

import numpy as np

from hybridllm.cache.index import BucketIndex, FlatIndex


def _unit(rng: np.random.Generator, n: int, dim: int = 16) -> np.ndarray:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_flat_index_matches_brute_force_after_removals() -> None:
    rng = np.random.default_rng(0)
    vecs = _unit(rng, 300)
    index = FlatIndex(16, capacity=4)  # grows several times
    for i, v in enumerate(vecs):
        index.add(f"id{i}", v)
    removed = set(rng.choice(300, size=120, replace=False).tolist())
    for i in removed:
        assert index.remove(f"id{i}")
    assert not index.remove("id-missing") and len(index) == 180
    index.add("id0", vecs[1])  # (re)inserts id0 with another vector
    index.add("id0", vecs[1])  # replacing keeps one row
    keep = [i for i in range(300) if i not in removed or i == 0]
    assert len(index) == len(keep)
    for q in _unit(rng, 20):
        expected = {}
        for i in keep:
            v = vecs[1] if (i == 0) else vecs[i]
            expected[f"id{i}"] = float(v @ q)
        best = sorted(expected, key=expected.get, reverse=True)[:5]
        got = index.search(q, 5)
        assert [eid for eid, _ in got] == best
        np.testing.assert_allclose([s for _, s in got], [expected[b] for b in best], rtol=1e-5)
    assert FlatIndex(16).search(vecs[0], 5) == []


def test_bucket_index_keeps_buckets_apart() -> None:
    rng = np.random.default_rng(1)
    vecs = _unit(rng, 3)
    index = BucketIndex(16)
    index.add("a", "x", vecs[0])
    index.add("b", "y", vecs[0])
    assert [e for e, _ in index.search("a", vecs[0], 5)] == ["x"]
    assert index.bucket_size("b") == 1 and index.bucket_size("zzz") == 0
    index.add("b", "x", vecs[1])  # an id that moves bucket leaves the old one
    assert index.search("a", vecs[0], 5) == [] and index.bucket_size("b") == 2
    assert index.remove("y") and not index.remove("y")
    np.testing.assert_allclose(index.vector("x"), vecs[1])


def test_two_stage_search_past_exact_limit_finds_near_duplicates() -> None:
    rng = np.random.default_rng(2)
    dim, n = 64, 4000
    # embeddings live near a low-dimensional subspace, as sentence embeddings do
    basis = rng.standard_normal((12, dim)).astype(np.float32)
    vecs = rng.standard_normal((n, 12)).astype(np.float32) @ basis
    vecs += 0.2 * rng.standard_normal((n, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    index = FlatIndex(dim, exact_limit=1000, reduced_dim=16, num_candidates=64)
    for i, v in enumerate(vecs):
        index.add(str(i), v)
    assert not index.is_exact
    for i in rng.choice(n, size=30, replace=False).tolist():  # removals keep both stages aligned
        index.remove(str(i))
        vecs[i] = 0.0
    targets = [i for i in rng.choice(n, size=200, replace=False).tolist() if vecs[i].any()]
    found = 0
    for i in targets:
        q = vecs[i] + 0.05 * rng.standard_normal(dim).astype(np.float32)
        q /= np.linalg.norm(q)
        exact = vecs @ q
        (best_id, best_sim), *_ = index.search(q, 3)
        assert abs(best_sim - exact[int(best_id)]) < 1e-4  # returned cosines are exact
        found += best_id == str(int(np.argmax(exact)))
    assert found / len(targets) >= 0.98
