"""Reading the cache's SQLite file: a row as an :class:`Entry`, the counts, and the change log."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from .._types import USER_TEXT, private_repr

_RELOAD_MARK = "*"  # a change-log id that means: reload every entry


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
    dim: int
    unreadable: set[str]

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

    def lookup_counts(self) -> tuple[int, int]:
        """The hits and misses counted in the file."""
        rows = dict(self._conn.execute("SELECT key, value FROM cache_meta WHERE key IN ('hits', 'misses')"))
        try:
            return int(rows.get("hits", 0)), int(rows.get("misses", 0))
        except ValueError:
            return 0, 0
