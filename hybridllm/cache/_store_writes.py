"""Writing the cache's SQLite file: each write one transaction, logging the entries it changes."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np

from .._exceptions import CacheError
from ._store_reads import _RELOAD_MARK, Entry, _StoreReads, id_of, row_checksum

_KEEP_CHANGES = 10000  # ids kept in the change log
_MAX_LOGGED = 1000  # a change of more entries is logged as one reload mark


def _damaged(entry_id: str) -> bool:
    """An id read from a row whose id is not UTF-8 (see :func:`~._store_reads.id_of`)."""
    try:
        entry_id.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _raw_id(entry_id: str) -> bytes | None:
    """The bytes of a damaged id read by :func:`~._store_reads.id_of`; None for a string no row's
    id reads as (a caller's "x\\ud800" raised a bare UnicodeEncodeError from delete)."""
    try:
        return entry_id.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return None


class _StoreWrites(_StoreReads):
    """How :class:`~.store.CacheStore` writes: entries, recency, counts, deletes and clears."""

    path: Path
    last_logged: tuple[int, int]

    # ------------------------------------------------------------------ writes

    def upsert(self, entry: Entry, *, counts: tuple[int, int] = (0, 0)) -> None:
        """Insert or replace (and add ``counts``, hits and misses, to the file's)."""
        blob = np.ascontiguousarray(entry.embedding, dtype=np.float32).tobytes()
        meta = json.dumps(entry.metadata) if entry.metadata is not None else None
        with self._write():
            # REPLACE (delete, then insert), not an update in place: the row gets the largest
            # rowid, which orders writes within one clock tick for :meth:`lru_ids`
            row = (entry.id, entry.namespace, entry.bucket, entry.query, entry.response, blob,
                   float(entry.created_at), float(entry.last_used), meta)
            self._conn.execute(
                "INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*row, row_checksum(row)),
            )
            self._log([entry.id])
            self._add_counts(*counts)

    def touch(self, entry_id: str, when: float, *, counts: tuple[int, int] = (0, 0)) -> None:
        """Mark a hit's recency (and add ``counts``); not a change other processes need to read."""
        with self._write():
            self._conn.execute("UPDATE entries SET last_used = ? WHERE id = ?", (when, entry_id))
            self._add_counts(*counts)

    def add_counts(self, hits: int, misses: int) -> None:
        with self._write():
            self._add_counts(hits, misses)

    def _add_counts(self, hits: int, misses: int, damaged: int = 0) -> None:
        for key, n in (("hits", hits), ("misses", misses), ("damaged", damaged)):
            if n:
                self._conn.execute(
                    "INSERT INTO cache_meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE "
                    "SET value = CAST(value AS INTEGER) + excluded.value",
                    (key, n),
                )

    def delete(self, entry_ids: list[str], *, damaged: bool = False) -> int:
        """Delete the entries; ``damaged``: rows found damaged, added to the file's count of them
        (``damaged_count``) as many as this write removed, so two processes that found one row
        count it once."""
        if not entry_ids:
            return 0
        clean = [(i,) for i in entry_ids if not _damaged(i)]
        with self._write():
            removed = self._conn.executemany("DELETE FROM entries WHERE id = ?", clean).rowcount
            if damaged_ids := [(raw,) for i in entry_ids if _damaged(i) and (raw := _raw_id(i)) is not None]:
                # an id that is not UTF-8 (see id_of), found by its bytes
                sql = "DELETE FROM entries WHERE CAST(id AS BLOB) = ?"
                removed += self._conn.executemany(sql, damaged_ids).rowcount
            self._log(entry_ids)
            if damaged:
                self._add_counts(0, 0, removed)
            return removed

    def expired_ids(self, before: float) -> list[str]:
        sql = "SELECT id FROM entries WHERE created_at < ?"
        return [id_of(r[0]) for r in self._conn.execute(sql, (before,))]

    def lru_ids(self, num: int) -> list[str]:
        """The ``num`` least recently used entries, oldest first, never the latest write (the
        largest rowid, as :meth:`upsert` replaces rows) unless ``num`` takes every row. Ties (a
        coarse clock: one tick for several writes) go by rowid, the order of the writes. Before,
        ties fell in any order, and a put could evict the entry it had just written (so could a
        clock set back, as every other entry then looked more recent). A WHERE, not an ORDER BY
        term, keeps the scan on the last_used index (ordering by the comparison sorted the whole
        table: 28 ms an eviction at 100k rows)."""
        sql = (
            "SELECT id FROM entries WHERE rowid != (SELECT MAX(rowid) FROM entries) "
            "ORDER BY last_used ASC, created_at ASC, rowid ASC LIMIT ?"
        )
        ids = [id_of(r[0]) for r in self._conn.execute(sql, (num,))]
        if len(ids) < num:  # every row asked for: the latest write comes last
            last = "SELECT id FROM entries ORDER BY rowid DESC LIMIT 1"
            ids += [id_of(r[0]) for r in self._conn.execute(last)]
        return ids

    def clear(self, namespace: str | None = None) -> list[str]:
        with self._write():
            if namespace is None:
                ids = [id_of(r[0]) for r in self._conn.execute("SELECT id FROM entries")]
                self._conn.execute("DELETE FROM entries")
                self._conn.execute("DELETE FROM cache_meta WHERE key IN ('hits', 'misses', 'damaged')")
            else:
                sql = "SELECT id FROM entries WHERE namespace = ?"
                ids = [id_of(r[0]) for r in self._conn.execute(sql, (namespace,))]
                self._conn.execute("DELETE FROM entries WHERE namespace = ?", (namespace,))
            self._log(ids)
        self._scrub(vacuum=namespace is None)
        return ids

    def _scrub(self, *, vacuum: bool) -> None:
        """After a clear: copy the WAL into the file and empty it (TRUNCATE), so the deleted
        text is in neither (the WAL kept the pages as written, and the file the old pages, until
        a later checkpoint); after a full clear, VACUUM first so the file shrinks (it kept its
        size: 3.3 MB after clearing 1,500 entries). Not after a namespace clear: VACUUM may
        renumber the rows left, and :meth:`lru_ids` orders ties by rowid. Best effort: the
        entries are deleted either way; what another process's open read blocks is not waited
        for (it held the clear 10 s, the busy timeout) but done by a later checkpoint."""
        try:
            self._conn.execute("PRAGMA busy_timeout=100")
            if vacuum and self.count() == 0:  # none written by another process since
                self._conn.execute("VACUUM")
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error:  # busy, disk full (VACUUM needs a copy's room), read-only
            pass
        finally:
            self._conn.execute("PRAGMA busy_timeout=10000")  # the timeout of _open's connect

    def _log(self, entry_ids: list[str]) -> None:
        """Append to the change log (inside the caller's transaction) and trim it."""
        # a damaged id (not UTF-8) is in no process's index: nothing to tell them
        entry_ids = [i for i in entry_ids if not _damaged(i)]
        if not entry_ids:
            return
        if len(entry_ids) > _MAX_LOGGED:
            entry_ids = [_RELOAD_MARK]
        self._conn.executemany("INSERT INTO changes (entry_id) VALUES (?)", [(i,) for i in entry_ids])
        last = int(self._conn.execute("SELECT MAX(seq) FROM changes").fetchone()[0])
        # a primary-key range: one b-tree seek, nothing to scan when there is nothing to trim
        self._conn.execute("DELETE FROM changes WHERE seq <= ?", (last - _KEEP_CHANGES,))
        self.last_logged = (last - len(entry_ids) + 1, last)

    def _write(self) -> _Transaction:
        self.last_logged = (0, 0)  # until this write logs changes of its own
        return _Transaction(self._conn, self.path)


class _Transaction:
    """``with conn:`` plus mapping of SQLite errors (disk full, read-only, locked) to
    :class:`CacheError`, at every step: BEGIN, the statements and COMMIT."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self._path = path

    def __enter__(self) -> sqlite3.Connection:
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise CacheError(f"Writing the cache {self._path} failed: {exc}") from exc
        return self._conn

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self._conn.commit()
                return
            except sqlite3.Error as failed:
                exc = failed
        try:
            self._conn.rollback()
        except sqlite3.Error:  # nothing to roll back, or the file is gone
            pass
        if isinstance(exc, sqlite3.Error):
            raise CacheError(f"Writing the cache {self._path} failed: {exc}") from exc
