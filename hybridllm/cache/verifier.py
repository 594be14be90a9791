"""The hit verifier: is a cached question the same question as the query?

Two stages, both plain numpy at run time:

1. a logistic regression over every pair feature (the 768 element-wise embedding features and the
   surface features) gives one logit, ``z``;
2. gradient-boosted trees (trained with scikit-learn's HistGradientBoosting, exported node by node)
   over the surface features and ``z`` give the probability.

Run time only: training and writing the file are in :mod:`.train`. The file is an ``.npz`` of plain
arrays, loaded with ``allow_pickle=False`` (a file can hold no code): the IDF table, the linear
stage, the trees' node arrays, ``threshold`` (the shipped operating point, chosen on a validation
split for precision) and ``min_similarity`` (the cosine below which a candidate is not scored at all).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._exceptions import CacheError
from .._files import DAMAGED_NPZ_ERRORS
from .._paths import assets_dir, shipped_file
from .._types import is_real
from .features import NUM_HANDCRAFTED, Idf, pair_features

FORMAT = "hybridllm-cache-verifier"
VERSION = 2
DEFAULT_NAME = "cache_verifier.npz"
_TREE_FIELDS = ("feature", "threshold", "left", "right", "value", "is_leaf", "roots")


def default_path() -> Path:
    return assets_dir() / DEFAULT_NAME


# The rule for the verifiers' decision fields, wherever they come from (a file, a caller, a
# hand-built RerankerInfo). Each is compared with ">=": NaN compares false both ways (a NaN
# threshold served every candidate or none, a NaN min_similarity let every candidate through the
# cosine stage), a threshold of 0 serves the pairs scored 0.0 for being read in part, and a
# min_similarity above 1 silently never hits.
def is_threshold(value: Any) -> bool:
    """A probability in (0, 1]: a hit needs ``prob >= threshold``."""
    return is_real(value) and 0.0 < value <= 1.0


def is_min_similarity(value: Any) -> bool:
    """A cosine in [-1, 1]: a candidate needs ``cosine >= min_similarity``."""
    return is_real(value) and -1.0 <= value <= 1.0


def bad_decision_fields(threshold: object, min_similarity: object) -> str | None:
    """What is wrong with a file's ``threshold`` and ``min_similarity``, or None."""
    if not is_threshold(threshold):
        return f"threshold {threshold!r} is not a probability in (0, 1]"
    if not is_min_similarity(min_similarity):
        return f"min_similarity {min_similarity!r} is not a cosine in [-1, 1]"
    return None


def _bad_linear(linear: tuple[np.ndarray, float, np.ndarray, np.ndarray]) -> str | None:
    """What is wrong with the linear stage, or None: a scale of 0 (or not finite) made every
    pair's logit infinite or NaN, and NaN weights a NaN logit the trees then read as large."""
    w, b, mean, scale = linear
    if w.ndim != 1 or mean.shape != w.shape or scale.shape != w.shape:
        return f"lin_w, lin_mean and lin_scale of shapes {w.shape}, {mean.shape}, {scale.shape}"
    if not (np.isfinite(w).all() and np.isfinite(mean).all() and np.isfinite(b)):
        return "lin_w, lin_b or lin_mean not finite"
    if not (np.isfinite(scale).all() and (scale > 0).all()):
        return "a lin_scale that is not finite and above 0"
    return None


@dataclass
class Trees:
    """A boosted tree ensemble as flat node arrays; node ids are global across trees."""

    feature: np.ndarray  # [num_nodes] int32
    threshold: np.ndarray  # [num_nodes] float64, go left when x <= threshold
    left: np.ndarray  # [num_nodes] int32
    right: np.ndarray  # [num_nodes] int32
    value: np.ndarray  # [num_nodes] float64, leaf values (raw log-odds)
    is_leaf: np.ndarray  # [num_nodes] bool
    roots: np.ndarray  # [num_trees] int32
    baseline: float

    def raw(self, x: np.ndarray) -> np.ndarray:
        """``[n, num_features]`` -> ``[n]`` summed log-odds."""
        n = len(x)
        node = np.repeat(self.roots[:, None], n, axis=1)  # [num_trees, n]
        rows = np.arange(n)[None, :]
        while True:
            leaf = self.is_leaf[node]
            if leaf.all():
                break
            go_left = x[rows, self.feature[node]] <= self.threshold[node]
            step = np.where(go_left, self.left[node], self.right[node])
            node = np.where(leaf, node, step)
        # [n, num_trees], summed along each row: the same order of additions for a pair whatever
        # the number of pairs (a sum down the columns of [num_trees, n] takes another order at n = 1)
        return self.baseline + self.value[np.ascontiguousarray(node.T)].sum(axis=1)


def _malformed(trees: Trees, num_inputs: int) -> str | None:
    """What is wrong with the node arrays, or None. ``Trees.raw`` walks from each root until every
    walk reaches a leaf: a child id not past its parent's (a loop) walked forever, and an id or a
    feature out of range raised an IndexError on every lookup. Children follow their parent in
    the exported order (node ids grow down each tree), so requiring it rules out a loop."""
    n = len(trees.feature)
    if any(len(getattr(trees, f)) != n for f in _TREE_FIELDS if f != "roots") or n == 0:
        return "node arrays of different or zero lengths"
    if not len(trees.roots) or trees.roots.min() < 0 or trees.roots.max() >= n:
        return "a root out of range"
    inner = ~trees.is_leaf.astype(bool)
    ids = np.arange(n)[inner]
    for side in (trees.left[inner], trees.right[inner]):
        if np.any(side <= ids) or np.any(side >= n):
            return "a child that does not follow its parent"
    if np.any(trees.feature[inner] < 0) or np.any(trees.feature[inner] >= num_inputs):
        return f"a feature out of the {num_inputs} inputs"
    return None


