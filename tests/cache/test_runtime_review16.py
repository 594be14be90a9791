"""Review 16 of the cache at run time: a damaged verifier file loaded directly, empty answers
put by a caller, and the memory of a bucket most of whose entries were removed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import hybridllm
from hybridllm._exceptions import CacheError
from hybridllm.cache import SemanticCache
from hybridllm.cache.index import BucketIndex, FlatIndex
from hybridllm.cache.verifier import HitVerifier

from .fakes import FakeEmbedder

SHIPPED = Path(hybridllm.__file__).parent / "_data" / "cache_verifier.npz"
KW = {"model": "m", "params_key": {"temperature": 0}}


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.fixture
def cache(tmp_path: Path):
    c = SemanticCache(tmp_path / "c.sqlite3", verifier=None, min_similarity=0.9, embedder=FakeEmbedder())
    yield c
    c.close()


# ------------------------------------------------------------------ a damaged verifier file


@pytest.mark.parametrize("damage", ["truncated", "member", "empty"])
def test_a_damaged_verifier_loaded_directly_is_a_cache_error_naming_it(tmp_path: Path, damage: str) -> None:
    data = bytearray(SHIPPED.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "member":  # zeros inside a member: its CRC fails when it is read
        at = len(data) // 3
        data[at : at + 64] = bytes(64)
    else:
        data = bytearray()
    bad = tmp_path / "verifier.npz"
    bad.write_bytes(bytes(data))
    with pytest.raises(CacheError, match=r"verifier\.npz.*damaged"):
        HitVerifier.load(bad)


# ------------------------------------------------------------------ empty answers


@pytest.mark.parametrize("answer", ["", "   ", "\n\t "])
def test_an_empty_answer_is_not_stored_nor_served(cache: SemanticCache, answer: str) -> None:
    assert cache.put(user("What is the capital of France?"), answer, **KW) is None
    assert cache.get(user("What is the capital of France?"), **KW) is None
    assert cache.stats()["entries"] == 0


def test_an_empty_answer_keeps_the_answer_stored_before(cache: SemanticCache) -> None:
    entry_id = cache.put(user("What is the capital of France?"), "Paris.", **KW)
    assert cache.put(user("What is the capital of France?"), "", **KW) is None
    hit = cache.get(user("What is the capital of France?"), **KW)
    assert hit is not None and hit.text == "Paris." and hit.entry_id == entry_id


def test_an_empty_answer_with_bad_messages_still_raises(cache: SemanticCache) -> None:
    with pytest.raises(ValueError):  # InvalidRequestError: the messages are checked first
        cache.put([], "", **KW)


# ------------------------------------------------------------------ bucket memory


def _unit(rng: np.random.Generator, dim: int) -> np.ndarray:
    v = rng.standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


def test_a_bucket_gives_memory_back_after_most_entries_are_removed() -> None:
    rng = np.random.default_rng(0)
    index = BucketIndex(384)
    vecs = {f"e{i}": _unit(rng, 384) for i in range(4096)}
    for eid, v in vecs.items():
        index.add("b", eid, v)
    flat = index._buckets["b"]
    before = flat._vecs.nbytes
    assert before >= 4096 * 384 * 4
    for i in range(4096 - 10):  # eviction of all but 10
        assert index.remove(f"e{i}")
    after = flat._vecs.nbytes
    assert after <= 64 * 384 * 4, (before, after)  # was 4096 rows reserved for 10
    # the 10 left are still found, each its own best match
    for i in range(4096 - 10, 4096):
        assert index.search("b", vecs[f"e{i}"], 1)[0][0] == f"e{i}"
        assert np.array_equal(index.vector(f"e{i}"), vecs[f"e{i}"])


def test_a_shrunk_bucket_past_the_exact_limit_keeps_its_projection_rows() -> None:
    rng = np.random.default_rng(1)
    index = FlatIndex(32, capacity=1, exact_limit=100, reduced_dim=8, num_candidates=16)
    vecs = {f"e{i}": _unit(rng, 32) for i in range(512)}
    for eid, v in vecs.items():
        index.add(eid, v)
    assert not index.is_exact
    for i in range(480):
        index.remove(f"e{i}")
    assert len(index._vecs) < 512 and len(index._low) == len(index._vecs)
    for i in range(480, 512):
        found = index.search(vecs[f"e{i}"], 1)
        assert found[0][0] == f"e{i}" and found[0][1] == pytest.approx(1.0, abs=1e-5)
    for i in range(512, 600):  # grows again
        index.add(f"e{i}", _unit(rng, 32))
    assert len(index) == 120 and len(index._low) == len(index._vecs) >= 120


def test_a_bucket_at_one_size_is_not_copied_on_every_add_and_remove() -> None:
    rng = np.random.default_rng(2)
    index = FlatIndex(16, capacity=1)
    for i in range(64):
        index.add(f"e{i}", _unit(rng, 16))
    index.add("first", _unit(rng, 16))  # the 65th row: doubled to 128, once
    index.remove("first")
    arrays = index._vecs
    for i in range(200):  # one in, one out, around 64 rows: no resize
        index.add(f"x{i}", _unit(rng, 16))
        index.remove(f"x{i}")
    assert index._vecs is arrays


# ------------------------------------------------------------------ malformed trees


def _rewrite(tmp_path: Path, **changes) -> Path:
    with np.load(SHIPPED, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    for key, change in changes.items():
        arrays[key] = change(arrays[key].copy())
    out = tmp_path / "verifier.npz"
    np.savez(out, **arrays)
    return out


def _loop(left: np.ndarray) -> np.ndarray:
    left[0] = 0  # the first root's left child is itself: Trees.raw walked forever
    return left


def _go_left(threshold: np.ndarray) -> np.ndarray:
    threshold[0] = 1e300  # every input goes left at the first root
    return threshold


def _out_of_range(right: np.ndarray) -> np.ndarray:
    right[0] = 10**6
    return right


def _bad_feature(feature: np.ndarray) -> np.ndarray:
    feature[0] = 999
    return feature


@pytest.mark.parametrize(
    "changes",
    [{"tree_left": _loop, "tree_threshold": _go_left}, {"tree_right": _out_of_range},
     {"tree_feature": _bad_feature}, {"tree_roots": lambda r: r + 10**6}],
    ids=["loop", "child-out-of-range", "feature-out-of-range", "root-out-of-range"],
)
def test_a_verifier_with_malformed_trees_is_refused_at_load(tmp_path: Path, changes: dict) -> None:
    with pytest.raises(CacheError, match=r"verifier\.npz.*malformed"):
        HitVerifier.load(_rewrite(tmp_path, **changes))


def test_the_shipped_verifier_still_loads_and_scores(tmp_path: Path) -> None:
    verifier = HitVerifier.load(_rewrite(tmp_path))
    emb = FakeEmbedder()
    q, c = "how do I learn python", "how can I learn python"
    prob = verifier.predict([q], [c], emb.embed_one(q)[None], emb.embed_one(c)[None])
    assert prob.shape == (1,) and 0.0 <= prob[0] <= 1.0
