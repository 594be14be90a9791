"""Training a router on a RouteLLM-format CSV, with cross-validation folded by question.

Label: the strong model was needed (the weak model failed where the strong one succeeded). The
scorer (see ``classifier``) learns the per-prompt quality gain ``strong - weak``, whose positive
class is that label. Folds come from a hash of the prompt text, so copies of one question share a
fold and no test question is ever trained on (nor used as a neighbor). The shipped threshold is the
score quantile that sends the cross-validated ``calls_at_95`` fraction of the training prompts to
the cloud: on traffic like the training data, the cheapest setting keeping 95% of strong quality.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._exceptions import DataError
from .calibrate import calibrate_logprob_threshold
from .classifier import (
    DEFAULT_C,
    DEFAULT_DIMS,
    DEFAULT_K,
    DEFAULT_MIX,
    DEFAULT_TOPIC_MIX,
    DEFAULT_TOPICS,
    GainScorer,
)
from .dataset import RoutingData, load_routellm_csv, texts_digest
from .embedding_cache import cached_embeddings
from .evaluate import router_metrics
from .features import TEXT_FEATURES, feature_matrix
from .fit import fit_gain_scorer
from .router import DEFAULT_LOGPROB_THRESHOLD, Router

DEFAULT_FOLDS = 5
SHIPPED_COMMAND = (
    "hybridllm router train --data ../shared/data/routellm/mmlu_responses.csv --out hybridllm/_data/router"
)


def fold_ids(prompts: list[str], num_folds: int, *, salt: str = "") -> np.ndarray:
    """Fold of each prompt from a hash of its text: ``[n]`` ints in ``[0, num_folds)``. Another
    ``salt`` gives another assignment, still by question (``bench.router_cv`` compares them)."""
    return np.asarray(
        [int(hashlib.sha1((salt + p).encode("utf-8", "surrogatepass")).hexdigest()[:12], 16)
         % num_folds for p in prompts],
        dtype=np.int64,
    )


@dataclass(frozen=True)
class Hyper:
    c: float = DEFAULT_C
    k: int = DEFAULT_K
    mix: float = DEFAULT_MIX
    dims: int = DEFAULT_DIMS
    topics: int = DEFAULT_TOPICS
    topic_mix: float = DEFAULT_TOPIC_MIX


@dataclass(frozen=True)
class CVResult:
    metrics: dict[str, float]  # on the pooled out-of-fold scores
    fold_metrics: list[dict[str, float]]
    oof_scores: np.ndarray  # [n]


def _round(metrics: dict[str, float]) -> dict[str, float]:
    return {k: (int(v) if k == "n" else round(float(v), 4)) for k, v in metrics.items()}


def _gain(data: RoutingData) -> np.ndarray:
    return (data.strong - data.weak).astype(np.int64)


def _fit(x: np.ndarray, gain: np.ndarray, emb: np.ndarray | None, hp: Hyper) -> GainScorer:
    return fit_gain_scorer(x, gain, embeddings=emb, c=hp.c, k=hp.k, mix=hp.mix, dims=hp.dims,
                          topics=hp.topics, topic_mix=hp.topic_mix)


def cross_validate(
    data: RoutingData, x: np.ndarray, emb: np.ndarray | None, *, hyper: Hyper = Hyper(),
    num_folds: int = DEFAULT_FOLDS, fold_salt: str = "",
) -> CVResult:
    """Out-of-fold scores for every prompt and the router metrics on them."""
    if num_folds < 2:
        raise DataError(f"Cross-validation needs at least 2 folds, got {num_folds}.")
    folds = fold_ids(data.prompts, num_folds, salt=fold_salt)
    gain = _gain(data)
    oof = np.zeros(len(gain), dtype=np.float64)
    per_fold = []
    for f in range(num_folds):
        test = folds == f
        if not test.any() or test.all():
            raise DataError(f"Too few distinct prompts for {num_folds}-fold cross-validation.")
        tr_emb = None if emb is None else emb[~test]
        scorer = _fit(x[~test], gain[~test], tr_emb, hyper)
        oof[test] = scorer.predict(x[test], None if emb is None else emb[test])
        per_fold.append(_round(router_metrics(oof[test], data.weak[test], data.strong[test])))
    pooled = _round(router_metrics(oof, data.weak, data.strong))
    return CVResult(metrics=pooled, fold_metrics=per_fold, oof_scores=oof)


def train_router(
    data: RoutingData,
    *,
    use_embedding: bool = True,
    hyper: Hyper = Hyper(),
    num_folds: int = DEFAULT_FOLDS,
    embeddings: np.ndarray | None = None,
    source: str = "",
    command: str = "",
) -> Router:
    """Cross-validate, then fit on all rows; the router's ``info`` records both."""
    started = time.perf_counter()
    emb = None
    if use_embedding:
        emb = cached_embeddings(data.prompts) if embeddings is None else embeddings
    x = feature_matrix(data.prompts, use_embedding=use_embedding, embeddings=emb)
    cv = cross_validate(data, x, emb, hyper=hyper, num_folds=num_folds)
    scorer = _fit(x, _gain(data), emb, hyper)
    train_scores = np.asarray(scorer.predict(x, emb), dtype=np.float64)
    cloud_fraction = float(cv.metrics["calls_at_95"])
    threshold = 1.0
    if cloud_fraction > 0:
        threshold = float(np.quantile(train_scores, 1.0 - cloud_fraction))
    logprob_threshold = DEFAULT_LOGPROB_THRESHOLD
    if data.edge_logprob is not None:
        logprob_threshold = calibrate_logprob_threshold(data.edge_logprob, data.weak)
    info: dict[str, Any] = {
        "training": {
            "command": command or SHIPPED_COMMAND,
            "data": Path(source).name if source else "",
            "data_digest": texts_digest(data.prompts),
            "n": len(data.prompts),
            "weak_col": data.weak_col,
            "strong_col": data.strong_col,
            "label": "weak wrong and strong right (gain +1); scorer target: strong - weak",
            "positive_rate": round(float(data.labels.mean()), 4),
            "c": hyper.c,
            "k": hyper.k,
            "mix": hyper.mix if use_embedding else 0.0,
            "dims": hyper.dims,
            "topics": hyper.topics,
            "topic_mix": scorer.topic_mix,
            "num_folds": num_folds,
            "num_text_features": len(TEXT_FEATURES),
            "threshold_rule": "train-score quantile sending the CV calls_at_95 fraction to cloud",
            "seconds": round(time.perf_counter() - started, 1),
        },
        "metrics": {
            "cv": cv.metrics,
            "cv_per_fold": cv.fold_metrics,
            "train": _round(router_metrics(train_scores, data.weak, data.strong)),
        },
    }
    return Router(scorer=scorer, threshold=threshold, use_embedding=use_embedding,
                  logprob_threshold=logprob_threshold, info=info)


def train_from_csv(
    path: str | Path,
    out_dir: str | Path,
    *,
    weak_col: str | None = None,
    strong_col: str | None = None,
    use_embedding: bool = True,
    hyper: Hyper = Hyper(),
    num_folds: int = DEFAULT_FOLDS,
) -> Router:
    data = load_routellm_csv(path, weak_col=weak_col, strong_col=strong_col)
    if not np.any(data.labels == 1) or np.all(data.labels == 1):
        raise DataError(
            f"{path}: no prompt (or every prompt) needs the strong model, so there is nothing to "
            "learn; label more varied prompts."
        )
    parts = ["hybridllm router train --data", str(path)]
    if weak_col:
        parts += ["--weak-col", repr(weak_col)]
    if strong_col:
        parts += ["--strong-col", repr(strong_col)]
    parts += ["--out", str(out_dir)]
    router = train_router(data, use_embedding=use_embedding, hyper=hyper, num_folds=num_folds,
                          source=str(path), command=" ".join(parts))
    router.save(out_dir)
    return router
