"""A damaged row costs only itself: the cache opens, serves the other entries and drops it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hybridllm.cache import SemanticCache

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {"temperature": 0}}


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _filled(path: Path) -> None:
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    for i in range(3):
        cache.put(user(f"question number w{i}"), f"answer {i}", **KW)
    cache.close()


def _damage(path: Path, sql: str) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(sql + " WHERE query = 'question number w1'")


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE entries SET embedding = x'00'",  # a size no float32 vector has
        "UPDATE entries SET embedding = zeroblob(400)",  # 100 floats, not 384
        "UPDATE entries SET metadata = '{not json'",
        "UPDATE entries SET response = x'deadbeef'",  # a blob where text belongs
    ],
    ids=["odd-size", "short-vector", "metadata", "blob-answer"],
)
def test_one_damaged_row_never_makes_the_cache_unopenable(tmp_path: Path, sql: str) -> None:
    """Before: opening the cache read every row, and the damaged one raised each time (a numpy
    ValueError, CacheCorruptError or a JSON error): HybridLLM could not be created until the user
    cleared the whole cache. SQLite's integrity check does not read row contents."""
    path = tmp_path / "c.sqlite3"
    _filled(path)
    _damage(path, sql)
    with pytest.warns(RuntimeWarning, match="Removed 1 damaged entries"):
        cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    for i in (0, 2):
        hit = cache.get(user(f"question number w{i}"), **KW)
        assert hit is not None and hit.text == f"answer {i}"
    assert cache.get(user("question number w1"), **KW) is None
    assert cache.stats()["entries"] == 2
    cache.close()


def test_a_row_damaged_while_open_is_a_miss_and_is_dropped(tmp_path: Path) -> None:
    """Before: a hit on it raised from get (the JSON error of its metadata)."""
    path = tmp_path / "c.sqlite3"
    _filled(path)
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    _damage(path, "UPDATE entries SET metadata = '{not json'")  # no change logged: not re-read
    with pytest.warns(RuntimeWarning, match="damaged"):
        assert cache.get(user("question number w1"), **KW) is None
    assert cache._store.count() == 2
    hit = cache.get(user("question number w0"), **KW)
    assert hit is not None and hit.text == "answer 0"
    cache.close()
