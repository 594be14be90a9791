"""Opening the cache's SQLite file: its schema and format checks, and moving a corrupt file aside."""

from __future__ import annotations

import sqlite3
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from .._exceptions import CacheCorruptError, CacheError
from .._locks import lock_exclusive
from ._pages import table_leaf_rows
from ._store_reads import _StoreReads, row_checksum, sealed, text_or_bytes
from ._store_writes import _Transaction

FORMAT = "hybridllm-semantic-cache"
# 2: each entry holds a checksum of its values (files of version 1 are migrated on open; an older
# hybridllm refuses a version-2 file as newer, so it never writes a row without one)
SCHEMA_VERSION = 2

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
    metadata TEXT,
    checksum BLOB                  -- _store_reads.row_checksum of the row, checked on every read
);
CREATE INDEX IF NOT EXISTS entries_namespace ON entries(namespace);
CREATE INDEX IF NOT EXISTS entries_last_used ON entries(last_used);
CREATE INDEX IF NOT EXISTS entries_created_at ON entries(created_at);
CREATE TABLE IF NOT EXISTS changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, entry_id TEXT NOT NULL);
"""
_COLUMNS = {
    "cache_meta": ["key", "value"],
    "entries": ["id", "namespace", "bucket", "query", "response", "embedding", "created_at",
                "last_used", "metadata", "checksum"],
    "changes": ["seq", "entry_id"],
}
_V1_ENTRIES = _COLUMNS["entries"][:-1]  # schema version 1: no checksum column


class _StoreFile(_StoreReads):
    """How :class:`~.store.CacheStore` opens, checks and rebuilds its file."""

    path: Path
    dim: int
    _want_dim: int | None

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
        conn.text_factory = text_or_bytes  # a damaged text is one damaged row, not an unreadable file
        try:
            # every check that can refuse the file reads only: a file that is not ours is never
            # written (WAL mode rewrites the header, the schema adds tables)
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if tables and "cache_meta" not in tables:
                raise _Foreign(
                    f"{self.path} is an SQLite database but not a hybridllm cache (tables: "
                    f"{', '.join(sorted(tables))}); it was left untouched. Pass another path."
                )
            # integrity_check, not quick_check, which does not compare the indexes with the table:
            # a damaged primary-key index (a flipped bit in a row's rowid there) passed it, and
            # every lookup of that entry raised a bare "database disk image is malformed", at
            # every start. About 25 ms more at 10,000 entries (40 -> 66 ms)
            report = [r[0] for r in conn.execute("PRAGMA integrity_check")]
            if report and report != ["ok"]:
                raise sqlite3.DatabaseError(f"integrity check failed: {_first_problem(report)}")
            meta = self._read_meta(conn) if tables else {}
            if meta:
                self._check_dim(int(meta["dim"]))
            for table in tables & set(_COLUMNS) - {"cache_meta"}:
                found = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
                if table == "entries" and found == _V1_ENTRIES and _version(meta) < 2:
                    continue  # migrated below
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
            self._migrate(conn, meta)
            return conn
        except BaseException:
            conn.close()
            raise

    def _migrate(self, conn: sqlite3.Connection, meta: dict[str, str]) -> None:
        """Bring a version-1 file to this schema in one transaction: add the checksum column and
        fill it for every row (they are read as they are: a row damaged before this cannot be told
        from a good one, as before). A process that died midway left the file as it was; two
        opening it at once migrate it once (the second finds the column there)."""
        columns = [r[1] for r in conn.execute("PRAGMA table_info(entries)")]
        if columns == _COLUMNS["entries"] and _version(meta) >= SCHEMA_VERSION:
            return
        with _Transaction(conn, self.path):
            if [r[1] for r in conn.execute("PRAGMA table_info(entries)")] == _V1_ENTRIES:
                conn.execute("ALTER TABLE entries ADD COLUMN checksum BLOB")
                last = None
                while True:  # in rowid order, a batch at a time: a large cache is not all in memory
                    rows = conn.execute(
                        "SELECT rowid, * FROM entries WHERE rowid > COALESCE(?, -9223372036854775808) "
                        "ORDER BY rowid LIMIT 500", (last,)).fetchall()
                    if not rows:
                        break
                    conn.executemany("UPDATE entries SET checksum = ? WHERE rowid = ?",
                                     [(_checksum_or_none(r[1:10]), r[0]) for r in rows])
                    last = rows[-1][0]
            conn.execute(
                "UPDATE cache_meta SET value = ? WHERE key = 'version' AND CAST(value AS INTEGER) < ?",
                (str(SCHEMA_VERSION), SCHEMA_VERSION),
            )

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
        if _damaged_meta(meta):  # ours, rebuilt like a torn file, not refused as another program's
            raise sqlite3.DatabaseError("its cache_meta holds text that is not UTF-8")
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
        try:
            conn = self._open()
        except sqlite3.DatabaseError as again:  # e.g. the folder is not writable
            warnings.warn(f"The cache database {self.path} was corrupt ({exc}); moved it to {aside}.",
                          RuntimeWarning, stacklevel=5)
            raise CacheCorruptError(f"Cannot create the cache at {self.path}: {again}") from again
        kept = self._salvage(aside, conn)
        warnings.warn(
            f"The cache database {self.path} was corrupt ({exc}); moved it to {aside} and "
            + (f"kept the {kept} entries that could still be read from it." if kept
               else "started an empty cache."),
            RuntimeWarning,
            stacklevel=5,  # the caller of CacheStore(), past the rebuild frames
        )
        return conn

    def _salvage(self, aside: Path, conn: sqlite3.Connection) -> int:
        """Copy the entries still readable from the corrupt file ``aside`` into the new one; the
        count. Before, a damaged page anywhere (an index, one page of answers) lost every entry.
        The table is read from both ends, up to the first damaged page each way; a row read whole
        but holding garbage is dropped on load, as in any file (``_StoreReads._entry``). A row
        with a checksum column is kept only when its checksum matches; one of a version-1 file
        (none) gets one, as a migration gives it."""
        # read only; immutable (no -wal or -shm made beside it) unless its own WAL came along,
        # which holds committed entries too
        immutable = "" if Path(f"{aside}-wal").exists() else "&immutable=1"
        try:
            src = sqlite3.connect(f"{aside.resolve().as_uri()}?mode=ro{immutable}", uri=True)
            # a file cut short (a copy or a disk that filled up) is shorter than its header says,
            # which SQLite calls corrupt before reading any page, so no entry was kept; with
            # writable_schema it reads the pages the file still has (read only: mode=ro)
            src.execute("PRAGMA writable_schema=ON")
            src.text_factory = text_or_bytes  # a text that is not UTF-8 stopped the read there
        except sqlite3.Error:
            return 0
        try:
            try:
                meta: dict | None = dict(src.execute("SELECT key, value FROM cache_meta"))
            except sqlite3.DatabaseError:
                # its one page damaged: the entries are still there, and their vectors' length
                # says which this cache can compare (before, every entry was lost with that page)
                meta = None
            if meta is not None and _damaged_meta(meta):  # a flipped bit there: the same
                meta = None
            if meta is not None and (meta.get("format") != FORMAT or meta.get("dim") != str(self.dim)):
                return 0  # not vectors this cache can compare
            checked = _has_checksums(src)
            if checked is None and meta is not None:  # its schema unreadable: its version says
                checked = meta.get("version") != "1"
            columns = _V1_ENTRIES if checked is False else _COLUMNS["entries"]
            sql = f"SELECT rowid, {', '.join(columns)} FROM entries ORDER BY rowid"
            insert = f"INSERT OR IGNORE INTO entries VALUES ({', '.join('?' * len(_COLUMNS['entries']))})"
            size = 4 * self.dim  # float32

            def comparable(row: tuple) -> bool:
                return meta is not None or (isinstance(row[6], bytes) and len(row[6]) == size)

            rows: dict[int, tuple] = {}  # by rowid
            last = 0
            for row in _readable(src, sql):
                if comparable(row):
                    rows[row[0]] = row[1:]
                last = row[0]
            for row in _readable(src, sql + " DESC"):  # past the first damaged page, from the end
                if row[0] <= last:
                    break
                if comparable(row):
                    rows[row[0]] = row[1:]
            if not _wal_frames(aside):  # see _leaf_rows
                for rowid, row in _leaf_rows(aside, size):
                    rows.setdefault(rowid, row)
            for rowid in list(rows):
                row = rows[rowid]
                if len(row) == len(_V1_ENTRIES) and not checked:  # version 1: nothing to check against
                    rows[rowid] = (*row, _checksum_or_none(row))
                elif not sealed(row):
                    self.report_checksum(row[0])
                    del rows[rowid]
            latest: dict = {}  # one row per id, the last written (a page left over: an older one)
            for rowid in sorted(rows, reverse=True):
                latest.setdefault(rows[rowid][0], rowid)
            with _Transaction(conn, self.path):
                # in the order written: lru_ids breaks ties by rowid
                return sum(conn.execute(insert, rows[r]).rowcount for r in sorted(latest.values()))
        except (sqlite3.Error, CacheError):  # unreadable bookkeeping, or a full disk
            return 0
        finally:
            src.close()


def _version(meta: dict[str, str]) -> int:
    """The schema version ``cache_meta`` names (0 for a file without one yet); checked readable
    by ``_read_meta``."""
    return int(meta.get("version", 0))


def _checksum_or_none(row: tuple) -> bytes | None:
    """The checksum of a version-1 row; None (failing every read) for one with a created_at
    that is no number, which no read can serve either."""
    try:
        return row_checksum(row)
    except (TypeError, ValueError):
        return None


def _first_problem(report: list[str]) -> str:
    """SQLite's integrity report in a few words: its first problem and how many more. The whole
    report (one damaged root page: "Page 4: btreeInitPage() returns error code 11" and 102 lines
    "Page N is never used") made the rebuild's warning a hundred lines long."""
    lines = [line.strip() for text in report for line in str(text).splitlines()]
    problems = [line for line in lines if line and not line.startswith("***")]
    if len(problems) <= 1:
        return problems[0] if problems else "no details"
    return f"{problems[0]} (and {len(problems) - 1} more reported)"  # SQLite stops at 100


