"""The hit verifier: a small MLP over pair features that says whether a cached answer fits.

The weights are plain numpy arrays in an ``.npz`` file (loaded with ``allow_pickle=False``, so a
file can hold no code): ``mean``/``scale`` standardize the features, ``w0, b0, w1, b1, ...`` are
the layers (ReLU between them, a sigmoid at the end), ``threshold`` is the shipped operating
point (chosen on a validation split for precision) and ``min_similarity`` the cosine below
which a candidate is not even scored.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .._exceptions import CacheError
from .._paths import assets_dir
from .features import NUM_HANDCRAFTED, pair_features

FORMAT = "hybridllm-cache-verifier"
VERSION = 1
DEFAULT_NAME = "cache_verifier.npz"


def default_path() -> Path:
    return assets_dir() / DEFAULT_NAME


class HitVerifier:
    """Scores (query, cached question) pairs; ``accept`` applies the shipped threshold."""

    def __init__(
        self,
        layers: Sequence[tuple[np.ndarray, np.ndarray]],
        *,
        mean: np.ndarray,
        scale: np.ndarray,
        threshold: float,
        min_similarity: float,
        metrics: dict[str, float] | None = None,
    ) -> None:
        if not layers or layers[-1][0].shape[1] != 1:
            raise CacheError("A hit verifier needs at least one layer ending in one output")
        self.layers = [(np.asarray(w, np.float32), np.asarray(b, np.float32)) for w, b in layers]
        self.mean = np.asarray(mean, np.float32)
        self.scale = np.asarray(scale, np.float32)
        self.threshold = float(threshold)
        self.min_similarity = float(min_similarity)
        self.metrics = dict(metrics or {})
        self.num_features = self.layers[0][0].shape[0]
        if self.mean.shape != (self.num_features,) or self.scale.shape != (self.num_features,):
            raise CacheError("Verifier feature scaling does not match its first layer")

    @property
    def dim(self) -> int:
        """Embedding size the verifier was trained for."""
        return (self.num_features - NUM_HANDCRAFTED) // 2

    def predict_features(self, features: np.ndarray) -> np.ndarray:
        """``[n, num_features]`` -> ``[n]`` probabilities that the pair asks the same thing."""
        x = (np.asarray(features, np.float32) - self.mean) / self.scale
        for i, (w, b) in enumerate(self.layers):
            x = x @ w + b
            if i < len(self.layers) - 1:
                np.maximum(x, 0.0, out=x)
        logits = np.clip(x[:, 0], -30.0, 30.0)
        return 1.0 / (1.0 + np.exp(-logits))

    def predict(
        self, queries: Sequence[str], cached: Sequence[str], q_vecs: np.ndarray, c_vecs: np.ndarray
    ) -> np.ndarray:
        """Probabilities for each (query, cached) pair given their unit vectors."""
        if len(queries) == 0:
            return np.zeros(0, dtype=np.float32)
        return self.predict_features(pair_features(queries, cached, q_vecs, c_vecs))

    def accept(self, probs: np.ndarray, similarity: np.ndarray) -> np.ndarray:
        """Which pairs count as hits at the shipped operating point."""
        return (np.asarray(similarity) >= self.min_similarity) & (probs >= self.threshold)

    # ------------------------------------------------------------------ files

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        arrays: dict[str, np.ndarray] = {
            "format": np.array(FORMAT),
            "version": np.array(VERSION),
            "mean": self.mean,
            "scale": self.scale,
            "threshold": np.array(self.threshold),
            "min_similarity": np.array(self.min_similarity),
            "metric_names": np.array(sorted(self.metrics), dtype=str),
            "metric_values": np.array([self.metrics[k] for k in sorted(self.metrics)], np.float64),
        }
        for i, (w, b) in enumerate(self.layers):
            arrays[f"w{i}"], arrays[f"b{i}"] = w, b
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, **arrays)  # type: ignore[arg-type]
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path | None = None) -> HitVerifier:
        path = Path(path) if path is not None else default_path()
        try:
            with np.load(path, allow_pickle=False) as data:
                if str(data["format"]) != FORMAT or int(data["version"]) != VERSION:
                    raise CacheError(f"{path} is not a version-{VERSION} hybridllm cache verifier")
                num_layers = sum(1 for k in data.files if k.startswith("w"))
                layers = [(data[f"w{i}"], data[f"b{i}"]) for i in range(num_layers)]
                metrics = dict(
                    zip(data["metric_names"].tolist(), data["metric_values"].tolist(), strict=True)
                )
                return cls(
                    layers,
                    mean=data["mean"],
                    scale=data["scale"],
                    threshold=float(data["threshold"]),
                    min_similarity=float(data["min_similarity"]),
                    metrics=metrics,
                )
        except CacheError:
            raise
        except (OSError, KeyError, ValueError) as exc:
            raise CacheError(f"Cannot load the cache verifier from {path}: {exc}") from exc
