"""Reading the cache's SQLite file: a row as an :class:`Entry`, the counts, and the change log."""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._types import USER_TEXT, private_repr

_RELOAD_MARK = "*"  # a change-log id that means: reload every entry
# the columns a row's checksum covers: everything a hit serves or is found by; not last_used,
# which each hit rewrites
_SEALED = (0, 1, 2, 3, 4, 5, 6, 8)

log = logging.getLogger("hybridllm.cache")


def row_checksum(row: Sequence) -> bytes:
    """The checksum of an entries row (its first nine columns, in table order): a damaged answer
    that is still valid UTF-8 (a flipped bit, another program's edit) read as any other, and was
    served; SQLite's integrity check does not look inside values. blake2b-128 over the values,
    after a header of each one's kind and length (so no two rows hash the same bytes): ~10 us
    for a 2 kB row, and no chance collision in any cache's lifetime (crc32's 1 in 4e9 is not)."""
    kinds, sizes, parts = bytearray(), [], []
    for i in _SEALED:
        value = row[i]
        if value is None:
            kinds += b"N"
            raw = b""
        elif isinstance(value, str):
            kinds += b"T"
            raw = value.encode("utf-8", "surrogatepass")
        elif isinstance(value, bytes):
            kinds += b"B"
            raw = value
        else:  # created_at: the double SQLite keeps (a whole number may come back as an int)
            kinds += b"R"
            raw = struct.pack("<d", float(value))
        sizes.append(len(raw))
        parts.append(raw)
    head = bytes(kinds) + struct.pack(f"<{len(sizes)}Q", *sizes)
    return hashlib.blake2b(head + b"".join(parts), digest_size=16, person=b"hybridllm-row").digest()


def sealed(row: Sequence) -> bool:
    """Whether ``row`` (the entries table's ten columns) holds the checksum of its values."""
    try:
        return len(row) == 10 and isinstance(row[9], bytes) and row[9] == row_checksum(row)
    except (TypeError, ValueError):  # a created_at that is no number
        return False


def text_or_bytes(raw: bytes) -> str | bytes:
    """A TEXT value as a str, or as its bytes when they are not UTF-8 (the connections'
    ``text_factory``). A flipped bit in a stored question or answer is damage SQLite's integrity
    check does not look at; the default decoder raised ``OperationalError: Could not decode to
    UTF-8`` on the whole query, so one such row made the cache impossible to open. Now such a
    value reaches :meth:`_StoreReads._entry` as bytes, which reads the row as damaged."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def id_of(value: object) -> str:
    """A row's id as a str: an id that is not UTF-8 (damaged) keeps its bytes as lone surrogates,
    which no real id holds, so :meth:`~._store_writes._StoreWrites.delete` can still find it."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


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


class _StoreReads:
    """How :class:`~.store.CacheStore` reads its entries, counts and change log."""

    _conn: sqlite3.Connection
    path: Path
    dim: int
    unreadable: set[str]
    checksum_failures: int
    _reported: set[str]

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
        metadata or text, which SQLite's integrity check does not look at) or whose checksum
        does not match, its id added to ``unreadable`` for the caller to delete. Before, one such
        row raised on every load (a numpy ValueError, or CacheCorruptError), so the cache could
        not be opened at all; and a damaged answer that was still text was served."""
        if not sealed(row):
            self.report_checksum(row[0])
            self.unreadable.add(id_of(row[0]))
            return None
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
            if row[8] is not None and not isinstance(row[8], str):
                raise TypeError("metadata that is not text")
            metadata = json.loads(row[8]) if row[8] else None
            created_at, last_used = float(row[6]), float(row[7])
        except (TypeError, ValueError):
            self.unreadable.add(id_of(row[0]))
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

    def report_checksum(self, raw_id: object) -> None:
        """Say once per row that it failed its checksum, and count it (``checksum_failures``)."""
        entry_id = id_of(raw_id)
        if entry_id in self._reported:  # a file that cannot be written keeps it: said once
            return
        self._reported.add(entry_id)
        self.checksum_failures += 1
        log.warning(
            "Cache entry %s in %s failed its checksum (its question, answer, vector or metadata "
            "changed in the file since it was written: disk damage or another program's edit); "
            "it is not served and is removed.", ascii(entry_id), self.path,
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
        counts: dict[str, int] = {}
        for ns, n in self._conn.execute(sql, args):
            # a damaged name (not UTF-8, see text_or_bytes) is shown with U+FFFD, never raised on
            name = ns.decode("utf-8", "replace") if isinstance(ns, bytes) else ns
            counts[name] = counts.get(name, 0) + int(n)
        return counts

    def damaged_count(self) -> int:
        """The rows found damaged and removed, by every process, since the file was made or last
        cleared (a meta key: files without it read 0, and older versions ignore it)."""
        row = self._conn.execute("SELECT value FROM cache_meta WHERE key = 'damaged'").fetchone()
        try:
            return int(row[0]) if row else 0
        except (TypeError, ValueError):
            return 0

    def lookup_counts(self) -> tuple[int, int]:
        """The hits and misses counted in the file."""
        rows = dict(self._conn.execute("SELECT key, value FROM cache_meta WHERE key IN ('hits', 'misses')"))
        try:
            return int(rows.get("hits", 0)), int(rows.get("misses", 0))
        except ValueError:
            return 0, 0
