"""The persistent side of the cache: one SQLite database in WAL mode.

Crash safety: every write is one transaction; WAL with ``synchronous=NORMAL`` never loses or
tears a committed transaction when the process dies (kill -9), only possibly the last ones on a
power cut. A half-written transaction is rolled back by SQLite on the next open.

A file that is not a usable SQLite database (garbage, truncated, failing its integrity check) is
moved aside to ``<name>.corrupt-<time>`` and a fresh cache is created with a warning: the cache
only holds answers that can be generated again, and a rebuild cannot loop because the new file
is valid. A valid SQLite database that is not a hybridllm cache (no ``cache_meta`` table, or a
newer schema) is never touched: opening it raises :class:`CacheCorruptError`.
"""

from __future__ import annotations

import json
import sqlite3
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._exceptions import CacheCorruptError, CacheError

FORMAT = "hybridllm-semantic-cache"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cache_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    id TEXT PRIMARY KEY,
    namespace TEXT NOT NULL,
    bucket TEXT NOT NULL,          -- hash of namespace, model, params and conversation context
    query TEXT NOT NULL,           -- the last user turn, as embedded
    response TEXT NOT NULL,
    embedding BLOB NOT NULL,       -- float32 unit vector
    created_at REAL NOT NULL,
    last_used REAL NOT NULL,
    metadata TEXT
);
CREATE INDEX IF NOT EXISTS entries_namespace ON entries(namespace);
CREATE INDEX IF NOT EXISTS entries_last_used ON entries(last_used);
CREATE INDEX IF NOT EXISTS entries_created_at ON entries(created_at);
"""


@dataclass(frozen=True)
class Entry:
    id: str
    namespace: str
    bucket: str
    query: str
    response: str
    embedding: np.ndarray
    created_at: float
    last_used: float
    metadata: dict | None


class CacheStore:
    """SQLite rows of cached answers. Not thread-safe by itself: the caller holds a lock."""

    def __init__(self, path: str | Path, *, dim: int) -> None:
        self.path = Path(path)
        self.dim = dim
        if self.path.is_dir():  # never moved aside as if it were a corrupt database
            raise CacheCorruptError(
                f"The cache path {self.path} is a folder; pass the path of a database file "
                "(it is created if missing)."
            )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = self._open()
        except (OSError, sqlite3.OperationalError) as exc:
            # cannot create, open or lock the file (read-only folder, locked, I/O error): the file
            # is not known to be corrupt, so it is left as it is
            raise CacheCorruptError(
                f"Cannot open the cache {self.path} ({exc}). Point HYBRIDLLM_CACHE_DIR (or "
                "cache_path) at a writable folder, or turn the cache off (cache=False, HYBRIDLLM_CACHE=0)."
            ) from exc
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, CacheCorruptError):
                raise
            self._conn = self._rebuild(exc)

    # ------------------------------------------------------------------ opening

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(str(self.path), timeout=10.0, check_same_thread=False, isolation_level=None)
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if tables and "cache_meta" not in tables:
                raise _Foreign(
                    f"{self.path} is an SQLite database but not a hybridllm cache (tables: "
                    f"{', '.join(sorted(tables))}); it was left untouched. Pass another path."
                )
            if (row := conn.execute("PRAGMA quick_check").fetchone()) and row[0] != "ok":
                raise sqlite3.DatabaseError(f"integrity check failed: {row[0]}")
            # only now, once the file is known to be ours or new: WAL rewrites the header
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
            with _Transaction(conn, self.path):
                meta = dict(conn.execute("SELECT key, value FROM cache_meta"))
                if not meta:
                    conn.executemany(
                        "INSERT INTO cache_meta VALUES (?, ?)",
                        [
                            ("format", FORMAT),
                            ("version", str(SCHEMA_VERSION)),
                            ("dim", str(self.dim)),
                        ],
                    )
                    meta = {"format": FORMAT, "version": str(SCHEMA_VERSION), "dim": str(self.dim)}
            if meta.get("format") != FORMAT or int(meta.get("version", -1)) > SCHEMA_VERSION:
                raise _Foreign(
                    f"{self.path} was written by another program or a newer hybridllm "
                    f"({meta.get('format')!r} version {meta.get('version')}); left untouched."
                )
            if int(meta.get("dim", self.dim)) != self.dim:
                raise _Foreign(
                    f"{self.path} holds {meta['dim']}-dim embeddings, this cache uses {self.dim}; "
                    "clear it with `hybridllm cache clear` or pass another path."
                )
            return conn
        except BaseException:
            conn.close()
            raise

    def _rebuild(self, exc: Exception) -> sqlite3.Connection:
        stamp = f"{self.path.name}.corrupt-{int(time.time())}"
        aside, n = self.path.with_name(stamp), 1
        while any(Path(str(aside) + s).exists() for s in ("", "-wal", "-shm")):
            aside, n = self.path.with_name(f"{stamp}-{n}"), n + 1  # never over an earlier one
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(self.path) + suffix)
            if src.exists():
                src.replace(Path(str(aside) + suffix))
        warnings.warn(
            f"The cache database {self.path} was corrupt ({exc}); moved it to {aside} and "
            "started an empty cache.",
            RuntimeWarning,
            stacklevel=3,
        )
        try:
            return self._open()
        except sqlite3.DatabaseError as again:  # e.g. the folder is not writable
            raise CacheCorruptError(f"Cannot create the cache at {self.path}: {again}") from again

    def close(self) -> None:
        self._conn.close()

    # ------------------------------------------------------------------ reads

    def data_version(self) -> int:
        """Changes when another connection (another process) commits."""
        return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def iter_entries(self, *, not_before: float | None = None) -> Iterator[Entry]:
        sql = "SELECT * FROM entries"
        args: tuple = ()
        if not_before is not None:
            sql += " WHERE created_at >= ?"
            args = (not_before,)
        for row in self._conn.execute(sql, args):
            yield self._entry(row)

    def get(self, entry_id: str) -> Entry | None:
        row = self._conn.execute("SELECT * FROM entries WHERE id = ?", (entry_id,)).fetchone()
        return self._entry(row) if row else None

    def _entry(self, row: tuple) -> Entry:
        vec = np.frombuffer(row[5], dtype=np.float32)
        if vec.shape != (self.dim,):
            raise CacheCorruptError(f"Cache entry {row[0]} in {self.path} has a bad embedding")
        return Entry(
            id=row[0],
            namespace=row[1],
            bucket=row[2],
            query=row[3],
            response=row[4],
            embedding=vec,
            created_at=row[6],
            last_used=row[7],
            metadata=json.loads(row[8]) if row[8] else None,
        )

    def count(self, namespace: str | None = None) -> int:
        if namespace is None:
            return int(self._conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0])
        sql = "SELECT COUNT(*) FROM entries WHERE namespace = ?"
        return int(self._conn.execute(sql, (namespace,)).fetchone()[0])

    def namespaces(self) -> dict[str, int]:
        sql = "SELECT namespace, COUNT(*) FROM entries GROUP BY namespace ORDER BY namespace"
        return {ns: int(n) for ns, n in self._conn.execute(sql)}

    # ------------------------------------------------------------------ writes

    def upsert(self, entry: Entry) -> None:
        blob = np.ascontiguousarray(entry.embedding, dtype=np.float32).tobytes()
        meta = json.dumps(entry.metadata) if entry.metadata is not None else None
        with self._write():
            self._conn.execute(
                "INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE "
                "SET response = excluded.response, embedding = excluded.embedding, "
                "created_at = excluded.created_at, last_used = excluded.last_used, "
                "metadata = excluded.metadata",
                (
                    entry.id,
                    entry.namespace,
                    entry.bucket,
                    entry.query,
                    entry.response,
                    blob,
                    entry.created_at,
                    entry.last_used,
                    meta,
                ),
            )

    def touch(self, entry_id: str, when: float) -> None:
        with self._write():
            self._conn.execute("UPDATE entries SET last_used = ? WHERE id = ?", (when, entry_id))

    def delete(self, entry_ids: list[str]) -> int:
        if not entry_ids:
            return 0
        with self._write():
            cur = self._conn.executemany("DELETE FROM entries WHERE id = ?", [(i,) for i in entry_ids])
            return cur.rowcount

    def expired_ids(self, before: float) -> list[str]:
        sql = "SELECT id FROM entries WHERE created_at < ?"
        return [r[0] for r in self._conn.execute(sql, (before,))]

    def lru_ids(self, num: int) -> list[str]:
        """The ``num`` least recently used entries, oldest first."""
        sql = "SELECT id FROM entries ORDER BY last_used ASC, created_at ASC LIMIT ?"
        return [r[0] for r in self._conn.execute(sql, (num,))]

    def clear(self, namespace: str | None = None) -> list[str]:
        with self._write():
            if namespace is None:
                ids = [r[0] for r in self._conn.execute("SELECT id FROM entries")]
                self._conn.execute("DELETE FROM entries")
            else:
                sql = "SELECT id FROM entries WHERE namespace = ?"
                ids = [r[0] for r in self._conn.execute(sql, (namespace,))]
                self._conn.execute("DELETE FROM entries WHERE namespace = ?", (namespace,))
        return ids

    def _write(self) -> _Transaction:
        return _Transaction(self._conn, self.path)


class _Foreign(CacheCorruptError, sqlite3.DatabaseError):
    """A valid database that is not ours: raised, never rebuilt over."""


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
