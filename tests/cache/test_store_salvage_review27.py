"""One damaged page of ``cache_meta`` (a one-page table of three rows) lost every entry: the file
was moved aside and rebuilt, and the salvage, which read the format and dimension from that table
first, kept none of the 300 entries whose pages were intact. Now, when ``cache_meta`` cannot be
read, the entries whose vectors have this cache's dimension are kept."""

from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path

import numpy as np
import pytest

from hybridllm.cache.semantic import SemanticCache


def _vec(i: int, dim: int = 384) -> np.ndarray:
    v = np.random.default_rng(i).normal(size=dim).astype(np.float32)
    return v / np.linalg.norm(v)


def _ask(q: str) -> list[dict]:
    return [{"role": "user", "content": q}]


def _damage_page_of(path: Path, table: str) -> None:
    con = sqlite3.connect(path)
    page_size = con.execute("PRAGMA page_size").fetchone()[0]
    root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    con.close()
    with open(path, "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(bytes(range(256)) * (page_size // 256))


def test_a_damaged_cache_meta_page_keeps_the_entries(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    with SemanticCache(path, verifier=None) as cache:
        for i in range(120):
            cache.put(_ask(f"question number {i} " * 4), f"answer {i}", model="m", params_key={},
                      embedding=_vec(i))
    _damage_page_of(path, "cache_meta")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = SemanticCache(path, verifier=None)
    assert any("kept the 120 entries" in str(w.message) for w in caught), [str(w.message) for w in caught]
    with cache:
        assert cache.stats()["entries"] == 120
        hit = cache.get(_ask("question number 7 " * 4), model="m", params_key={})
        assert hit is not None and hit.text == "answer 7"
        # the rebuilt file is a whole cache: it takes new entries and reopens clean
        cache.put(_ask("a new one?"), "new", model="m", params_key={}, embedding=_vec(999))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with SemanticCache(path, verifier=None) as again:
            assert again.stats()["entries"] == 121


def test_vectors_of_another_dimension_are_not_kept_without_cache_meta(tmp_path: Path) -> None:
    # a 768-dim cache whose cache_meta is damaged, opened as a 384-dim one: nothing to compare
    path = tmp_path / "c.sqlite3"

    class _Dim768:
        dim = 768

        def embed_one(self, text: str) -> np.ndarray:
            return _vec(len(text), 768)

    with SemanticCache(path, verifier=None, embedder=_Dim768()) as cache:  # type: ignore[arg-type]
        for i in range(20):
            cache.put(_ask(f"q{i}"), f"a{i}", model="m", params_key={}, embedding=_vec(i, 768))
    _damage_page_of(path, "cache_meta")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        with SemanticCache(path, verifier=None) as cache:
            assert cache.stats()["entries"] == 0
            assert cache.get(_ask("q3"), model="m", params_key={}) is None


@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE cache_meta SET value = CAST(x'68796272ff' AS TEXT) WHERE key = 'format'",
        "UPDATE cache_meta SET value = CAST(x'33ff34' AS TEXT) WHERE key = 'dim'",
        "UPDATE cache_meta SET key = CAST(x'666f726dff74' AS TEXT) WHERE key = 'format'",
    ],
)
def test_a_flipped_bit_in_cache_meta_text_keeps_the_entries(tmp_path: Path, damage: str) -> None:
    # a cache_meta value or key that is not UTF-8: before, the file could not be opened at all
    # (OperationalError 'Could not decode to UTF-8'); read as bytes, a damaged format made it
    # "written by another program" (refused for good) and a damaged dimension lost every entry
    path = tmp_path / "c.sqlite3"
    with SemanticCache(path, verifier=None) as cache:
        for i in range(30):
            cache.put(_ask(f"question {i}?"), f"answer {i}", model="m", params_key={}, embedding=_vec(i))
    con = sqlite3.connect(path)
    con.execute(damage)
    con.commit()
    con.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = SemanticCache(path, verifier=None)
    assert any("kept the 30 entries" in str(w.message) for w in caught), [str(w.message) for w in caught]
    with cache:
        hit = cache.get(_ask("question 3?"), model="m", params_key={})
        assert hit is not None and hit.text == "answer 3"
