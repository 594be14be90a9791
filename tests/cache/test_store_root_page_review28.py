"""A damaged root page of the entries table lost every entry: SQLite reads a table's rows from
its root page down, so no query read one row, and the rebuild "started an empty cache" although
every page holding the 300 answers was intact. Its warning also quoted SQLite's whole integrity
report, a hundred lines ("Page N is never used" for each page the root no longer reached). Now
the rows are read off the file's leaf pages, the damaged file is kept aside byte for byte, and
the warning is one line naming it."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import warnings
from pathlib import Path

from hybridllm.cache import SemanticCache

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {"temperature": 0}}
N = 300


def _msgs(i: int) -> list[dict]:
    return [{"role": "user", "content": f"what is the story of town{i}"}]


def _filled(path: Path, answer_size: int = 20) -> None:
    with SemanticCache(path, verifier=None, embedder=FakeEmbedder()) as cache:
        for i in range(N):
            cache.put(_msgs(i), f"answer {i} " + "y" * answer_size, **KW)


def _root_and_page_size(path: Path) -> tuple[int, int]:
    con = sqlite3.connect(path)
    try:
        root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'entries'").fetchone()[0]
        return root, con.execute("PRAGMA page_size").fetchone()[0]
    finally:
        con.close()


def _smash(path: Path, page: int, page_size: int) -> None:
    with open(path, "r+b") as f:
        f.seek((page - 1) * page_size)
        f.write(bytes(range(256)) * (page_size // 256))


def _open_warned(path: Path) -> tuple[SemanticCache, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    return cache, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def test_a_damaged_root_page_keeps_every_entry_and_says_so_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    _filled(path)
    root, page_size = _root_and_page_size(path)
    _smash(path, root, page_size)
    damaged = hashlib.sha256(path.read_bytes()).hexdigest()
    cache, said = _open_warned(path)
    with cache:
        assert cache.stats()["entries"] == N
        for i in (0, 150, N - 1):
            hit = cache.get(_msgs(i), **KW)
            assert hit is not None and hit.text.startswith(f"answer {i} ")
    [aside] = tmp_path.glob("c.sqlite3.corrupt-*")
    assert hashlib.sha256(aside.read_bytes()).hexdigest() == damaged  # kept as it was found
    [message] = said
    assert "\n" not in message and str(aside) in message and f"kept the {N} entries" in message
    assert "more reported" in message  # SQLite's report summed up, not quoted
    with warnings.catch_warnings():  # the rebuilt file is whole
        warnings.simplefilter("error")
        with SemanticCache(path, verifier=None, embedder=FakeEmbedder()) as again:
            assert again.stats()["entries"] == N


def test_answers_longer_than_a_page_are_kept_whole(tmp_path: Path) -> None:
    # 9,000 characters: the row continues on overflow pages, which are followed
    path = tmp_path / "c.sqlite3"
    _filled(path, answer_size=9000)
    _smash(path, *_root_and_page_size(path))
    cache, _ = _open_warned(path)
    with cache:
        assert cache.stats()["entries"] == N
        hit = cache.get(_msgs(42), **KW)
        assert hit is not None and hit.text == "answer 42 " + "y" * 9000


def test_deleted_entries_are_not_brought_back(tmp_path: Path) -> None:
    """Rows deleted without ``secure_delete`` (a file written by an older version) stay on the
    freelist's pages and in a page's freed space: never read back as entries."""
    path = tmp_path / "c.sqlite3"
    _filled(path)
    con = sqlite3.connect(path)
    con.execute("PRAGMA secure_delete=OFF")
    gone = [f"what is the story of town{i}" for i in range(100, 200)] + ["what is the story of town7"]
    con.executemany("DELETE FROM entries WHERE query = ?", [(q,) for q in gone])
    con.commit()
    con.close()
    assert not Path(f"{path}-wal").exists()
    _smash(path, *_root_and_page_size(path))
    cache, _ = _open_warned(path)
    with cache:
        assert cache.stats()["entries"] == N - len(gone)
        assert cache.get(_msgs(7), **KW) is None and cache.get(_msgs(150), **KW) is None
        hit = cache.get(_msgs(8), **KW)
        assert hit is not None and hit.text.startswith("answer 8 ")


def test_with_a_wal_the_older_pages_are_not_read(tmp_path: Path) -> None:
    """A WAL holds newer pages than the file: the file's leaf may still hold an entry deleted
    since, so with one the pages are not read (those entries are lost, none brought back). The
    WAL goes aside with the file when another process still has the file open (the last one to
    close it copies the WAL back first)."""
    path = tmp_path / "c.sqlite3"
    _filled(path)
    root, page_size = _root_and_page_size(path)
    con = sqlite3.connect(path)
    con.execute("PRAGMA wal_autocheckpoint=0")
    con.execute("DELETE FROM entries WHERE query = 'what is the story of town7'")
    con.commit()
    copy = tmp_path / "copy" / path.name  # as a machine stopped with the WAL not copied back
    copy.parent.mkdir()
    for suffix in ("", "-wal"):
        shutil.copyfile(f"{path}{suffix}", f"{copy}{suffix}")
    con.close()
    _smash(copy, root, page_size)
    other = sqlite3.connect(copy)  # another process using the cache
    other.execute("SELECT COUNT(*) FROM cache_meta").fetchone()
    try:
        cache, said = _open_warned(copy)
        with cache:
            assert cache.get(_msgs(7), **KW) is None
    finally:
        other.close()
    [aside] = copy.parent.glob("c.sqlite3.corrupt-*[0-9]")
    assert Path(f"{aside}-wal").exists()
    assert said and "\n" not in said[0]


def test_a_damaged_schema_page_keeps_the_entries(tmp_path: Path) -> None:
    """Page 1 past the file header holds the schema, which says where every table starts:
    damaged, SQLite reads no table at all, and every entry was lost."""
    path = tmp_path / "c.sqlite3"
    _filled(path)
    _, page_size = _root_and_page_size(path)
    with open(path, "r+b") as f:
        f.seek(100)  # the 100-byte file header (page size, freelist) is intact
        f.write(b"\xa5" * (page_size - 100))
    cache, said = _open_warned(path)
    with cache:
        assert cache.stats()["entries"] == N
        hit = cache.get(_msgs(3), **KW)
        assert hit is not None and hit.text.startswith("answer 3 ")
    assert f"kept the {N} entries" in said[0]


def test_a_file_with_utf16_text_is_not_read_page_by_page(tmp_path: Path) -> None:
    """Its texts read as UTF-8 would be garbage (questions no lookup asks, answers to none), so
    such a file's pages are not read: nothing is kept rather than that."""
    path = tmp_path / "c.sqlite3"
    con = sqlite3.connect(path)
    con.execute("PRAGMA encoding = 'UTF-16le'")
    con.execute("CREATE TABLE cache_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")  # the encoding
    con.commit()
    con.close()
    _filled(path)
    _smash(path, *_root_and_page_size(path))
    cache, said = _open_warned(path)
    with cache:
        assert cache.stats()["entries"] == 0
    assert "started an empty cache" in said[0]
