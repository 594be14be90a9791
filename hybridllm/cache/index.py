"""Cosine search over unit vectors in numpy, one flat matrix per cache bucket.

A device holds thousands to a hundred thousand cached answers, and every lookup is confined to
one bucket (namespace + model + settings + conversation context). Up to ``exact_limit`` vectors
(20,000) a bucket is searched exactly: one matrix-vector product over a contiguous ``[n, dim]``
float32 matrix. Past that the product is memory-bound (100k x 384 floats is 154 MB per query,
measured about 10 ms on 2 cores in ``bench/cache.py``), so the bucket switches to two stages: a
product with vectors projected on their top ``reduced_dim`` (64) principal directions (6x fewer
bytes), then the exact cosine of the best ``num_candidates`` (256) rows. Cosines returned are
always exact; only a row missed by the first stage could be lost.

Removal swaps the last row into the hole so rows stay contiguous. Not thread-safe by itself:
:class:`SemanticCache` holds the lock.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np


def _matvec(matrix: np.ndarray, vec: np.ndarray) -> np.ndarray:
    """``matrix @ vec`` on one thread. A memory-bound product gains little from BLAS threads,
    and on a busy device their spin-waits cost more (measured on 2 loaded cores: BLAS 16 ms,
    einsum 0.7 ms at 10k x 384), with no process-wide thread setting to change."""
    return np.einsum("nd,d->n", matrix, vec)


def _row(vec: np.ndarray, dim: int) -> np.ndarray:
    """``vec`` as a float32 row of ``dim``, or ValueError. Checked before anything changes: a
    wrong-length vector raised after its id was recorded (a phantom entry over an uninitialized
    row), a scalar filled the row, and one NaN or infinite vector (float64 1e40 is inf in float32)
    made every cosine of the bucket NaN once its projection was built from it."""
    with np.errstate(over="ignore"):  # a float64 too large for float32: inf, refused below
        row = np.asarray(vec, dtype=np.float32)
    if row.shape != (dim,):
        raise ValueError(f"the index holds vectors of shape ({dim},), got {row.shape}")
    if not np.isfinite(row).all():
        raise ValueError("the index holds finite vectors, got NaN or infinite values")
    return row


class FlatIndex:
    """Vectors with string ids; ``search`` returns the ``k`` most similar."""

    def __init__(
        self,
        dim: int,
        *,
        capacity: int = 64,
        exact_limit: int = 20000,
        reduced_dim: int = 64,
        num_candidates: int = 256,
    ) -> None:
        self.dim = dim
        self.exact_limit = exact_limit
        self.reduced_dim = min(reduced_dim, dim)
        self.num_candidates = num_candidates
        self._vecs = np.empty((max(capacity, 1), dim), dtype=np.float32)  # [capacity, dim]
        self._proj: np.ndarray | None = None  # [dim, reduced_dim] once past exact_limit
        self._low = np.empty((0, self.reduced_dim), dtype=np.float32)  # [capacity, reduced_dim]
        self._ids: list[str] = []
        self._row: dict[str, int] = {}

    @property
    def is_exact(self) -> bool:
        return self._proj is None

    def _build_projection(self) -> None:
        """Top principal directions of the (uncentered) vectors: they preserve inner products."""
        n = len(self._ids)
        sample = self._vecs[: min(n, 50000)]
        _, eigvecs = np.linalg.eigh(sample.T @ sample)  # ascending eigenvalues
        self._proj = np.ascontiguousarray(eigvecs[:, ::-1][:, : self.reduced_dim], np.float32)
        self._low = np.empty((len(self._vecs), self.reduced_dim), dtype=np.float32)
        self._low[:n] = self._vecs[:n] @ self._proj

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, entry_id: str) -> bool:
        return entry_id in self._row

    def add(self, entry_id: str, vec: np.ndarray) -> None:
        """Insert or replace the vector of ``entry_id``."""
        vec = _row(vec, self.dim)
        row = self._row.get(entry_id)
        if row is None:
            row = len(self._ids)
            if row == len(self._vecs):
                self._resize(2 * len(self._vecs))
            self._ids.append(entry_id)
            self._row[entry_id] = row
        self._vecs[row] = vec
        if self._proj is not None:
            self._low[row] = self._vecs[row] @ self._proj
        elif len(self._ids) > self.exact_limit:
            self._build_projection()

    def _resize(self, capacity: int) -> None:
        """Move the rows into arrays of ``capacity`` rows (at least as many as are held)."""
        n = len(self._ids)
        vecs = np.empty((capacity, self.dim), dtype=np.float32)
        vecs[:n] = self._vecs[:n]
        self._vecs = vecs
        if self._proj is not None:
            low = np.empty((capacity, self.reduced_dim), dtype=np.float32)
            low[:n] = self._low[:n]
            self._low = low

    def remove(self, entry_id: str) -> bool:
        row = self._row.pop(entry_id, None)
        if row is None:
            return False
        last = len(self._ids) - 1
        if row != last:  # move the last row into the hole
            moved = self._ids[last]
            self._vecs[row] = self._vecs[last]
            if self._proj is not None:
                self._low[row] = self._low[last]
            self._ids[row] = moved
            self._row[moved] = row
        self._ids.pop()
        # halved once a quarter full: eviction or expiry of most of a bucket gives its memory
        # back (before, 100k rows stayed reserved, 154 MB, for the few left), and a bucket
        # swinging around one size is not copied on every add and remove (amortized O(1))
        if len(self._ids) < len(self._vecs) // 4:
            self._resize(len(self._vecs) // 2)
        return True

    def vector(self, entry_id: str) -> np.ndarray:
        return self._vecs[self._row[entry_id]].copy()

    def search(self, query: np.ndarray, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` ids with the highest cosine to ``query`` (a unit vector), best first."""
        n = len(self._ids)
        if n == 0 or k < 1:
            return []
        query = np.asarray(query, dtype=np.float32)
        if query.shape != (self.dim,):  # before: numpy's broadcast error
            raise ValueError(f"the index holds vectors of shape ({self.dim},), got a query of {query.shape}")
        # at least k candidates: with num_candidates, a k of 1000 on a bucket past exact_limit
        # returned 256 ids
        candidates = max(self.num_candidates, k)
        if self._proj is None or n <= candidates:
            rows = np.arange(n)
            sims = _matvec(self._vecs[:n], query)  # [n]
        else:
            approx = _matvec(self._low[:n], query @ self._proj)  # [n], first stage
            rows = np.argpartition(-approx, candidates - 1)[:candidates]
            sims = _matvec(self._vecs[rows], query)  # [num_candidates], exact
        if len(rows) > k:
            best = np.argpartition(-sims, k - 1)[:k]
        else:
            best = np.arange(len(rows))
        best = best[np.argsort(-sims[best])]
        return [(self._ids[rows[i]], float(sims[i])) for i in best]


