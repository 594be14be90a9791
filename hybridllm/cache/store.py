"""The persistent side of the cache: one SQLite database in WAL mode.

Crash safety: every write is one transaction; WAL with ``synchronous=NORMAL`` never loses or
tears a committed transaction when the process dies (kill -9), only possibly the last ones on a
power cut. A half-written transaction is rolled back by SQLite on the next open.

A file that is not a usable SQLite database (garbage, truncated, failing its integrity check) is
moved aside to ``<name>.corrupt-<time>`` and a fresh cache is created with a warning, holding the
entries still readable from the old one (its table read from both ends up to the first damaged
page each way, or to the end of a file cut short, and the rows on its leaf pages read without
SQLite, see ``_pages``; a table lacking a column this version reads gives none): the cache only holds
answers that can be generated again, and a rebuild cannot loop because the new file is valid; so
is a hybridllm cache whose tables do not have the columns this version reads. A
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

Checksums (schema version 2). Each row holds ``row_checksum`` of every value a hit serves or is
found by; every read that indexes or serves a row checks it, and a row that fails is a miss,
deleted, logged once and counted (``checksum_failures``). A version-1 file is migrated on open, in
one transaction; an older hybridllm refuses a version-2 file, so no row is written without one.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from .._exceptions import CacheCorruptError
from .._locks import lock_exclusive
from ._store_file import _StoreFile
from ._store_reads import Entry  # noqa: F401 - a public name of this module (_mirror, _writes, tests)
from ._store_writes import _StoreWrites


class CacheStore(_StoreFile, _StoreWrites):
    """SQLite rows of cached answers. Not thread-safe by itself: the caller holds a lock."""

    def __init__(self, path: str | Path, *, dim: int | None) -> None:
        """``dim`` None: the dimension the file holds (384 for a new file), for tools that read
        or clear a cache without embedding anything."""
        self.path = Path(path)
        self._want_dim = dim
        self.dim = dim if dim is not None else 384
        self.last_logged = (0, 0)  # the first and last change numbers of our latest logged write
        self.unreadable: set[str] = set()  # ids of rows found damaged by a read, to be deleted
        self.checksum_failures = 0  # rows found failing their checksum (each said once in the log)
        self._reported: set[str] = set()
        if self.path.is_dir():  # never moved aside as if it were a corrupt database
            raise CacheCorruptError(
                f"The cache path {self.path} is a folder; pass the path of a database file "
                "(it is created if missing)."
            )
        self._conn = self._connect()
        self._identity = _identity(self.path)

    def replaced(self) -> bool:
        """Whether the file at ``path`` is no longer the one open: another process found it
        corrupt, moved it aside and started a new one (or it was deleted). The reader then
        reopens (``reopen``): before, it went on reading and writing the moved-aside file, so
        what it stored was lost to every other process, and to itself at its next start."""
        return _identity(self.path) != self._identity

    def reopen(self) -> None:
        """Open the file now at ``path`` (creating it if it was deleted) in place of the old one."""
        # a rebuild under way (files being moved aside one by one, entries salvaged) holds this
        # lock: waited out, so the new file is never opened beside the old one's WAL. Released
        # before opening, which may rebuild, taking it again (flock does not nest in a process)
        try:
            with open(f"{self.path}.rebuild-lock", "a+b") as lock:
                lock_exclusive(lock.fileno())
        except OSError:  # a folder that cannot be written: no rebuild can be under way in it
            pass
        old = self._conn
        self._conn = self._connect()
        self._identity = _identity(self.path)
        self.last_logged = (0, 0)
        self.unreadable.clear()
        old.close()

    def _connect(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return self._open()
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
            return self._rebuild_or_fail(exc)

    def close(self) -> None:
        self._conn.close()


def _identity(path: Path) -> tuple[int, int] | None:
    """The file at ``path`` (device, inode), None when there is none: one stat, ~2 us."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
