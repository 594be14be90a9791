"""The semantic cache's in-memory index kept in step with its file: others' changes, expiry, eviction."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from .._exceptions import CacheError
from .index import BucketIndex
from .store import CacheStore, Entry

_PURGE_EVERY_S = 60.0


@dataclass(slots=True)
class _Known:
    """What the index side keeps of an entry (its answer stays in the file)."""

    bucket: str
    query: str
    created_at: float
    # whether the embedder reads the question whole: asked on the entry's first lookup as a
    # candidate, then kept (None until then); a replaced or re-read entry is a new _Known
    fits: bool | None = None


class _Mirror:
    """The index and known entries of a :class:`~.semantic.SemanticCache`, mirroring its file."""

    path: Path
    ttl_s: float | None
    max_entries: int
    _store: CacheStore
    _index: BucketIndex
    _entries: dict[str, _Known]
    _closed: bool
    _last_purge: float
    _seq: int
    _seen_version: int

    def _seen(self) -> None:
        """After our own write: when its changes directly follow the last one we reflect, no
        other process wrote in between, and the log need not be read back (else it is, later)."""
        first, last = self._store.last_logged
        if first == self._seq + 1:
            self._seq = last

    def _alive(self, entry_id: str) -> bool:
        if self.ttl_s is None:
            return True
        return self._entries[entry_id].created_at >= time.time() - self.ttl_s

    def _forget(self, ids: list[str]) -> None:
        for eid in ids:
            self._index.remove(eid)
            self._entries.pop(eid, None)

    def _enforce_bounds(self, now: float) -> None:
        if self.ttl_s is not None and now - self._last_purge >= _PURGE_EVERY_S:
            self._purge_expired(now, self.ttl_s)
        excess = self._store.count() - self.max_entries  # the file's, other processes' entries too
        if excess > 0 and self.ttl_s is not None and self._last_purge != now:
            # expired entries go before live ones: an entry hit just before it expired has a
            # later last_used than a live one never hit since, and LRU alone would evict the
            # live one and keep the dead one
            self._purge_expired(now, self.ttl_s)
            excess = self._store.count() - self.max_entries
        if excess > 0:
            victims = self._store.lru_ids(excess)
            self._store.delete(victims)
            self._seen()
            self._forget(victims)

    def _purge_expired(self, now: float, ttl_s: float) -> None:
        expired = self._store.expired_ids(now - ttl_s)
        self._store.delete(expired)
        self._seen()
        self._forget(expired)
        self._last_purge = now

    def _reload(self) -> None:
        self._seen_version = self._store.data_version()
        self._seq = self._store.last_change()  # before the entries: a change in between is re-read
        self._index.clear()
        self._entries = {}
        not_before = time.time() - self.ttl_s if self.ttl_s is not None else None
        for entry in self._store.iter_entries(not_before=not_before):
            self._add(entry)
        self._drop_unreadable()

    def _drop_unreadable(self) -> None:
        """Delete the rows the store could not read (damaged in the file): the other entries
        stay served. Said in a warning, with a count and no text; a file that cannot be written
        keeps them, skipped on every load."""
        bad = sorted(self._store.unreadable)
        if not bad:
            return
        self._store.unreadable.clear()
        self._forget(bad)
        try:
            self._store.delete(bad, damaged=True)
        except CacheError:
            return
        self._seen()
        warnings.warn(
            f"Removed {len(bad)} damaged entries from the cache {self.path}; the other entries are kept.",
            RuntimeWarning,
            stacklevel=2,
        )

    def _add(self, entry: Entry) -> None:
        self._index.add(entry.bucket, entry.id, entry.embedding)
        self._entries[entry.id] = _Known(entry.bucket, entry.query, entry.created_at)

    def _check_open(self) -> None:
        """Every call that reads the file starts here (through _sync or _serve): before, a closed
        cache raised sqlite3.ProgrammingError."""
        if self._closed:
            raise CacheError(f"The cache {self.path} is closed; open a new SemanticCache.")

    def _sync(self) -> None:
        """Catch up with what other processes committed since we last looked: the entries their
        writes named in the store's change log (everything, when the log cannot tell)."""
        self._check_open()
        if self._store.replaced():  # moved aside as corrupt by another process: its successor
            self._store.reopen()
            self._reload()
            return
        version = self._store.data_version()
        if version == self._seen_version:
            return
        self._seen_version = version
        ids, latest = self._store.changes_since(self._seq)
        if ids is None:
            self._reload()
            return
        self._seq = latest
        if not ids:  # only recency or counts were written
            return
        self._forget(ids)
        not_before = time.time() - self.ttl_s if self.ttl_s is not None else None
        for entry in self._store.get_many(ids):
            if not_before is None or entry.created_at >= not_before:
                self._add(entry)
        self._drop_unreadable()