_META_KEYS = frozenset({"format", "version", "dim", "hits", "misses", "damaged"})


def _damaged_meta(meta: dict) -> bool:
    """``cache_meta`` as this version writes it, with a key or value that is not UTF-8 (read as
    bytes, see ``text_or_bytes``): a flipped bit in the format made the file read as another
    program's, refused for good, and one in the dimension lost every entry on the rebuild."""
    damaged = any(isinstance(k, bytes) or isinstance(v, bytes) for k, v in meta.items())
    return damaged and {k for k in meta if isinstance(k, str)} <= _META_KEYS


def _wal_frames(db: Path) -> bool:
    """Whether ``db`` has a WAL beside it holding any frame (a page newer than the file's). One
    with none, only its 32-byte header or empty (what a process that has the file open keeps while
    it writes nothing), leaves the file's own pages current."""
    try:
        return Path(f"{db}-wal").stat().st_size > 32
    except OSError:
        return False


def _leaf_rows(aside: Path, embedding_size: int) -> Iterator[tuple[int, tuple]]:
    """(rowid, row) of the entries found on the file's leaf pages, whatever its b-tree pages
    say: with the table's root page damaged, SQL reads no row of it, and every entry was lost
    (300 of 300) though the pages holding them were intact. Not read when a WAL came along: the
    file's pages are then older than the WAL's, and may still hold entries deleted since."""
    try:
        for rowid, types, values in table_leaf_rows(aside):
            if _entry_shaped(types, embedding_size):
                yield rowid, tuple(v if i in (5, 6, 7, 9) or v is None else text_or_bytes(v)
                                   for i, v in enumerate(values))
    except (OSError, ValueError):  # unreadable, or empty (mmap)
        return


