"""The semantic cache's candidates: a question's unit vector and the nearest servable cached questions."""

from __future__ import annotations

import numpy as np

from .._exceptions import InvalidRequestError
from ._mirror import _Known, _Mirror
from .embedder import Embedder, get_embedder
from .guards import conflict

_MAX_SCANNED = 64  # rows a lookup ranks at most, skipping expired and refused ones (see _candidates)


def _fits(model: object, *texts: str) -> bool:
    """Whether the embedder reads ``texts`` whole; True for one that cannot tell (a caller's own)."""
    fits = getattr(model, "fits", None)
    return True if fits is None else bool(fits(*texts))


class _Candidates(_Mirror):
    """How a :class:`~.semantic.SemanticCache` finds the cached questions a lookup may serve."""

    top_k: int
    min_similarity: float
    _embedder: Embedder | None

    def _vector(self, query: str, embedding: np.ndarray | None) -> np.ndarray:
        """The question's unit vector: the index compares dot products with ``min_similarity``
        as cosines, so a vector of another length (a caller's own embedder or ``embedding=``
        without normalization) would make unrelated questions pass it."""
        if embedding is None:
            vec = self._embed(query)
        else:
            try:
                raw = np.asarray(embedding)
                # complex values lost their imaginary part in the cast (a warning only), and texts
                # ("0.1", ...) were parsed: neither is a vector of real numbers
                if raw.dtype.kind in "cSU":
                    raise TypeError(f"got dtype {raw.dtype}, not real numbers")
                # squeeze, not reshape(-1): a [1, dim] row is one vector, a [2, dim/2] matrix is not
                vec = np.asarray(raw, dtype=np.float32).squeeze()
            except (TypeError, ValueError) as exc:  # ["a", ...] or a dict: a bare numpy error before
                raise InvalidRequestError(f"the embedding must be a vector of numbers: {exc}") from exc
        if vec.shape != (self._store.dim,):
            raise InvalidRequestError(
                f"the embedding has shape {vec.shape}; this cache holds {self._store.dim}-dim vectors"
            )
        # in float64: a float32 sum of squares overflows (components of 1e20) or underflows to 0
        norm = float(np.linalg.norm(vec.astype(np.float64)))
        if not np.isfinite(norm) or norm == 0.0:
            raise InvalidRequestError("the embedding must be a finite, non-zero vector")
        # the shipped embedder's vectors are unit already: left bit for bit as they are
        return vec if abs(norm - 1.0) <= 1e-3 else vec / np.float32(norm)

    def _embed(self, query: str) -> np.ndarray:
        if self._embedder is None:
            self._embedder = get_embedder()
        return self._embedder.embed_one(query)

    def _fits_whole(self, known: _Known) -> bool:
        """Whether the embedder reads a cached question whole, found out once per entry: a long
        question is tokenized on its first lookup as a candidate, not on every one."""
        if known.fits is None:
            if getattr(self._embedder, "fits", None) is None:
                return True  # no embedder yet (the caller passed vectors), or one that cannot tell
            known.fits = _fits(self._embedder, known.query)
        return known.fits

    def _candidates(self, bucket: str, query: str, vec: np.ndarray) -> list[tuple[str, float]]:
        """The ``top_k`` nearest cached questions at or above ``min_similarity`` that may be
        served (alive, not refused by the guards, read whole by the embedder), best first. The
        caller holds the lock. Before, expired or refused ones took the ``top_k`` slots, so a
        servable question ranked just below them was a miss; now, when the first ``top_k`` rows
        are not enough, one wider search ranks ``_MAX_SCANNED`` (two searches at most)."""
        found: list[tuple[str, float]] = []
        looked: set[str] = set()
        k = self.top_k
        while True:
            ranked = self._index.search(bucket, vec, k)
            for eid, sim in ranked:
                if eid in looked:  # ranked by the first, narrower search
                    continue
                looked.add(eid)
                # best first: none below is close enough (nor a NaN cosine, which compares false)
                if not sim >= self.min_similarity:
                    return found
                known = self._entries[eid]
                if self._alive(eid) and conflict(query, known.query) is None and self._fits_whole(known):
                    found.append((eid, sim))
                    if len(found) == self.top_k:
                        return found
            if len(ranked) < k or k >= _MAX_SCANNED:  # the whole bucket, or enough work done
                return found
            k = _MAX_SCANNED