class BucketIndex:
    """One :class:`FlatIndex` per bucket key; empty buckets are dropped."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._buckets: dict[Hashable, FlatIndex] = {}
        self._bucket_of: dict[str, Hashable] = {}

    def __len__(self) -> int:
        return len(self._bucket_of)

    def add(self, bucket: Hashable, entry_id: str, vec: np.ndarray) -> None:
        # checked first: a bad vector raised after the entry left its old bucket (lost) or
        # after an empty bucket was made (kept forever)
        vec = _row(vec, self.dim)
        old = self._bucket_of.get(entry_id)
        if old is not None and old != bucket:
            self.remove(entry_id)
        index = self._buckets.get(bucket)
        if index is None:
            # room for one row, doubled as it grows: most buckets hold one entry (each turn of a
            # conversation is its own bucket), and 64 rows each took 98 KB per 1.5 KB vector
            index = self._buckets[bucket] = FlatIndex(self.dim, capacity=1)
        index.add(entry_id, vec)
        self._bucket_of[entry_id] = bucket

    def remove(self, entry_id: str) -> bool:
        bucket = self._bucket_of.pop(entry_id, None)
        if bucket is None:
            return False
        index = self._buckets[bucket]
        index.remove(entry_id)
        if not len(index):
            del self._buckets[bucket]
        return True

    def bucket_size(self, bucket: Hashable) -> int:
        index = self._buckets.get(bucket)
        return len(index) if index is not None else 0

    def vector(self, entry_id: str) -> np.ndarray:
        return self._buckets[self._bucket_of[entry_id]].vector(entry_id)

    def search(self, bucket: Hashable, query: np.ndarray, k: int = 5) -> list[tuple[str, float]]:
        index = self._buckets.get(bucket)
        return index.search(query, k) if index is not None else []

    def clear(self) -> None:
        self._buckets.clear()
        self._bucket_of.clear()
