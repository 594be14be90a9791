"""What a clear, delete or eviction leaves in the cache file: the deleted text must be gone from
the file and its WAL, and a full clear must shrink the file."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from hybridllm.cache import SemanticCache
from hybridllm.cache import store as store_mod

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {}}


def _ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _raw(path: Path) -> bytes:
    """The bytes of the database and its WAL, as anyone reading the disk sees them."""
    return b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())


def _fill(cache: SemanticCache, n: int, *, namespace: str = "default", tag: str = "SECRET") -> None:
    for i in range(n):
        cache.put(_ask(f"question {i} in {namespace}"), f"{tag}-{namespace}-{i:04d} " + "x" * 300,
                  namespace=namespace, **KW)


def test_a_full_clear_leaves_no_text_in_the_file_or_its_wal_and_shrinks_the_file(tmp_path: Path) -> None:
    """Before: with the cache still open (a running server), 300 cleared answers were still in
    the file or WAL after clear(), and the file kept its size (3.3 MB after 1,500 entries)."""
    path = tmp_path / "c.sqlite3"
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    _fill(cache, 300)
    before = len(_raw(path))
    assert _raw(path).count(b"SECRET-") >= 300
    assert cache.clear() == 300
    assert _raw(path).count(b"SECRET-") == 0
    assert len(_raw(path)) < before / 4
    _fill(cache, 3, tag="AFTER")  # still a working cache
    assert cache.get(_ask("question 1 in default"), **KW) is not None
    cache.close()


def test_a_namespace_clear_leaves_no_text_of_that_namespace(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    _fill(cache, 100, namespace="alice")
    _fill(cache, 100, namespace="bob")
    assert cache.clear("alice") == 100
    raw = _raw(path)
    assert raw.count(b"SECRET-alice-") == 0 and raw.count(b"SECRET-bob-") >= 100
    assert cache.get(_ask("question 7 in bob"), namespace="bob", **KW) is not None
    cache.close()


def test_deleted_text_is_zeroed_even_where_sqlite_keeps_it_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite builds without SQLITE_SECURE_DELETE (python.org's macOS and Windows ones) leave a
    deleted row's text in the page's free space; simulated here by turning the pragma off on
    every connection the store makes. Before: the deleted answer stayed in the file."""
    connect = sqlite3.connect

    def insecure(*args, **kwargs):
        conn = connect(*args, **kwargs)
        conn.execute("PRAGMA secure_delete=OFF")
        return conn

    monkeypatch.setattr(store_mod.sqlite3, "connect", insecure)
    path = tmp_path / "c.sqlite3"
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    _fill(cache, 20)
    victim = cache.get(_ask("question 5 in default"), **KW)
    assert victim is not None and cache.delete(victim.entry_id)
    cache.close()  # the last connection checkpoints the WAL into the file
    raw = _raw(path)
    assert raw.count(b"SECRET-default-0005") == 0 and raw.count(b"SECRET-default-") == 19


def test_a_clear_does_not_wait_for_another_process_s_open_read(tmp_path: Path) -> None:
    """The checkpoint after a clear is not waited for while another connection reads (it took
    the 10 s busy timeout); the rows are deleted all the same."""
    path = tmp_path / "c.sqlite3"
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    _fill(cache, 20)
    reader = sqlite3.connect(str(path), isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT COUNT(*) FROM entries").fetchone()
        start = time.monotonic()
        assert cache.clear() == 20
        assert time.monotonic() - start < 3.0
        reader.execute("COMMIT")
    finally:
        reader.close()
    assert cache.stats()["entries"] == 0
    cache.clear()  # a later clear finishes the job
    assert _raw(path).count(b"SECRET-") == 0
    cache.close()
