"""The default hit verifier: a cross-encoder that reads the query and the cached question together.

A bi-encoder compares two questions through one vector each, which cannot tell "How do I learn
Python?" from "How do I learn Python fast?". A cross-encoder attends across both texts at once.
Ours is all-MiniLM-L6-v2 fine-tuned on labelled question pairs (``python -m
hybridllm.cache.train_reranker``): input ``[CLS] query [SEP] cached [SEP]``, mean pooling, one
linear layer, a logit.

The decision stacks the reranker with the feature verifier (:mod:`.verifier`), whose errors
differ from it: a logistic regression over the reranker's logit, the feature verifier's logit and
the surface features (cosine, overlaps, numbers, negation...), fitted on the validation split.

The weights ship in ``hybridllm/_data/cache_reranker.npz`` (:mod:`.reranker_file`). At run time only
ONNX Runtime, ``tokenizers`` and numpy are needed: on first use the weights become an int8 ONNX model
under ``data_dir()/rerankers/`` (:mod:`.prepare`, no torch), next to the sentence embedder. If that
cannot be done, the default verifier falls back to the feature verifier with one line on stderr.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._exceptions import CacheError, ConfigError, ModelError
from .encoder import OnnxEncoder
from .features import NUM_HANDCRAFTED, pair_features
from .prepare import logit_ranges, prepare_reranker, stderr_notice
from .reranker_file import (  # noqa: F401  (re-exported: the file format's names)
    DEFAULT_NAME,
    FORMAT,
    VERSION,
    RerankerInfo,
    Stack,
    default_path,
    file_digest,
    read_info,
    read_weights,
)
from .verifier import HitVerifier, bad_decision_fields, is_threshold
from .verifier import default_path as features_default_path

MAX_TOKENS = 128  # query + cached question; QQP pairs average about 30 tokens together


def stack_inputs(reranker_logits: np.ndarray, features: np.ndarray, verifier: HitVerifier) -> np.ndarray:
    """``[n, 2 + NUM_HANDCRAFTED]``: reranker logit, feature-verifier logit, surface features."""
    feature_logits = np.clip(verifier.trees.raw(verifier.tree_inputs(features)), -30.0, 30.0)
    return np.column_stack(
        [np.asarray(reranker_logits, dtype=np.float64), feature_logits, features[:, :NUM_HANDCRAFTED]]
    )


class Reranker(OnnxEncoder):
    """Scores (query, cached question) pairs with the int8 ONNX cross-encoder."""

    what = "cache reranker"

    def __init__(
        self, path: str | Path | None = None, *, quantized: bool = True, num_threads: int | None = None
    ) -> None:
        self.info = read_info(path)
        folder = prepare_reranker(self.info.path, self.info.weights_digest)
        super().__init__(folder, quantized=quantized, num_threads=num_threads, max_tokens=MAX_TOKENS)

    def logits(self, queries: Sequence[str], cached: Sequence[str], *, batch_size: int = 1) -> np.ndarray:
        """``[n]`` float32 logits that ``queries[i]`` asks the same thing as ``cached[i]``.

        One pair per graph run by default, so a pair's logit depends on that pair alone: the int8
        graph quantizes its activations with one scale over the whole batch, padding included, so
        in a batch each logit also depends on the other pairs (up to 0.8 apart on QQP lookups of 5
        candidates). ``batch_size`` > 1 trades that for speed where many cores make batches pay."""
        return self.logits_and_fits(queries, cached, batch_size=batch_size)[0]

    def logits_and_fits(
        self, queries: Sequence[str], cached: Sequence[str], *, batch_size: int = 1
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`logits`, and ``[n]`` bool: whether the reranker read each pair whole (as
        ``fits_pairs``), both from one tokenizer pass per pair."""
        batches, whole = self.encode_pairs(queries, cached, batch_size=batch_size)
        return self.run_batches(batches, len(queries)), whole

    def encode_pairs(
        self, queries: Sequence[str], cached: Sequence[str], *, batch_size: int = 1
    ) -> tuple[list[tuple[list[int], list[Any]]], np.ndarray]:
        """The pairs tokenized in the batches :meth:`logits_and_fits` runs: ``[(pair indices,
        encodings)]``, and ``[n]`` bool, whether the reranker reads each pair whole."""
        if len(queries) != len(cached):
            raise ValueError("queries and cached must have the same length")
        # batches of similar length pad little (the int8 graph scales activations per batch, so a
        # batch's members also decide each logit's rounding: keep this order to keep the logits)
        order = sorted(range(len(queries)), key=lambda i: len(queries[i]) + len(cached[i]))
        encoded = self.encode([(queries[i], cached[i]) for i in order])  # one tokenizer call
        whole = np.empty(len(queries), dtype=bool)
        # read whole: nothing cut, and no [UNK] or deleted character on either side
        whole[order] = [
            self.pair_read_whole((queries[i], cached[i]), enc) for i, enc in zip(order, encoded, strict=True)
        ]
        size = max(1, batch_size)
        batches = [
            (order[start : start + size], encoded[start : start + size])
            for start in range(0, len(order), size)
        ]
        return batches, whole

    def run_batches(self, batches: Sequence[tuple[list[int], list[Any]]], n: int) -> np.ndarray:
        """``[n]`` float32 logits of :meth:`encode_pairs`' batches, in the pairs' order."""
        out = np.empty(n, dtype=np.float32)
        for idx, encodings in batches:
            out[idx] = self.run_encoded(encodings).reshape(-1)
        return out

    @functools.cached_property
    def logit_range(self) -> tuple[float, float] | None:
        """The lowest and highest logit the graph can give any pair (:mod:`.logit_bound`, kept in
        the folder by :func:`.prepare.logit_ranges`), or None when its shape does not say."""
        return logit_ranges(Path(self.path).parent).get(Path(self.path).name)

    def probs(self, queries: Sequence[str], cached: Sequence[str]) -> np.ndarray:
        return _sigmoid(self.logits(queries, cached))


