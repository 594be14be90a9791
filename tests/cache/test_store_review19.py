"""A corrupt cache file is moved aside, and the entries that can still be read from it are kept."""

from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path

import pytest

from hybridllm.cache import SemanticCache

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {"temperature": 0}}


def _msgs(i: int) -> list[dict]:
    return [{"role": "user", "content": f"what is the story of town{i}"}]


def _filled(path: Path, n: int) -> None:
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    for i in range(n):
        cache.put(_msgs(i), f"answer {i}", **KW)
    cache.close()


def _smash_page_of(path: Path, name: str) -> None:
    """Overwrite the root page of table or index ``name`` with garbage (the file is closed)."""
    conn = sqlite3.connect(path)
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0]
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    with open(path, "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\xa5" * page_size)


def test_a_damaged_index_loses_no_entry(tmp_path: Path) -> None:
    """Before: one garbage page of an index (the entries themselves intact) failed the integrity
    check, the file was moved aside and all 40 answers were gone from the cache."""
    path = tmp_path / "c.sqlite3"
    _filled(path, 40)
    _smash_page_of(path, "entries_last_used")
    with pytest.warns(RuntimeWarning, match=r"corrupt.*kept the 40 entries"):
        cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    assert list(tmp_path.glob("c.sqlite3.corrupt-*"))  # the damaged file is kept aside
    assert cache.stats()["entries"] == 40
    hit = cache.get(_msgs(7), **KW)
    assert hit is not None and hit.text == "answer 7"
    # the rebuilt file is whole: written and read again without a warning
    cache.put(_msgs(99), "answer 99", **KW)
    cache.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    assert again.stats()["entries"] == 41
    again.close()


def test_a_file_nothing_can_be_read_from_starts_empty(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    path.write_bytes(b"SQLite format 3\x00" + b"\x00" * 84 + b"garbage" * 500)
    with pytest.warns(RuntimeWarning, match="corrupt.*started an empty cache"):
        cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    assert cache.stats()["entries"] == 0
    cache.close()


def test_a_damaged_page_of_answers_loses_only_its_own(tmp_path: Path) -> None:
    """The entries on either side of a damaged leaf page of the table are kept; before, all 60
    were lost."""
    path = tmp_path / "c.sqlite3"
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    for i in range(60):  # an answer of 1,500 characters: about one page each
        cache.put(_msgs(i), f"answer {i} " + "x" * 1500, **KW)
    cache.close()
    conn = sqlite3.connect(path)
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    try:
        leaves = [r[0] for r in conn.execute(
            "SELECT pageno FROM dbstat WHERE name = 'entries' AND pagetype = 'leaf' ORDER BY pageno")]
    except sqlite3.OperationalError:
        pytest.skip("this SQLite has no dbstat table")
    finally:
        conn.close()
    with open(path, "r+b") as f:
        f.seek((leaves[len(leaves) // 2] - 1) * page_size)
        f.write(b"\xa5" * page_size)
    with pytest.warns(RuntimeWarning, match="corrupt.*kept the"):
        cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    kept = cache.stats()["entries"]
    assert 50 <= kept < 60, kept
    for i in (0, 59):  # the first and the last, on either side of the damage
        hit = cache.get(_msgs(i), **KW)
        assert hit is not None and hit.text.startswith(f"answer {i} ")
    cache.close()
