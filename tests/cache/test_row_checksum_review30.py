"""Each cache row carries a checksum of what it serves. Before, an answer whose bytes were
changed in the file (a flipped bit, another program's edit) but were still valid UTF-8 was served
as it was: SQLite's integrity check does not look inside values. Now a row failing its checksum
is a miss, is removed, is logged once and counted in ``stats()``; version-1 files (no checksum
column) are migrated on open, and a damaged file's salvage keeps only rows whose checksum holds."""

from __future__ import annotations

import logging
import multiprocessing as mp
import sqlite3
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hybridllm.cache import SemanticCache
from hybridllm.cache._keys import bucket_key, entry_id_for

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {"temperature": 0}}
GOOD_Q, GOOD_A = "Who wrote the novel Moby Dick?", "Herman Melville wrote it."
BAD_Q, BAD_A = "Tell me the capital of France please", "Paris is the capital of France."
# the same words as BAD_Q (the fake embedder's vector is the same), another exact key: a lookup
# that reaches the row through the index, not the exact repeat
BAD_Q_REWORDED = "Tell me the capital of France, please!"

# schema version 1, as hybridllm wrote it before checksums (hybridllm/cache/_store_file.py)
V1_SCHEMA = """
CREATE TABLE IF NOT EXISTS cache_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    id TEXT PRIMARY KEY,
    namespace TEXT NOT NULL,
    bucket TEXT NOT NULL,
    query TEXT NOT NULL,
    response TEXT NOT NULL,
    embedding BLOB NOT NULL,
    created_at REAL NOT NULL,
    last_used REAL NOT NULL,
    metadata TEXT
);
CREATE INDEX IF NOT EXISTS entries_namespace ON entries(namespace);
CREATE INDEX IF NOT EXISTS entries_last_used ON entries(last_used);
CREATE INDEX IF NOT EXISTS entries_created_at ON entries(created_at);
CREATE TABLE IF NOT EXISTS changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, entry_id TEXT NOT NULL);
"""


def _msgs(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _open(path: Path) -> SemanticCache:
    return SemanticCache(path, verifier=None, embedder=FakeEmbedder(), min_similarity=0.9)


def _filled(path: Path) -> str:
    """A cache holding the good and the bad question; the bad one's entry id."""
    with _open(path) as cache:
        cache.put(_msgs(GOOD_Q), GOOD_A, **KW)
        bad = cache.put(_msgs(BAD_Q), BAD_A, metadata={"source": "edge"}, **KW)
    assert bad is not None
    return bad


def _edit(path: Path, sql: str, *args: Any) -> None:
    """What another program (or a damaged disk) does to the file: values changed, checksum not."""
    con = sqlite3.connect(path)
    with con:
        con.execute(sql, args)
    con.close()


def _ids(path: Path) -> set[str]:
    con = sqlite3.connect(path)
    try:
        return {r[0] for r in con.execute("SELECT id FROM entries")}
    finally:
        con.close()


def _checksum_said(caplog: pytest.LogCaptureFixture, entry_id: str) -> int:
    said = [r.getMessage() for r in caplog.records]
    return sum(1 for m in said if "failed its checksum" in m and entry_id in m)


@pytest.mark.parametrize("while_open", [False, True], ids=["found-on-load", "found-on-serve"])
def test_a_changed_answer_is_never_served_and_is_removed_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, while_open: bool
) -> None:
    path = tmp_path / "c.sqlite3"
    bad = _filled(path)
    caplog.set_level(logging.WARNING, logger="hybridllm.cache")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "Removed 1 damaged entries"
        if while_open:  # loaded whole, then changed under the open cache (no change logged)
            cache = _open(path)
            _edit(path, "UPDATE entries SET response = 'other text' WHERE id = ?", bad)
        else:
            _edit(path, "UPDATE entries SET response = 'other text' WHERE id = ?", bad)
            cache = _open(path)
        with cache:
            for ask in (cache.get_exact(_msgs(BAD_Q), **KW), cache.get(_msgs(BAD_Q), **KW),
                        cache.get(_msgs(BAD_Q_REWORDED), **KW)):
                assert ask is None or ask.text != "other text"
                assert ask is None  # the only row for it is gone, and no other is near it
            hit = cache.get(_msgs(GOOD_Q), **KW)
            assert hit is not None and hit.text == GOOD_A  # the row beside it is still served
            stats = cache.stats()
            assert stats["checksum_failures"] == 1
            assert stats["entries"] == 1
    assert bad not in _ids(path)  # removed from the file: it does not fail again and again
    assert _checksum_said(caplog, bad) == 1
    with _open(path) as again:
        assert again.get(_msgs(BAD_Q), **KW) is None
        assert again.stats()["checksum_failures"] == 0  # nothing left to find
    assert _checksum_said(caplog, bad) == 1  # said once


