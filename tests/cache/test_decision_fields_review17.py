"""One rule for the verifiers' decision fields: a feature-verifier file's ``threshold``,
``min_similarity`` and linear stage are checked at load as a reranker file's are, a hand-built
RerankerInfo's ``min_similarity`` too, and ``get(embedding=...)`` checks a caller's vector as
``put`` does, whether or not the bucket holds anything to compare it with."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import hybridllm
from hybridllm._exceptions import CacheError, InvalidRequestError
from hybridllm.cache import SemanticCache
from hybridllm.cache import reranker as reranker_mod
from hybridllm.cache.reranker import RerankVerifier
from hybridllm.cache.reranker_file import RerankerInfo
from hybridllm.cache.verifier import HitVerifier

from .fakes import FakeEmbedder

SHIPPED = Path(hybridllm.__file__).parent / "_data" / "cache_verifier.npz"
KW = {"model": "m", "params_key": {"temperature": 0}}


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _rewrite(tmp_path: Path, **changes) -> Path:
    """The shipped feature verifier with some arrays replaced."""
    with np.load(SHIPPED, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    for key, change in changes.items():
        arrays[key] = change(arrays[key].copy()) if callable(change) else np.asarray(change)
    out = tmp_path / "verifier.npz"
    np.savez(out, **arrays)
    return out


def _first(value: float):
    def change(a: np.ndarray) -> np.ndarray:
        a[0] = value
        return a

    return change


# ------------------------------------------------------------------ the feature verifier's file


@pytest.mark.parametrize(
    "changes",
    [
        {"threshold": float("nan")},
        {"threshold": 0.0},
        {"threshold": -0.5},
        {"threshold": 1.5},
        {"threshold": float("inf")},
        {"min_similarity": float("nan")},
        {"min_similarity": 1.5},
        {"min_similarity": -2.0},
        {"lin_scale": _first(0.0)},  # an infinite logit for every pair
        {"lin_scale": _first(-1.0)},
        {"lin_scale": _first(float("nan"))},
        {"lin_scale": _first(float("inf"))},
        {"lin_w": _first(float("nan"))},
        {"lin_mean": _first(float("inf"))},
        {"lin_b": float("nan")},
        {"lin_w": lambda a: a[:-1]},  # a raw einsum ValueError on every lookup
    ],
    ids=lambda c: "-".join(f"{k}" + (f"={v}" if not callable(v) else "") for k, v in c.items()),
)
def test_a_feature_verifier_with_bad_decision_fields_is_refused_at_load(
    tmp_path: Path, changes: dict
) -> None:
    """Before: loaded as they were; a NaN threshold never hit, a NaN min_similarity let every
    candidate through the cosine stage, a zero lin_scale gave every pair an infinite logit."""
    path = _rewrite(tmp_path, **changes)
    with pytest.raises(CacheError, match="damaged") as err:
        HitVerifier.load(path)
    assert str(path) in str(err.value)
    assert next(iter(changes)) in str(err.value)


def test_the_shipped_feature_verifier_still_loads(tmp_path: Path) -> None:
    verifier = HitVerifier.load(_rewrite(tmp_path))
    assert 0.0 < verifier.threshold <= 1.0 and -1.0 <= verifier.min_similarity <= 1.0
    assert HitVerifier.load(_rewrite(tmp_path, threshold=1.0, min_similarity=-1.0)).threshold == 1.0


def test_a_cache_on_a_damaged_feature_verifier_file_says_which(tmp_path: Path) -> None:
    path = _rewrite(tmp_path, min_similarity=float("nan"))
    with pytest.raises(CacheError, match="min_similarity"):
        SemanticCache(tmp_path / "c.sqlite3", verifier=str(path), embedder=FakeEmbedder())


# ------------------------------------------------------------------ a hand-built RerankerInfo


@pytest.mark.parametrize("threshold", [None, 0.9])
@pytest.mark.parametrize("min_similarity", [float("nan"), 1.5, -2.0])
def test_a_hand_built_reranker_info_s_min_similarity_is_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threshold: float | None, min_similarity: float
) -> None:
    """Before: only its threshold was checked; RerankVerifier.accept with a NaN min_similarity
    refused every pair, silently (and with 1.5 too)."""
    info = RerankerInfo(path=tmp_path / "r.npz", threshold=0.8, min_similarity=min_similarity,
                        weights_digest="0" * 16)
    monkeypatch.setattr(reranker_mod, "read_info", lambda path=None: info)
    with pytest.raises(CacheError, match=r"r\.npz.*min_similarity"):
        RerankVerifier(path=info.path, threshold=threshold)
    monkeypatch.setattr(
        reranker_mod, "read_info", lambda path=None: dataclasses.replace(info, min_similarity=0.5)
    )
    verifier = RerankVerifier(path=info.path, threshold=threshold)
    assert verifier.min_similarity == 0.5 and verifier.threshold == (threshold or 0.8)


# ------------------------------------------------------------------ get(embedding=...) as put


BAD_VECTORS = {
    "short": np.ones(7, dtype=np.float32),
    "nan": np.full(FakeEmbedder().dim, np.nan, dtype=np.float32),
    "zero": np.zeros(FakeEmbedder().dim, dtype=np.float32),
    "text": ["0.1"] * FakeEmbedder().dim,
    "matrix": np.ones((2, FakeEmbedder().dim), dtype=np.float32),
}


@pytest.fixture
def cache(tmp_path: Path):
    c = SemanticCache(tmp_path / "c.sqlite3", verifier=None, min_similarity=0.9, embedder=FakeEmbedder())
    yield c
    c.close()


@pytest.mark.parametrize("name", BAD_VECTORS)
def test_a_bad_embedding_is_refused_by_get_on_an_empty_bucket(cache: SemanticCache, name: str) -> None:
    """Before: a plain miss (the embedder step skipped, the vector never looked at), while put
    refused the same vector for the same question."""
    bad = BAD_VECTORS[name]
    with pytest.raises(InvalidRequestError, match="embedding"):
        cache.put(user("What is the capital of Peru?"), "Lima.", embedding=bad, **KW)
    with pytest.raises(InvalidRequestError, match="embedding"):
        cache.get(user("What is the capital of Peru?"), embedding=bad, **KW)
    assert cache.stats()["misses"] == 0  # refused, not counted as a lookup


@pytest.mark.parametrize("name", BAD_VECTORS)
def test_a_bad_embedding_is_refused_by_get_on_an_exact_repeat(cache: SemanticCache, name: str) -> None:
    cache.put(user("What is the capital of Peru?"), "Lima.", **KW)
    with pytest.raises(InvalidRequestError, match="embedding"):
        cache.get(user("What is the capital of Peru?"), embedding=BAD_VECTORS[name], **KW)
    assert cache.stats()["hits"] == 0


def test_a_good_embedding_and_a_blank_question_still_work(cache: SemanticCache) -> None:
    q = user("What is the capital of Peru?")
    vec = cache.embed_query(q)
    assert cache.get(q, embedding=vec, **KW) is None  # empty bucket: a miss
    assert cache.put(q, "Lima.", embedding=vec, **KW) is not None
    hit = cache.get(q, embedding=vec, **KW)
    assert hit is not None and hit.text == "Lima."
    # a blank question is stored by no put and looked up by no get, whatever the vector
    assert cache.put(user("   "), "x", embedding=BAD_VECTORS["short"], **KW) is None
    assert cache.get(user("   "), embedding=BAD_VECTORS["short"], **KW) is None


@pytest.mark.parametrize("threshold", [float("nan"), 0.0, -0.5, 1.5, float("inf"), "high", True])
def test_a_caller_s_reranker_threshold_is_still_a_probability(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threshold: object
) -> None:
    """The rule moved into verifier.is_threshold: the caller's error and wording stay."""
    from hybridllm import ConfigError

    info = RerankerInfo(path=tmp_path / "r.npz", threshold=float("nan"), min_similarity=0.5,
                        weights_digest="0" * 16)
    monkeypatch.setattr(reranker_mod, "read_info", lambda path=None: info)
    with pytest.raises(ConfigError, match=r"reranker threshold must be a probability in \(0, 1\]"):
        RerankVerifier(path=info.path, threshold=threshold)
    with pytest.raises(CacheError, match=r"r\.npz.*threshold nan"):  # the file's own, NaN
        RerankVerifier(path=info.path)
    assert RerankVerifier(path=info.path, threshold=1).threshold == 1.0
