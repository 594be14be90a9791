"""The persistent side of the cache: one SQLite database in WAL mode.

Crash safety: every write is one transaction; WAL with ``synchronous=NORMAL`` never loses or
tears a committed transaction when the process dies (kill -9), only possibly the last ones on a
power cut. A half-written transaction is rolled back by SQLite on the next open.

A file that is not a usable SQLite database (garbage, truncated, failing its integrity check) is
moved aside to ``<name>.corrupt-<time>`` and a fresh cache is created with a warning: the cache
only holds answers that can be generated again, and a rebuild cannot loop because the new file
is valid; so is a hybridllm cache whose tables do not have the columns this version reads. A
valid SQLite database that is not a hybridllm cache (no ``cache_meta`` table, or a newer schema)
is never touched: opening it raises :class:`CacheCorruptError`.

Sharing one file between processes. Every write that adds, replaces or removes entries also appends
their ids to the ``changes`` log in the same transaction, so another process catches up by reading
the rows named since the last sequence number it saw, instead of reloading every entry (which took
about 0.2 s per lookup at 10,000 entries when two processes served hits from one file: each hit's
recency write made the other reload). Recency writes (a hit) change no entry and are not logged.
The log keeps the last ``_KEEP_CHANGES`` ids; a reader further behind, or a bulk change (clear),
reloads everything. The table is an addition to schema version 1: an older hybridllm that opens the
file ignores it (its writes are then seen by newer readers only at their next start; a stale view
only costs misses, since a hit re-reads its entry).
"""

from __future__ import annotations