def test_a_changed_question_is_not_served(tmp_path: Path) -> None:
    """A question rewritten in the file would have been served the old answer for the new text
    (its exact key still names the old question) or for the old question."""
    path = tmp_path / "c.sqlite3"
    bad = _filled(path)
    _edit(path, "UPDATE entries SET query = 'What is the capital of Italy?' WHERE id = ?", bad)
    with pytest.warns(RuntimeWarning, match="Removed 1 damaged"), _open(path) as cache:
        assert cache.get(_msgs(BAD_Q_REWORDED), **KW) is None
        assert cache.get(_msgs("What is the capital of Italy?"), **KW) is None
        assert cache.get(_msgs(GOOD_Q), **KW).text == GOOD_A
        assert cache.stats()["checksum_failures"] == 1
    assert bad not in _ids(path)


def test_changed_embedding_bytes_are_not_served(tmp_path: Path) -> None:
    """Another unit vector in the row (valid floats, unit length): before, the answer was served
    to whatever question that vector is near."""
    path = tmp_path / "c.sqlite3"
    bad = _filled(path)
    other = FakeEmbedder().embed_one("Where is the Eiffel tower")
    _edit(path, "UPDATE entries SET embedding = ? WHERE id = ?", other.astype(np.float32).tobytes(), bad)
    with pytest.warns(RuntimeWarning, match="Removed 1 damaged"), _open(path) as cache:
        assert cache.get(_msgs("Where is the Eiffel tower"), **KW) is None
        assert cache.get(_msgs(BAD_Q_REWORDED), **KW) is None
        assert cache.get(_msgs(GOOD_Q), **KW).text == GOOD_A
    assert bad not in _ids(path)


