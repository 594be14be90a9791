"""Review 15 of the cache store: embeddings of another length read back from the file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from hybridllm.cache import SemanticCache
from hybridllm.cache._store_reads import row_checksum

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {"temperature": 0}}


def _msgs(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _axis(i: int) -> np.ndarray:
    vec = np.zeros(384, dtype=np.float32)
    vec[i] = 1.0
    return vec


def _set_embedding(path: Path, entry_id: str, vec: np.ndarray) -> None:
    """Store ``vec`` as the entry's vector with a matching checksum: a row written so by a version
    that did not normalize (and migrated), not damage the checksum would catch."""
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE entries SET embedding = ? WHERE id = ?",
                     (np.asarray(vec, dtype=np.float32).tobytes(), entry_id))
        row = conn.execute("SELECT * FROM entries WHERE id = ?", (entry_id,)).fetchone()
        conn.execute("UPDATE entries SET checksum = ? WHERE id = ?", (row_checksum(row), entry_id))
    conn.close()


def test_a_stored_vector_of_another_length_does_not_serve_unrelated_questions(tmp_path: Path) -> None:
    """A row whose vector is 7 times unit length (written before vectors were normalized, or a
    flipped exponent bit): before, a question at cosine 0.2 to it scored 1.4, passed
    min_similarity 0.95 and was served its answer. Now the vector is normalized as it is read."""
    path = tmp_path / "c.sqlite3"
    with SemanticCache(path, verifier=None, embedder=FakeEmbedder()) as cache:
        eid = cache.put(_msgs("How do I bake bread?"), "Knead, proof, bake.", embedding=_axis(0), **KW)
    _set_embedding(path, eid, 7.0 * _axis(0))
    query = 0.2 * _axis(0) + np.sqrt(1 - 0.04) * _axis(1)  # an unrelated question, cosine 0.2
    with SemanticCache(path, verifier=None, embedder=FakeEmbedder()) as cache:
        assert cache.get(_msgs("Who painted the Mona Lisa?"), embedding=query, **KW) is None
        hit = cache.get(_msgs("Bread: how do I bake it?"), embedding=_axis(0), **KW)
        assert hit is not None and hit.similarity == pytest.approx(1.0, abs=1e-5)  # a cosine again


def test_a_stored_vector_of_nans_is_a_damaged_row(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    with SemanticCache(path, verifier=None, embedder=FakeEmbedder()) as cache:
        bad = cache.put(_msgs("first question here"), "a", embedding=_axis(0), **KW)
        cache.put(_msgs("second question here"), "b", embedding=_axis(1), **KW)
    _set_embedding(path, bad, np.full(384, np.nan, dtype=np.float32))
    with pytest.warns(RuntimeWarning, match="Removed 1 damaged entries"):
        cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    assert cache.stats()["entries"] == 1
    assert cache.get(_msgs("second question here"), **KW).text == "b"
    cache.close()
