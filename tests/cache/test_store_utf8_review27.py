"""A stored text that is not UTF-8 (a flipped bit in a question, an answer, the metadata or an id:
SQLite's integrity check does not look inside text) made the whole cache impossible to open:
``sqlite3.OperationalError: Could not decode to UTF-8 column 'response'`` from the constructor, on
every start. Now such a row is a damaged row like the others: a miss, deleted with a warning, the
other entries kept and served."""

from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path

import numpy as np

from hybridllm.cache.semantic import SemanticCache
from hybridllm.cache.store import CacheStore


def _vec(i: int) -> np.ndarray:
    v = np.random.default_rng(i).normal(size=384).astype(np.float32)
    return v / np.linalg.norm(v)


def _ask(q: str) -> list[dict]:
    return [{"role": "user", "content": q}]


def _damage(path: Path) -> None:
    con = sqlite3.connect(path)
    con.execute("UPDATE entries SET response = CAST(x'ff80fe41' AS TEXT) WHERE query = 'q1?'")
    con.execute("UPDATE entries SET query = CAST(x'c3' AS TEXT) WHERE query = 'q2?'")
    con.execute("UPDATE entries SET metadata = CAST(x'ff' AS TEXT) WHERE query = 'q3?'")
    con.execute("UPDATE entries SET id = CAST(x'ff00ff' AS TEXT) WHERE query = 'q4?'")
    con.commit()
    con.close()


def test_text_that_is_not_utf8_is_a_damaged_row_not_an_unreadable_cache(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    with SemanticCache(path, verifier=None) as cache:
        for i in range(6):
            cache.put(_ask(f"q{i}?"), f"a{i}", model="m", params_key={}, embedding=_vec(i),
                      metadata={"i": i})
    _damage(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = SemanticCache(path, verifier=None)
    assert [str(w.message) for w in caught if "damaged" in str(w.message)] == [
        f"Removed 4 damaged entries from the cache {path}; the other entries are kept."
    ]
    with cache:
        assert cache.stats()["entries"] == 2
        for i in (0, 5):
            hit = cache.get(_ask(f"q{i}?"), model="m", params_key={})
            assert hit is not None and hit.text == f"a{i}"
        for i in (1, 2, 3, 4):
            assert cache.get(_ask(f"q{i}?"), model="m", params_key={}) is None
    # deleted from the file, the one with a damaged id too
    con = sqlite3.connect(path)
    assert con.execute("SELECT COUNT(*) FROM entries").fetchone()[0] == 2
    con.close()


def test_a_damaged_id_is_found_by_evictions_and_deletes(tmp_path: Path) -> None:
    # the store alone (a file that could not be written when the row was found keeps it): the
    # least recently used row has an id that is not UTF-8; evicting it deletes it, so the bound
    # holds (before, reading the ids raised)
    path = tmp_path / "c.sqlite3"
    with SemanticCache(path, verifier=None) as cache:
        for i in range(5):
            cache.put(_ask(f"q{i}?"), f"a{i}", model="m", params_key={}, embedding=_vec(i))
    con = sqlite3.connect(path)
    con.execute("UPDATE entries SET id = CAST(x'ff00ff' AS TEXT), last_used = 0 WHERE query = 'q1?'")
    con.commit()
    con.close()
    store = CacheStore(path, dim=384)
    try:
        ids = store.lru_ids(1)
        assert len(ids) == 1 and ids[0].encode("utf-8", "surrogateescape") == b"\xff\x00\xff"
        assert store.delete(ids) == 1
        assert store.count() == 4
        assert len(store.expired_ids(float("inf"))) == 4
        assert len(store.clear()) == 4 and store.count() == 0
    finally:
        store.close()


def test_a_damaged_namespace_is_counted_under_a_readable_name(tmp_path: Path) -> None:
    # `hybridllm cache stats` reads the counts per namespace without loading the entries: a name
    # that is not UTF-8 came back as bytes, and the command failed on it (an internal error)
    path = tmp_path / "c.sqlite3"
    with SemanticCache(path, verifier=None) as cache:
        for i in range(3):
            cache.put(_ask(f"q{i}?"), f"a{i}", model="m", params_key={}, embedding=_vec(i))
    con = sqlite3.connect(path)
    con.execute("UPDATE entries SET namespace = CAST(x'ff' AS TEXT) WHERE query = 'q1?'")
    con.commit()
    con.close()
    store = CacheStore(path, dim=None)
    try:
        assert store.namespaces() == {"default": 2, "\ufffd": 1}
    finally:
        store.close()
