"""The cache compares cosines whatever length of vector an embedder or a caller hands it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hybridllm._exceptions import InvalidRequestError
from hybridllm.cache import SemanticCache

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {"temperature": 0}}


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


class LongVectors(FakeEmbedder):
    """An embedder that does not normalize (sentence-transformers' ``encode`` by default)."""

    def embed_one(self, text: str) -> np.ndarray:
        return 7.0 * super().embed_one(text)


def test_vectors_that_are_not_unit_never_serve_another_question(tmp_path: Path) -> None:
    """Before: the dot products of length-7 vectors (49 x the cosine) were taken for cosines, so
    "How do I cook rice?" (cosine 0.6) passed min_similarity 0.95 and was served the answer to
    "How do I learn Python?", with a similarity of 29."""
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, embedder=LongVectors())
    cache.put(user("How do I learn Python?"), "Practice daily.", **KW)
    assert cache.get(user("How do I cook rice?"), **KW) is None
    hit = cache.get(user("how do i learn python please"), **KW)  # cosine 0.91 under the fake
    assert hit is None or hit.similarity <= 1.0 + 1e-6
    hit = cache.get(user("learn python how do I"), **KW)  # the same words: cosine 1
    assert hit is not None and abs(hit.similarity - 1.0) < 1e-5


def test_a_caller_s_embedding_is_normalized_too(tmp_path: Path) -> None:
    fake = FakeEmbedder()
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, embedder=fake)
    vec = 3.0 * fake.embed_one("How do I learn Python?")
    cache.put(user("How do I learn Python?"), "Practice daily.", embedding=vec, **KW)
    other = 3.0 * fake.embed_one("How do I cook rice?")
    assert cache.get(user("How do I cook rice?"), embedding=other, **KW) is None


@pytest.mark.parametrize(
    "embedding",
    [np.zeros(384), np.full(384, np.nan), np.ones(10)],
    ids=["zero", "nan", "wrong-shape"],
)
def test_an_embedding_that_is_no_direction_is_refused_by_get_and_put(
    tmp_path: Path, embedding: np.ndarray
) -> None:
    """Before: get took a wrong-shaped vector to numpy (a ValueError from einsum) and a zero or NaN
    one silently; put stored a zero or NaN one."""
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, embedder=FakeEmbedder())
    cache.put(user("How do I learn Python?"), "Practice daily.", **KW)
    with pytest.raises(InvalidRequestError, match="embedding"):
        cache.get(user("How do I cook rice?"), embedding=embedding, **KW)
    with pytest.raises(InvalidRequestError, match="embedding"):
        cache.put(user("How do I cook rice?"), "Boil it.", embedding=embedding, **KW)
    cache.close()
