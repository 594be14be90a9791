"""Score the cache on labelled question pairs, the way an app would meet them.

Protocol (``hybridllm cache eval``): for each pair, ``text_a`` is put into an empty namespace of
its own and ``text_b`` is asked with :meth:`SemanticCache.get`, through the same embedder,
candidate search and verifier as in production. A hit on a pair labelled 1 is correct, a hit on a
pair labelled 0 is a false hit.

- precision = correct hits / hits
- recall = correct hits / pairs labelled 1
- false_hit_rate = false hits / pairs labelled 0

A rate whose denominator is 0 (no hits, no pair labelled 1, or none labelled 0) is undefined:
``None`` (JSON ``null``), not a number that looks measured.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._cpus import usable_cpus
from .._exceptions import DataError

if TYPE_CHECKING:
    from .semantic import SemanticCache


@dataclass
class PairSet:
    text_a: list[str]
    text_b: list[str]
    labels: list[int]

    def __len__(self) -> int:
        return len(self.labels)


def load_pairs(path: str | Path, *, limit: int | None = None) -> PairSet:
    """Read ``{"text_a", "text_b", "label"}`` JSON lines: two non-empty strings and a label of 0 or
    1 (``true``/``false`` and ``"0"``/``"1"`` too). Any other line is a :class:`DataError` naming
    it: a label of 2 or 0.7, or a null question, is not silently made into one."""
    path = Path(path)
    pairs = PairSet([], [], [])
    try:
        fh = open(path, encoding="utf-8-sig")  # -sig: a byte order mark (Excel, Notepad) is no text
    except OSError as exc:
        raise DataError(f"Cannot read pairs file {path}: {exc}") from exc
    with fh:
        try:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    a, b, label = _pair(json.loads(line))
                except (ValueError, KeyError, TypeError) as exc:
                    raise DataError(
                        f"{path}:{lineno}: each line must be a JSON object with text_a, text_b and "
                        f"label (two non-empty texts, and 0 or 1): {exc}"
                    ) from exc
                pairs.text_a.append(a)
                pairs.text_b.append(b)
                pairs.labels.append(label)
                if limit is not None and len(pairs) >= limit:
                    break
        except UnicodeDecodeError as exc:  # read in blocks: the line is not known
            raise DataError(f"{path} is not UTF-8 text: {exc}") from exc
    if not pairs.labels:
        raise DataError(f"{path} holds no pairs")
    return pairs


def _pair(row: object) -> tuple[str, str, int]:
    if not isinstance(row, dict):
        raise TypeError(f"got a JSON {type(row).__name__}")
    a, b, label = row["text_a"], row["text_b"], row["label"]
    for name, text in (("text_a", a), ("text_b", b)):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{name} is {text!r}")
        try:  # JSON's "\ud83d" escape reads as half an emoji, which no model can be asked
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{name} holds a lone UTF-16 surrogate: {text!r}") from None
    # bool is an int; 1.0 == 1; a NaN or infinite label equals neither
    if isinstance(label, str):
        label = label.strip()
    if label not in (0, 1, "0", "1"):
        raise ValueError(f"label is {label!r}")
    return a, b, int(label)


def pair_metrics(hits: Sequence[bool] | np.ndarray, labels: Sequence[int] | np.ndarray) -> dict:
    """The rates above, and the counts they come from; an undefined rate is ``None``."""
    hits = np.asarray(hits, dtype=bool)
    labels = np.asarray(labels, dtype=bool)
    num_hits = int(hits.sum())
    correct = int((hits & labels).sum())
    num_pos = int(labels.sum())
    num_neg = len(labels) - num_pos
    return {
        "precision": correct / num_hits if num_hits else None,
        "recall": correct / num_pos if num_pos else None,
        "false_hit_rate": (num_hits - correct) / num_neg if num_neg else None,
        "hits": num_hits,
        "positives": num_pos,
        "n": len(labels),
    }


def embed_pairs(pairs: PairSet) -> dict[str, np.ndarray]:
    """The embedder's vector of each distinct text of ``pairs``, bit for bit what the cache's
    ``put`` and ``get`` compute (each text alone, on several threads: :meth:`.Embedder.embed`).
    Passed to :func:`evaluate_pairs` as ``vectors``, several verifiers are scored on one set of
    pairs while its texts are embedded once."""
    from .embedder import get_embedder

    texts = list(dict.fromkeys([*pairs.text_a, *pairs.text_b]))
    return dict(zip(texts, get_embedder().embed(texts), strict=True))


def evaluate_pairs(
    pairs: PairSet,
    *,
    verifier: object = "default",
    progress: Callable[[int, int], None] | None = None,
    vectors: Mapping[str, np.ndarray] | None = None,
    workers: int | None = None,
) -> dict:
    """Run the protocol above through a throwaway :class:`SemanticCache`; return the metrics.

    Each pair has a namespace of its own, so its outcome depends on that pair alone: the pairs are
    looked up on ``workers`` threads (default: one per usable CPU, at most 8), each outcome the one
    a lone lookup gives. ``vectors`` (from :func:`embed_pairs`) stand in for embedding the texts
    they hold. ``progress(done, total)`` is called per pair, in order, from the calling thread."""
    from .embedder import get_embedder
    from .semantic import SemanticCache

    # given vectors, the cache still needs its embedder: its length checks (a text longer than it
    # reads is served on an exact repeat only) must run; else the cache loads it at its first put
    options: dict[str, Any] = {"embedder": get_embedder()} if vectors else {}
    with tempfile.TemporaryDirectory(prefix="hybridllm-cache-eval-") as tmp:
        cache = SemanticCache(
            Path(tmp) / "eval.sqlite3",
            ttl_s=None,
            max_entries=len(pairs) + 1,
            verifier=verifier,  # type: ignore[arg-type]
            **options,
        )
        try:
            hits = _lookups(cache, pairs, vectors or {}, progress, _workers(workers, len(pairs)))
        finally:
            cache.close()
    return pair_metrics(hits, pairs.labels)


def _workers(workers: int | None, num_pairs: int) -> int:
    """Lookup threads: ``workers``, else one per usable CPU (at most 8) but 16 pairs a thread at
    the least, so a handful of pairs never starts a pool."""
    if workers is not None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        return workers
    return max(1, min(usable_cpus(), 8, num_pairs // 16))


def _lookups(
    cache: SemanticCache,
    pairs: PairSet,
    vectors: Mapping[str, np.ndarray],
    progress: Callable[[int, int], None] | None,
    workers: int,
) -> list[bool]:
    """Whether each pair's ``text_b`` was served ``text_a``'s answer, pair by pair in order."""

    def lookup(i: int) -> bool:
        a, b = pairs.text_a[i], pairs.text_b[i]
        ns = f"pair-{i}"
        cache.put([{"role": "user", "content": a}], f"answer {i}", model="eval", params_key={},
                  namespace=ns, embedding=vectors.get(a))
        hit = cache.get([{"role": "user", "content": b}], model="eval", params_key={},
                        namespace=ns, embedding=vectors.get(b))
        return hit is not None

    hits: list[bool] = []
    pool = ThreadPoolExecutor(workers, thread_name_prefix="hybridllm-eval") if workers > 1 else None
    try:
        # the embedder and reranker runs (most of a lookup) release the GIL: threads share the CPUs
        outcomes = pool.map(lookup, range(len(pairs))) if pool is not None else map(lookup, range(len(pairs)))
        for hit in outcomes:
            hits.append(hit)
            if progress is not None:
                progress(len(hits), len(pairs))
    finally:
        if pool is not None:  # an error or Ctrl-C: drop the lookups not started
            pool.shutdown(wait=True, cancel_futures=True)
    return hits
