"""The semantic cache's writes: put, delete and clear, each reflected in the in-memory index."""

from __future__ import annotations

import json
import logging
import threading
import time

import numpy as np

from .._exceptions import CacheError, InvalidRequestError
from .._message_text import check_namespace
from ..prompts import valid_text
from ._candidates import _Candidates
from ._keys import bucket_key, entry_id_for, split_messages
from ._mirror import _Known
from .store import Entry

log = logging.getLogger("hybridllm.cache")


class _Writes(_Candidates):
    """What a :class:`~.semantic.SemanticCache` writes to its file, and the settings it checks."""

    namespace: str
    store_pii: bool
    _lock: threading.RLock
    _unsaved: list[int]

    def put(
        self,
        messages: list[dict],
        text: str,
        *,
        model: str,
        params_key: dict,
        namespace: str | None = None,
        pii: bool = False,
        metadata: dict | None = None,
        embedding: np.ndarray | None = None,
    ) -> str | None:
        """Cache ``text`` as the answer; returns the entry id, or None when not stored (PII, an
        empty question, or an empty answer)."""
        if not isinstance(text, str):
            raise InvalidRequestError(f"the answer to cache must be a string, got {type(text).__name__}")
        ns = self._namespace(namespace)
        context, query = split_messages(messages)
        # an empty or blank answer is not stored, as HybridLLM stores none: before, a direct
        # put("") was served as a hit for the question (and its paraphrases) until it expired
        if (pii and not self.store_pii) or not query.strip() or not text.strip():
            return None
        bucket = bucket_key(ns, model, params_key, context)
        entry_id = entry_id_for(bucket, query)
        vec = self._vector(query, embedding)
        try:
            json.dumps(metadata)
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(f"metadata must be JSON-serializable: {exc}") from exc
        now = time.time()
        # an answer holding half an emoji (a stream cut between the two halves of a surrogate
        # pair) cannot be stored as UTF-8: U+FFFD in its place, as a decoder would write
        entry = Entry(entry_id, ns, bucket, query, valid_text(text), vec, now, now, metadata)
        with self._lock:
            self._sync()
            self._store.upsert(entry, counts=self._take_counts())
            self._seen()
            self._index.add(bucket, entry_id, vec)
            self._entries[entry_id] = _Known(bucket, query, now)
            # the entry is committed: a failed eviction (a full disk) must not raise as if it were
            # not (before, put raised and the answer was served anyway); the file stays over
            # max_entries until a later write evicts
            try:
                self._enforce_bounds(now)
            except CacheError as exc:
                log.warning("Stored the answer, but evicting old entries from the cache failed: %s", exc)
        return entry_id

    def delete(self, entry_id: str) -> bool:
        if not isinstance(entry_id, str):  # before: a CacheError "Writing the cache failed: ..."
            raise InvalidRequestError(f"entry_id must be a string, got {type(entry_id).__name__}")
        with self._lock:
            self._sync()
            removed = self._store.delete([entry_id]) > 0
            self._seen()
            self._forget([entry_id])
            return removed

    def clear(self, namespace: str | None = None) -> int:
        """Delete every entry of ``namespace`` (all namespaces, and the file's hit and miss
        counts, when None); returns the count."""
        if namespace is not None:
            namespace = self._namespace(namespace)
        with self._lock:
            self._sync()
            ids = self._store.clear(namespace)
            self._seen()
            self._forget(ids)
            if namespace is None:
                self._unsaved = [0, 0]
            return len(ids)

    def _namespace(self, namespace: str | None) -> str:
        if namespace is None:
            return self.namespace
        # half an emoji ("\ud83d") raised a bare UnicodeEncodeError from put and clear
        return check_namespace(namespace, InvalidRequestError)

    def _take_counts(self) -> tuple[int, int]:
        """The unsaved hit and miss counts, handed to a write that adds them to the file. They
        are taken before the write: a write that fails loses them, which only statistics notice."""
        counts = (self._unsaved[0], self._unsaved[1])
        self._unsaved = [0, 0]
        return counts