class RerankVerifier:
    """The cache's hit verifier: the reranker, stacked with the feature verifier when the file says
    so (same interface as ``HitVerifier``).

    Built from a file (``reranker`` None), the ONNX model is prepared and loaded at the first
    ``predict``, so a cache that never has a candidate to verify never pays for it. With
    ``fallback=True`` (the shipped default), a reranker that cannot be prepared on this device
    hands over to the feature verifier, with one line on stderr, never an error.
    """

    kind = "reranker"
    # pairs per graph run: 1 makes a pair's score a function of the pair alone (as ``hybridllm
    # cache eval`` scores it), whatever other candidates the lookup found
    batch_size = 1

    def __init__(
        self,
        reranker: Reranker | None = None,
        *,
        path: str | Path | None = None,
        features: HitVerifier | None = None,
        threshold: float | None = None,
        fallback: bool = False,
        batch_size: int = 1,
    ) -> None:
        info = reranker.info if reranker is not None else read_info(path)
        # a probability above 0 (is_threshold): NaN (or above 1) never hit, silently, and 0 served
        # the pairs scored 0.0 for being read in part ("Is this 🍄 edible?" for "Is this 🌿 edible?");
        # a hand-built RerankerInfo's fields are checked as read_info checks a file's, before the
        # stacked feature verifier is loaded
        if threshold is not None and not is_threshold(threshold):
            raise ConfigError(f"the reranker threshold must be a probability in (0, 1], got {threshold!r}")
        bad = bad_decision_fields(info.threshold if threshold is None else threshold, info.min_similarity)
        if bad is not None:
            raise CacheError(f"The cache reranker {info.path} has no valid decision fields ({bad})")
        self.batch_size = batch_size
        self.info = info
        self._reranker = reranker
        self._lock = threading.Lock()
        self._fallback: HitVerifier | None = None
        self._may_fall_back = fallback
        self.stack = info.stack
        self.features = features
        if self.stack is not None and self.features is None:
            self.features = load_stacked_features(info)
        self.threshold = info.threshold if threshold is None else float(threshold)
        self.min_similarity = info.min_similarity
        self.metrics = dict(info.metrics)

    @classmethod
    def load(cls, path: str | Path | None = None) -> RerankVerifier:
        """A verifier on a reranker file: a named file is prepared now (its errors come at the call),
        the shipped one at first use, with the feature verifier as its fallback."""
        if path is not None:
            return cls(Reranker(path))
        return cls(path=None, fallback=True)

    @property
    def reranker(self) -> Reranker:
        if self._reranker is None:
            with self._lock:
                if self._reranker is None:
                    self._reranker = Reranker(self.info.path)
        return self._reranker

    def predict(
        self,
        queries: Sequence[str],
        cached: Sequence[str],
        q_vecs: np.ndarray,
        c_vecs: np.ndarray,
        *,
        at_least: float | None = None,
    ) -> np.ndarray:
        """Probabilities that each (query, cached) pair asks the same thing.

        ``at_least``: the probability the caller needs (its threshold). A graph run none of whose
        pairs can reach it is skipped and its pairs score 0.0: a pair longer than the reranker
        reads scores 0.0 anyway, and the reranker's logit range (:mod:`.logit_bound`) with the
        pair's other stack inputs caps what the others can score. With one pair per run (the
        default ``batch_size``) that skips each such pair; the pairs scored get the probability
        they get without ``at_least``, bit for bit (a run's logits depend on its own pairs only).

        Each pair's probability depends on that pair alone with ``batch_size`` 1: the int8 graph
        quantizes its activations per run, so in a larger batch the other pairs move its logit."""
        if len(queries) == 0:
            return np.zeros(0, dtype=np.float64)
        if self._fallback is None:
            try:
                reranker = self.reranker
            except ModelError as exc:
                if not self._may_fall_back:
                    raise
                self._fall_back(exc)
        if self._fallback is not None:
            probs = self._fallback.predict(queries, cached, q_vecs, c_vecs)
            similarity = np.sum(np.asarray(q_vecs) * np.asarray(c_vecs), axis=1)
            return np.where(similarity >= self._fallback.min_similarity, probs, 0.0)
        # the stack's inputs but the reranker's logit (column 0, filled in by _stack_logit): the
        # feature verifier's trees run once, for the bound below and for the scores
        inputs = None
        if self.stack is not None and self.features is not None:
            features = pair_features(queries, cached, q_vecs, c_vecs, self.features.idf)
            inputs = stack_inputs(np.zeros(len(queries)), features, self.features)
        if at_least is None:
            raw, whole = reranker.logits_and_fits(queries, cached, batch_size=self.batch_size)
            scored = whole
        else:
            batches, whole = reranker.encode_pairs(queries, cached, batch_size=self.batch_size)
            may = self._may_reach(at_least, whole, inputs, reranker.logit_range)
            batches = [(idx, enc) for idx, enc in batches if may[idx].any()]
            if not batches:
                return np.zeros(len(queries), dtype=np.float64)
            scored = np.zeros(len(queries), dtype=bool)  # the pairs of the runs kept
            for idx, _ in batches:
                scored[idx] = True
            raw = np.where(scored, reranker.run_batches(batches, len(queries)), 0.0)
        logits = raw.astype(np.float64)
        if inputs is not None:
            logits = self._stack_logit(inputs, logits)
        # a pair longer than the reranker reads (MAX_TOKENS together) was judged on its heads
        # only, and one with an [UNK] or a deleted character on an unread part: what differs may
        # lie in what it never saw (served on an exact repeat only); a pair not scored cannot pass
        # a NaN logit (a damaged graph or weights) is no score: compared with the threshold it
        # read as neither below nor above, and the cache served it
        return np.where(whole & scored & ~np.isnan(logits), _sigmoid(logits), 0.0)

    def _stack_logit(self, inputs: np.ndarray, reranker_logits: np.ndarray) -> np.ndarray:
        """The stacked logit of ``inputs`` (from ``stack_inputs``) with these reranker logits."""
        stack = self.stack
        assert stack is not None
        inputs[:, 0] = reranker_logits
        # Stack.logit row by row (einsum: BLAS's matrix-vector rounding varies with the number of
        # rows), so a pair's score is the same whatever pairs are scored with it
        return np.einsum("ni,i->n", (inputs - stack.mean) / stack.scale, stack.weights) + stack.bias

    def _may_reach(
        self,
        at_least: float,
        whole: np.ndarray,
        inputs: np.ndarray | None,
        logit_range: tuple[float, float] | None,
    ) -> np.ndarray:
        """``[n]`` bool: whether each pair read whole could score ``at_least``, whatever logit the
        graph gives it (a pair not read whole scores 0.0)."""
        if not whole.any() or logit_range is None:
            return whole.copy()
        low, high = logit_range
        if inputs is None:
            best = np.full(len(whole), high)
        else:
            # the stack is linear in the reranker's logit: its best score is at one end of the range
            assert self.stack is not None
            rising = self.stack.weights[0] / self.stack.scale[0] >= 0
            best = self._stack_logit(inputs, np.full(len(whole), high if rising else low))
        return whole & (_sigmoid(best) >= at_least)

    def _fall_back(self, exc: Exception) -> None:
        with self._lock:
            if self._fallback is not None:
                return
            fallback = self.features or HitVerifier.load()
            stderr_notice(
                f"hybridllm: the cache reranker is unavailable here ({exc}); the semantic cache uses "
                "the feature verifier instead.\n"
            )
            self.threshold, self.metrics = fallback.threshold, dict(fallback.metrics)
            self.kind = fallback.kind
            self._fallback = fallback

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