import json
import sqlite3
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._exceptions import CacheCorruptError, CacheError
from .._locks import lock_exclusive
from .._types import USER_TEXT, private_repr

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
CREATE TABLE IF NOT EXISTS changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, entry_id TEXT NOT NULL);
"""
_COLUMNS = {
    "cache_meta": ["key", "value"],
    "entries": ["id", "namespace", "bucket", "query", "response", "embedding", "created_at",
                "last_used", "metadata"],
    "changes": ["seq", "entry_id"],
}
_KEEP_CHANGES = 10000  # ids kept in the change log
_RELOAD_MARK = "*"  # a change-log id that means: reload every entry
_MAX_LOGGED = 1000  # a change of more entries is logged as one reload mark


@dataclass(frozen=True)
class Entry:
    """One stored answer; its repr shows the question's and answer's sizes, not their text."""

    id: str
    namespace: str
    bucket: str
    query: str = field(metadata=USER_TEXT)
    response: str = field(metadata=USER_TEXT)
    embedding: np.ndarray = field(repr=False)
    created_at: float
    last_used: float
    metadata: dict | None

    __repr__ = private_repr


class CacheStore:
    """SQLite rows of cached answers. Not thread-safe by itself: the caller holds a lock."""

    def __init__(self, path: str | Path, *, dim: int | None) -> None:
        """``dim`` None: the dimension the file holds (384 for a new file), for tools that read
        or clear a cache without embedding anything."""
        self.path = Path(path)
        self._want_dim = dim
        self.dim = dim if dim is not None else 384
        self.last_logged = (0, 0)  # the first and last change numbers of our latest logged write
        self.unreadable: set[str] = set()  # ids of rows found damaged by a read, to be deleted
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
            self._conn = self._rebuild_or_fail(exc)

    def _rebuild_or_fail(self, exc: Exception) -> sqlite3.Connection:
        try:
            return self._rebuild(exc)
        except (OSError, sqlite3.OperationalError) as failed:
            raise CacheCorruptError(
                f"The cache {self.path} is corrupt ({exc}) and cannot be rebuilt ({failed}). Move "
                "it away, point HYBRIDLLM_CACHE_DIR (or cache_path) at a writable folder, or turn "
                "the cache off (cache=False, HYBRIDLLM_CACHE=0)."
            ) from failed

    # ------------------------------------------------------------------ opening

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(str(self.path), timeout=10.0, check_same_thread=False, isolation_level=None)
        try:
            # every check that can refuse the file reads only: a file that is not ours is never
            # written (WAL mode rewrites the header, the schema adds tables)
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if tables and "cache_meta" not in tables:
                raise _Foreign(
                    f"{self.path} is an SQLite database but not a hybridllm cache (tables: "
                    f"{', '.join(sorted(tables))}); it was left untouched. Pass another path."
                )
            if (row := conn.execute("PRAGMA quick_check").fetchone()) and row[0] != "ok":
                raise sqlite3.DatabaseError(f"integrity check failed: {row[0]}")
            meta = self._read_meta(conn) if tables else {}
            if meta:
                self._check_dim(int(meta["dim"]))
            for table in tables & set(_COLUMNS) - {"cache_meta"}:
                found = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
                if found != _COLUMNS[table]:  # ours, in a shape this version cannot read
                    raise sqlite3.DatabaseError(
                        f"its {table} table has the columns {found}, this version reads {_COLUMNS[table]}"
                    )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            # deleted questions and answers are overwritten with zeros, not left readable in free
            # pages and free space (only some SQLite builds do so by default)
            conn.execute("PRAGMA secure_delete=ON")
            conn.executescript(f"BEGIN IMMEDIATE;\n{_SCHEMA}\nCOMMIT;")  # one commit: a small WAL
            if not meta:  # a new file (or one cut off before its first commit ended)
                with _Transaction(conn, self.path):
                    meta = self._read_meta(conn)
                    if not meta:  # not written by another process meanwhile
                        meta = {"format": FORMAT, "version": str(SCHEMA_VERSION), "dim": str(self.dim)}
                        conn.executemany("INSERT INTO cache_meta VALUES (?, ?)", list(meta.items()))
                self._check_dim(int(meta["dim"]))
            return conn
        except BaseException:
            conn.close()
            raise

    def _check_dim(self, dim: int) -> None:
        if self._want_dim is None:
            self.dim = dim
        elif dim != self.dim:
            raise _Foreign(
                f"{self.path} holds {dim}-dim embeddings, this cache uses {self.dim} (another "
                "embedder); it was left untouched. Pass another path, or empty the file with "
                f"`hybridllm cache clear --path {self.path}`."
            )

    def _read_meta(self, conn: sqlite3.Connection) -> dict[str, str]:
        """``cache_meta`` as a dict, once it is known to be a hybridllm cache this version reads."""
        columns = [r[1] for r in conn.execute("PRAGMA table_info(cache_meta)")]
        if columns != _COLUMNS["cache_meta"]:
            raise _Foreign(
                f"{self.path} is an SQLite database but not a hybridllm cache (its cache_meta table "
                f"has the columns {columns}); it was left untouched. Pass another path."
            )
        meta = dict(conn.execute("SELECT key, value FROM cache_meta"))
        if not meta:
            return meta
        if meta.get("format") != FORMAT:
            raise _Foreign(
                f"{self.path} was written by another program (format {meta.get('format')!r}); it "
                "was left untouched. Pass another path."
            )
        try:
            version = int(meta.get("version", ""))
        except ValueError:  # ours, but its own bookkeeping is garbage: rebuilt like a torn file
            raise sqlite3.DatabaseError(f"its cache_meta holds {meta}") from None
        # the version first: a newer schema may keep its bookkeeping (the dim) otherwise, and
        # must be refused, not moved aside as corrupt
        if version > SCHEMA_VERSION:
            raise _Foreign(
                f"{self.path} was written by a newer hybridllm (schema version {version}, this one "
                f"reads {SCHEMA_VERSION}); it was left untouched. Upgrade, or pass another path."
            )
        try:
            int(meta.get("dim", ""))
        except ValueError:
            raise sqlite3.DatabaseError(f"its cache_meta holds {meta}") from None
        return meta

    def _rebuild(self, exc: Exception) -> sqlite3.Connection:
        """Move the corrupt file aside and start an empty one, one process at a time: several
        processes opening one corrupt file at once each found it corrupt, and each one after the
        first moved aside the fresh file the others had made (and were writing, through their
        open connections, to a file renamed ``.corrupt-*``): the processes no longer shared one
        cache, and what each wrote was lost to the others."""
        with open(f"{self.path}.rebuild-lock", "a+b") as lock:
            lock_exclusive(lock.fileno())
            try:  # rebuilt by another process while this one waited or before it looked again
                return self._open()
            except sqlite3.OperationalError:
                raise  # busy or unreadable, not corrupt: said as such by the caller
            except sqlite3.DatabaseError as again:
                if isinstance(again, CacheCorruptError):
                    raise
            return self._move_aside_and_open(exc)

    def _move_aside_and_open(self, exc: Exception) -> sqlite3.Connection:
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
            stacklevel=5,  # the caller of CacheStore(), past the rebuild frames
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

    def last_change(self) -> int:
        """The sequence number of the latest logged change (0 when none)."""
        return int(self._conn.execute("SELECT COALESCE(MAX(seq), 0) FROM changes").fetchone()[0])

    def changes_since(self, seq: int) -> tuple[list[str] | None, int]:
        """(ids of entries added, replaced or removed after change ``seq``, the latest change's
        number); the ids are None when the log cannot tell (trimmed past ``seq``, or a bulk
        change): then reload every entry."""
        rows = self._conn.execute(
            "SELECT seq, entry_id FROM changes WHERE seq >= ? ORDER BY seq", (max(seq, 1),)
        ).fetchall()
        if not rows:
            latest = self.last_change()
            return ([], seq) if latest == seq else (None, latest)
        latest = int(rows[-1][0])
        # the log must still hold change ``seq`` (the first, 1, when ``seq`` is 0): the changes
        # right after it may have been trimmed otherwise
        if int(rows[0][0]) != max(seq, 1):
            return None, latest
        ids = list(dict.fromkeys(r[1] for r in rows if r[0] > seq))
        return (None if _RELOAD_MARK in ids else ids), latest

    def get_many(self, entry_ids: list[str]) -> list[Entry]:
        out: list[Entry] = []
        for start in range(0, len(entry_ids), 500):  # under SQLite's limit of bound variables
            chunk = entry_ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows = self._conn.execute(f"SELECT * FROM entries WHERE id IN ({marks})", chunk)
            out.extend(e for r in rows if (e := self._entry(r)) is not None)
        return out

    def iter_entries(self, *, not_before: float | None = None) -> Iterator[Entry]:
        sql = "SELECT * FROM entries"
        args: tuple = ()
        if not_before is not None:
            sql += " WHERE created_at >= ?"
            args = (not_before,)
        for row in self._conn.execute(sql, args):
            if (entry := self._entry(row)) is not None:
                yield entry

    def get(self, entry_id: str) -> Entry | None:
        """The entry, or None when there is none or it cannot be read (see :meth:`_entry`)."""
        row = self._conn.execute("SELECT * FROM entries WHERE id = ?", (entry_id,)).fetchone()
        return self._entry(row) if row else None

    def _entry(self, row: tuple) -> Entry | None:
        """The entry of ``row``; None for a row this version cannot read (a damaged embedding,
        metadata or text, which SQLite's integrity check does not look at), its id added to
        ``unreadable`` for the caller to delete. Before, one such row raised on every load
        (a numpy ValueError, or CacheCorruptError), so the cache could not be opened at all."""
        try:
            if not all(isinstance(row[i], str) for i in (0, 1, 2, 3, 4)):
                raise TypeError("text columns that are not text")
            vec = np.frombuffer(row[5], dtype=np.float32)  # ValueError: a size not 4 x n
            if vec.shape != (self.dim,):
                raise ValueError(f"a {vec.size}-float embedding")
            # the index reads dot products as cosines: a NaN or zero vector is damaged, and one of
            # another length (a flipped exponent bit, or a row written before vectors were
            # normalized) is normalized, else its "cosine" (7 for a length-7 vector) passed
            # min_similarity for unrelated questions
            norm = float(np.linalg.norm(vec))
            if not np.isfinite(norm) or norm == 0.0:
                raise ValueError("an embedding that is not a finite, non-zero vector")
            if abs(norm - 1.0) > 1e-3:
                vec = vec / np.float32(norm)
            metadata = json.loads(row[8]) if row[8] else None
            created_at, last_used = float(row[6]), float(row[7])
        except (TypeError, ValueError):
            self.unreadable.add(str(row[0]))
            return None
        return Entry(
            id=row[0],
            namespace=row[1],
            bucket=row[2],
            query=row[3],
            response=row[4],
            embedding=vec,
            created_at=created_at,
            last_used=last_used,
            metadata=metadata,
        )

    def count(self, namespace: str | None = None) -> int:
        if namespace is None:
            return int(self._conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0])
        sql = "SELECT COUNT(*) FROM entries WHERE namespace = ?"
        return int(self._conn.execute(sql, (namespace,)).fetchone()[0])

    def namespaces(self, *, not_before: float | None = None) -> dict[str, int]:
        """Entries per namespace (written at or after ``not_before`` only, when given)."""
        where, args = ("WHERE created_at >= ?", (not_before,)) if not_before is not None else ("", ())
        sql = f"SELECT namespace, COUNT(*) FROM entries {where} GROUP BY namespace ORDER BY namespace"
        return {ns: int(n) for ns, n in self._conn.execute(sql, args)}

    def lookup_counts(self) -> tuple[int, int]:
        """The hits and misses counted in the file."""
        rows = dict(self._conn.execute("SELECT key, value FROM cache_meta WHERE key IN ('hits', 'misses')"))
        try:
            return int(rows.get("hits", 0)), int(rows.get("misses", 0))
        except ValueError:
            return 0, 0

    # ------------------------------------------------------------------ writes

    def upsert(self, entry: Entry, *, counts: tuple[int, int] = (0, 0)) -> None:
        """Insert or replace (and add ``counts``, hits and misses, to the file's)."""
        blob = np.ascontiguousarray(entry.embedding, dtype=np.float32).tobytes()
        meta = json.dumps(entry.metadata) if entry.metadata is not None else None
        with self._write():
            # REPLACE (delete, then insert), not an update in place: the row gets the largest
            # rowid, which orders writes within one clock tick for :meth:`lru_ids`
            self._conn.execute(
                "INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
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

    def _add_counts(self, hits: int, misses: int) -> None:
        for key, n in (("hits", hits), ("misses", misses)):
            if n:
                self._conn.execute(
                    "INSERT INTO cache_meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE "
                    "SET value = CAST(value AS INTEGER) + excluded.value",
                    (key, n),
                )

    def delete(self, entry_ids: list[str]) -> int:
        if not entry_ids:
            return 0
        with self._write():
            cur = self._conn.executemany("DELETE FROM entries WHERE id = ?", [(i,) for i in entry_ids])
            self._log(entry_ids)
            return cur.rowcount

    def expired_ids(self, before: float) -> list[str]:
        sql = "SELECT id FROM entries WHERE created_at < ?"
        return [r[0] for r in self._conn.execute(sql, (before,))]

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
        ids = [r[0] for r in self._conn.execute(sql, (num,))]
        if len(ids) < num:  # every row asked for: the latest write comes last
            ids += [r[0] for r in self._conn.execute("SELECT id FROM entries ORDER BY rowid DESC LIMIT 1")]
        return ids

    def clear(self, namespace: str | None = None) -> list[str]:
        with self._write():
            if namespace is None:
                ids = [r[0] for r in self._conn.execute("SELECT id FROM entries")]
                self._conn.execute("DELETE FROM entries")
                self._conn.execute("DELETE FROM cache_meta WHERE key IN ('hits', 'misses')")
            else:
                sql = "SELECT id FROM entries WHERE namespace = ?"
                ids = [r[0] for r in self._conn.execute(sql, (namespace,))]
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