class HitVerifier:
    """Scores (query, cached question) pairs; ``accept`` applies the shipped operating point."""

    kind = "features"

    def __init__(
        self,
        trees: Trees,
        *,
        idf: Idf,
        linear: tuple[np.ndarray, float, np.ndarray, np.ndarray] | None,
        threshold: float,
        min_similarity: float,
        metrics: dict[str, float] | None = None,
    ) -> None:
        self.trees = trees
        self.idf = idf
        self.linear = linear  # (weights [num_features], bias, mean, scale)
        self.threshold = float(threshold)
        self.min_similarity = float(min_similarity)
        self.metrics = dict(metrics or {})

    def tree_inputs(self, features: np.ndarray) -> np.ndarray:
        """The trees' inputs: surface features, plus the linear stage's logit when present."""
        features = np.asarray(features, dtype=np.float32)
        hand = features[:, :NUM_HANDCRAFTED]
        if self.linear is None:
            return hand
        w, b, mean, scale = self.linear
        # row by row (einsum, not BLAS's matrix-vector product, whose rounding varies with the
        # number of rows): a pair's input does not depend on the pairs scored with it
        z = np.einsum("nf,f->n", (features - mean) / scale, w) + b  # [n]
        return np.concatenate([hand, z[:, None]], axis=1)

    def predict_features(self, features: np.ndarray) -> np.ndarray:
        """``[n, num_features]`` -> ``[n]`` probabilities that the pair asks the same thing."""
        raw = np.clip(self.trees.raw(self.tree_inputs(features)), -30.0, 30.0)
        return 1.0 / (1.0 + np.exp(-raw))

    def predict(
        self,
        queries: Sequence[str],
        cached: Sequence[str],
        q_vecs: np.ndarray,
        c_vecs: np.ndarray,
        *,
        at_least: float | None = None,
    ) -> np.ndarray:
        """Probabilities for each (query, cached) pair given their unit vectors. ``at_least`` (the
        probability the caller needs) changes nothing here: every pair is scored, with no graph to
        skip (:class:`~.reranker.RerankVerifier` takes it too)."""
        if len(queries) == 0:
            return np.zeros(0, dtype=np.float64)
        return self.predict_features(pair_features(queries, cached, q_vecs, c_vecs, self.idf))

    def accept(self, probs: np.ndarray, similarity: np.ndarray) -> np.ndarray:
        """Which pairs count as hits at the shipped operating point."""
        return (np.asarray(similarity) >= self.min_similarity) & (np.asarray(probs) >= self.threshold)

    @classmethod
    def load(cls, path: str | Path | None = None) -> HitVerifier:
        path = Path(path) if path is not None else shipped_file(DEFAULT_NAME)
        try:
            with np.load(path, allow_pickle=False) as data:
                if str(data["format"]) != FORMAT or int(data["version"]) != VERSION:
                    raise CacheError(f"{path} is not a version-{VERSION} hybridllm cache verifier")
                trees = Trees(
                    **{f: data[f"tree_{f}"] for f in _TREE_FIELDS},
                    baseline=float(data["tree_baseline"]),
                )
                linear = None
                if "lin_w" in data.files:
                    linear = (
                        data["lin_w"].astype(np.float32),
                        float(data["lin_b"]),
                        data["lin_mean"].astype(np.float32),
                        data["lin_scale"].astype(np.float32),
                    )
                if (bad := _malformed(trees, NUM_HANDCRAFTED + (linear is not None))) is not None:
                    raise CacheError(
                        f"Cannot load the cache verifier from {path}: its trees are malformed ({bad}); "
                        "train it again, or reinstall hybridllm for the shipped one."
                    )
                threshold, min_similarity = float(data["threshold"]), float(data["min_similarity"])
                # read as they were before: a NaN threshold or min_similarity, or a zero lin_scale,
                # was found out (if ever) as a cache that served every candidate or none
                bad = bad_decision_fields(threshold, min_similarity)
                if bad is None and linear is not None:
                    bad = _bad_linear(linear)
                if bad is not None:
                    raise CacheError(
                        f"The cache verifier {path} is damaged ({bad}): copy it again or retrain it "
                        "(python -m hybridllm.cache.train), or reinstall hybridllm for the shipped one."
                    )
                idf = Idf(data["idf_words"].tolist(), data["idf_values"].tolist(), float(data["idf_default"]))
                metrics = dict(
                    zip(data["metric_names"].tolist(), data["metric_values"].tolist(), strict=True)
                )
                return cls(
                    trees,
                    idf=idf,
                    linear=linear,
                    threshold=threshold,
                    min_similarity=min_similarity,
                    metrics=metrics,
                )
        except CacheError:
            raise
        except DAMAGED_NPZ_ERRORS as exc:
            # a truncated, empty or damaged .npz is a zip or EOF error: before, it reached the
            # caller as a bare zipfile.BadZipFile
            raise CacheError(
                f"Cannot load the cache verifier from {path} ({type(exc).__name__}: {exc}): the file "
                "is damaged or not a cache verifier; copy it again or retrain it (python -m "
                "hybridllm.cache.train), or reinstall hybridllm for the shipped one."
            ) from exc