def _entry_shaped(types: list[int], embedding_size: int) -> bool:
    """Whether a record's serial types are an entries row's: five texts, an embedding of this
    cache's size, two numbers, a text or NULL, and (schema version 2) a checksum blob or NULL
    (fileformat2, "Record Format")."""
    def text(kind: int) -> bool:
        return kind >= 13 and kind % 2 == 1

    return (len(types) in (len(_V1_ENTRIES), len(_COLUMNS["entries"]))
            and all(text(k) for k in types[:5])
            and types[5] == 12 + 2 * embedding_size and all(1 <= k <= 9 for k in types[6:8])
            and (types[8] == 0 or text(types[8]))
            and (len(types) == len(_V1_ENTRIES) or types[9] == 0 or types[9] == 12 + 2 * 16))


def _has_checksums(src: sqlite3.Connection) -> bool | None:
    """Whether the entries table of a file being salvaged has a checksum column; None when its
    schema cannot be read (no SQL read of it works then; its leaf pages are still read)."""
    try:
        src.execute("SELECT checksum FROM entries LIMIT 0")
        return True
    except sqlite3.OperationalError as exc:
        return False if "no such column" in str(exc) else None
    except sqlite3.DatabaseError:
        return None


def _readable(src: sqlite3.Connection, sql: str) -> Iterator[tuple]:
    """The rows of ``sql`` up to the first one SQLite cannot read."""
    try:
        rows = src.execute(sql)
        while (row := rows.fetchone()) is not None:
            yield row
    except sqlite3.DatabaseError:
        return


class _Foreign(CacheCorruptError, sqlite3.DatabaseError):
    """A valid database that is not ours: raised, never rebuilt over."""