def test_a_row_whose_checksum_or_metadata_changed_is_not_served(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    bad = _filled(path)
    _edit(path, "UPDATE entries SET metadata = '{\"source\": \"cloud\"}' WHERE id = ?", bad)
    with pytest.warns(RuntimeWarning, match="Removed 1 damaged"), _open(path) as cache:
        assert cache.get(_msgs(BAD_Q), **KW) is None
    path2 = tmp_path / "d.sqlite3"
    bad = _filled(path2)
    _edit(path2, "UPDATE entries SET checksum = NULL WHERE id = ?", bad)
    with pytest.warns(RuntimeWarning, match="Removed 1 damaged"), _open(path2) as cache:
        assert cache.get(_msgs(BAD_Q), **KW) is None
        assert cache.get(_msgs(GOOD_Q), **KW).text == GOOD_A


def test_a_hit_recency_write_keeps_the_row_valid(tmp_path: Path) -> None:
    """last_used is not in the checksum: each hit rewrites it."""
    path = tmp_path / "c.sqlite3"
    _filled(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            with _open(path) as cache:
                assert cache.get(_msgs(BAD_Q), **KW).text == BAD_A
                assert cache.get(_msgs(BAD_Q_REWORDED), **KW).text == BAD_A
                assert cache.stats()["checksum_failures"] == 0


# ---------------------------------------------------------------------- version-1 files


def _v1_file(path: Path, n: int = 3) -> list[tuple[str, str, str]]:
    """A cache as the version before checksums wrote it; its (id, question, answer) rows."""
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=WAL")
    con.executescript(V1_SCHEMA)
    con.executemany("INSERT INTO cache_meta VALUES (?, ?)",
                    [("format", "hybridllm-semantic-cache"), ("version", "1"), ("dim", "384")])
    bucket = bucket_key("default", KW["model"], KW["params_key"], [])
    now, rows = time.time(), []
    embedder = FakeEmbedder()
    for i in range(n):
        q, a = f"How tall is mountain number {i}?", f"Mountain {i} is {1000 + i} m tall."
        eid = entry_id_for(bucket, q)
        con.execute("INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (eid, "default", bucket, q, a, embedder.embed_one(q).tobytes(), now, now, None))
        rows.append((eid, q, a))
    con.commit()
    con.close()
    return rows


def _columns_and_version(path: Path) -> tuple[list[str], str]:
    con = sqlite3.connect(path)
    try:
        columns = [r[1] for r in con.execute("PRAGMA table_info(entries)")]
        version = con.execute("SELECT value FROM cache_meta WHERE key = 'version'").fetchone()[0]
        return columns, version
    finally:
        con.close()


def test_a_version_1_file_is_migrated_and_keeps_serving_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    rows = _v1_file(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not moved aside, no row dropped
        with _open(path) as cache:
            for _, q, a in rows:
                assert cache.get(_msgs(q), **KW).text == a
    assert not list(tmp_path.glob("*.corrupt-*"))
    columns, version = _columns_and_version(path)
    assert columns[-1] == "checksum" and version == "2"
    con = sqlite3.connect(path)
    assert con.execute("SELECT COUNT(*) FROM entries WHERE checksum IS NULL").fetchone()[0] == 0
    con.close()
    # the checksums filled in hold: a change made after the migration is caught
    _edit(path, "UPDATE entries SET response = 'other text' WHERE id = ?", rows[0][0])
    with pytest.warns(RuntimeWarning, match="Removed 1 damaged"), _open(path) as cache:
        assert cache.get(_msgs(rows[0][1]), **KW) is None
        assert cache.get(_msgs(rows[1][1]), **KW).text == rows[1][2]


def _open_v1_and_write(path: str, i: int, start: Any) -> None:
    start.wait()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache = _open(Path(path))
    with cache:
        if cache.get(_msgs("How tall is mountain number 0?"), **KW) is None:
            raise SystemExit(3)
        cache.put(_msgs(f"What does process {i} say?"), f"process {i} says hello", **KW)


def test_processes_opening_one_version_1_file_at_once_migrate_it_once(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    rows = _v1_file(path, n=50)
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=_open_v1_and_write, args=(str(path), i, start)) for i in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert not list(tmp_path.glob("*.corrupt-*"))
    columns, version = _columns_and_version(path)
    assert columns.count("checksum") == 1 and version == "2"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with _open(path) as cache:
            assert cache.stats()["entries"] == 50 + 4
            for _, q, a in rows[::10]:
                assert cache.get(_msgs(q), **KW).text == a
            for i in range(4):
                assert cache.get(_msgs(f"What does process {i} say?"), **KW).text == f"process {i} says hello"


# ---------------------------------------------------------------------- salvage of damaged files


def _smash_root(path: Path) -> None:
    """Damage the entries table's root page: only the rows on its leaf pages can be salvaged."""
    con = sqlite3.connect(path)
    root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'entries'").fetchone()[0]
    size = con.execute("PRAGMA page_size").fetchone()[0]
    con.close()
    with open(path, "r+b") as f:
        f.seek((root - 1) * size)
        f.write(bytes(range(256)) * (size // 256))


def _open_warned(path: Path) -> tuple[SemanticCache, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = _open(path)
    return cache, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def test_salvage_keeps_no_row_failing_its_checksum(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "c.sqlite3"
    n = 200
    with _open(path) as cache:
        for i in range(n):
            cache.put(_msgs(f"What is the story of town {i}?"), f"The story of town {i}.", **KW)
    bucket = bucket_key("default", KW["model"], KW["params_key"], [])
    bad = entry_id_for(bucket, "What is the story of town 7?")
    # the same length: the row stays where it was on its leaf page
    _edit(path, "UPDATE entries SET response = 'The story of town 8.' WHERE id = ?", bad)
    _smash_root(path)
    caplog.set_level(logging.WARNING, logger="hybridllm.cache")
    cache, said = _open_warned(path)
    with cache:
        assert any(f"kept the {n - 1} entries" in m for m in said), said
        assert cache.get(_msgs("What is the story of town 7?"), **KW) is None
        assert cache.get(_msgs("What is the story of town 9?"), **KW).text == "The story of town 9."
    assert _checksum_said(caplog, bad) == 1


def test_salvage_of_a_version_1_file_keeps_and_seals_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    rows = _v1_file(path, n=200)
    _smash_root(path)
    cache, said = _open_warned(path)
    with cache:
        assert any("kept the 200 entries" in m for m in said), said
        assert cache.get(_msgs(rows[5][1]), **KW).text == rows[5][2]
    columns, version = _columns_and_version(path)
    assert columns[-1] == "checksum" and version == "2"
    _edit(path, "UPDATE entries SET response = 'other text' WHERE id = ?", rows[6][0])
    with pytest.warns(RuntimeWarning, match="Removed 1 damaged"), _open(path) as cache:
        assert cache.get(_msgs(rows[6][1]), **KW) is None
