"""The hit verifier: is a cached question the same question as the query?

Two stages, both plain numpy at run time:

1. a logistic regression over every pair feature (the 768 element-wise embedding features and the
   surface features) gives one logit, ``z``;
2. gradient-boosted trees (trained with scikit-learn's HistGradientBoosting, exported node by node)
   over the surface features and ``z`` give the probability.

The file is an ``.npz`` of plain arrays, loaded with ``allow_pickle=False`` (a file can hold no
code): the IDF table, the linear stage, the trees' node arrays, ``threshold`` (the shipped
operating point, chosen on a validation split for precision) and ``min_similarity`` (the cosine
below which a candidate is not scored at all).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._exceptions import CacheError
from .._paths import assets_dir
from .features import NUM_HANDCRAFTED, Idf, pair_features

FORMAT = "hybridllm-cache-verifier"
VERSION = 2
DEFAULT_NAME = "cache_verifier.npz"
_TREE_FIELDS = ("feature", "threshold", "left", "right", "value", "is_leaf", "roots")


def default_path() -> Path:
    return assets_dir() / DEFAULT_NAME


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

    @classmethod
    def from_sklearn(cls, model: Any) -> Trees:
        """Export a fitted binary ``HistGradientBoostingClassifier`` (numeric features only)."""
        parts: dict[str, list[np.ndarray]] = {k: [] for k in _TREE_FIELDS if k != "roots"}
        roots, offset = [], 0
        for (predictor,) in model._predictors:
            nodes = predictor.nodes
            roots.append(offset)
            parts["feature"].append(nodes["feature_idx"].astype(np.int32))
            parts["threshold"].append(nodes["num_threshold"].astype(np.float64))
            parts["left"].append(nodes["left"].astype(np.int32) + offset)
            parts["right"].append(nodes["right"].astype(np.int32) + offset)
            parts["value"].append(nodes["value"].astype(np.float64))
            parts["is_leaf"].append(nodes["is_leaf"].astype(bool))
            offset += len(nodes)
        return cls(
            **{k: np.concatenate(v) for k, v in parts.items()},
            roots=np.asarray(roots, dtype=np.int32),
            baseline=float(np.ravel(model._baseline_prediction)[0]),
        )

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
        return self.baseline + self.value[node].sum(axis=0)


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
        z = ((features - mean) / scale) @ w + b  # [n]
        return np.concatenate([hand, z[:, None]], axis=1)

    def predict_features(self, features: np.ndarray) -> np.ndarray:
        """``[n, num_features]`` -> ``[n]`` probabilities that the pair asks the same thing."""
        raw = np.clip(self.trees.raw(self.tree_inputs(features)), -30.0, 30.0)
        return 1.0 / (1.0 + np.exp(-raw))

    def predict(
        self, queries: Sequence[str], cached: Sequence[str], q_vecs: np.ndarray, c_vecs: np.ndarray
    ) -> np.ndarray:
        """Probabilities for each (query, cached) pair given their unit vectors."""
        if len(queries) == 0:
            return np.zeros(0, dtype=np.float64)
        return self.predict_features(pair_features(queries, cached, q_vecs, c_vecs, self.idf))

    def accept(self, probs: np.ndarray, similarity: np.ndarray) -> np.ndarray:
        """Which pairs count as hits at the shipped operating point."""
        return (np.asarray(similarity) >= self.min_similarity) & (np.asarray(probs) >= self.threshold)

    # ------------------------------------------------------------------ files

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        names = sorted(self.metrics)
        words = sorted(self.idf.weights)
        arrays: dict[str, np.ndarray] = {
            "format": np.array(FORMAT),
            "version": np.array(VERSION),
            "threshold": np.array(self.threshold),
            "min_similarity": np.array(self.min_similarity),
            "metric_names": np.array(names, dtype=str),
            "metric_values": np.array([self.metrics[k] for k in names], dtype=np.float64),
            "idf_words": np.array(words, dtype=str),
            "idf_values": np.array([self.idf.weights[w] for w in words], dtype=np.float32),
            "idf_default": np.array(self.idf.default),
            "tree_baseline": np.array(self.trees.baseline),
        }
        for field in _TREE_FIELDS:
            arrays[f"tree_{field}"] = getattr(self.trees, field)
        if self.linear is not None:
            w, b, mean, scale = self.linear
            arrays.update(lin_w=w, lin_b=np.array(b), lin_mean=mean, lin_scale=scale)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez_compressed(tmp, **arrays)  # type: ignore[arg-type]
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path | None = None) -> HitVerifier:
        path = Path(path) if path is not None else default_path()
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
                idf = Idf(data["idf_words"].tolist(), data["idf_values"].tolist(), float(data["idf_default"]))
                metrics = dict(
                    zip(data["metric_names"].tolist(), data["metric_values"].tolist(), strict=True)
                )
                return cls(
                    trees,
                    idf=idf,
                    linear=linear,
                    threshold=float(data["threshold"]),
                    min_similarity=float(data["min_similarity"]),
                    metrics=metrics,
                )
        except CacheError:
            raise
        except (OSError, KeyError, ValueError, TypeError) as exc:
            raise CacheError(f"Cannot load the cache verifier from {path}: {exc}") from exc
