"""A damaged primary-key index: one flipped byte in an index record (the rowid an id points to)
passes SQLite's quick_check, which does not compare the indexes with the table, so the cache
opened as healthy and every lookup of that entry raised a bare ``sqlite3.DatabaseError: database
disk image is malformed`` (from ``get``, and in ``HybridLLM`` a warning on every request), at every
start. Found by flipping random bits of a 300-entry cache. Now opening runs the full integrity
check: the file is moved aside and rebuilt with the entries still readable from its table."""

from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path

from hybridllm.cache import SemanticCache

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {}}
N = 20


def _msgs(i: int) -> list[dict]:
    return [{"role": "user", "content": f"what is the story of town{i}"}]


def _damage_the_index(path: Path, entry_id: str) -> None:
    """Point the primary-key index's record of ``entry_id`` at a rowid no row has."""
    con = sqlite3.connect(path)
    try:
        sql = "SELECT rootpage FROM sqlite_master WHERE name = 'sqlite_autoindex_entries_1'"
        root = con.execute(sql).fetchone()[0]
        rowid = con.execute("SELECT rowid FROM entries WHERE id = ?", (entry_id,)).fetchone()[0]
        page_size = con.execute("PRAGMA page_size").fetchone()[0]
    finally:
        con.close()
    data = bytearray(path.read_bytes())
    start = (root - 1) * page_size
    at = data.find(entry_id.encode(), start, start + page_size) + len(entry_id)
    assert at > len(entry_id) and data[at] == rowid  # the record's rowid, one byte after the id
    data[at] = 120
    path.write_bytes(bytes(data))
    con = sqlite3.connect(path)
    try:  # the damage SQLite's quick check does not see
        assert con.execute("PRAGMA quick_check").fetchall() == [("ok",)]
    finally:
        con.close()


def test_a_damaged_index_is_rebuilt_on_open_not_raised_on_every_lookup(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    with SemanticCache(path, verifier=None, embedder=FakeEmbedder()) as cache:
        ids = [cache.put(_msgs(i), f"answer {i}", **KW) for i in range(N)]
    _damage_the_index(path, ids[5])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    with cache:
        assert any("was corrupt" in str(w.message) for w in caught)
        for i in range(N):  # every entry, the one the index lost its way to included
            hit = cache.get(_msgs(i), **KW)
            assert hit is not None and hit.text == f"answer {i}"
        assert cache.put(_msgs(5), "new answer", **KW) == ids[5]
        assert cache.get(_msgs(5), **KW).text == "new answer"
    assert list(tmp_path.glob("c.sqlite3.corrupt-*"))
