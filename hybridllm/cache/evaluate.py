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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._exceptions import DataError


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


def evaluate_pairs(
    pairs: PairSet,
    *,
    verifier: object = "default",
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Run the protocol above through a throwaway :class:`SemanticCache`; return the metrics."""
    from .semantic import SemanticCache

    hits = []
    with tempfile.TemporaryDirectory(prefix="hybridllm-cache-eval-") as tmp:
        cache = SemanticCache(
            Path(tmp) / "eval.sqlite3",
            ttl_s=None,
            max_entries=len(pairs) + 1,
            verifier=verifier,  # type: ignore[arg-type]
        )
        try:
            for i, (a, b) in enumerate(zip(pairs.text_a, pairs.text_b, strict=True)):
                ns = f"pair-{i}"
                user_a = [{"role": "user", "content": a}]
                cache.put(user_a, f"answer {i}", model="eval", params_key={}, namespace=ns)
                user_b = [{"role": "user", "content": b}]
                hit = cache.get(user_b, model="eval", params_key={}, namespace=ns)
                hits.append(hit is not None)
                if progress is not None:
                    progress(i + 1, len(pairs))
        finally:
            cache.close()
    return pair_metrics(hits, pairs.labels)
