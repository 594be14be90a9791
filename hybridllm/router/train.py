"""Training a router on a RouteLLM-format CSV, with cross-validation folded by question.

Label: 1 where the strong model was needed (the weak model failed and the strong one succeeded).
Folds come from a hash of the prompt text, so copies of one question always share a fold and no
test question is ever trained on. The shipped threshold is the score quantile that sends the
cross-validated ``calls_at_95`` fraction of the training prompts to the cloud: on traffic like the
training data, the cheapest setting that keeps 95% of the strong model's quality.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._exceptions import DataError
from .classifier import LogisticScorer
from .dataset import RoutingData, load_routellm_csv, texts_digest
from .evaluate import router_metrics
from .features import cached_embeddings, feature_matrix
from .router import Router

DEFAULT_C = 0.02
DEFAULT_FOLDS = 5
TRAIN_COMMAND = (
    "hybridllm router train --data ../shared/data/routellm/mmlu_responses.csv --out models/router"
)


def fold_ids(prompts: list[str], num_folds: int) -> np.ndarray:
    """Fold of each prompt from a hash of its text: ``[n]`` ints in ``[0, num_folds)``."""
    return np.asarray(
        [int(hashlib.sha1(p.encode("utf-8", "surrogatepass")).hexdigest()[:12], 16) % num_folds
         for p in prompts],
        dtype=np.int64,
    )


@dataclass(frozen=True)
class CVResult:
    metrics: dict[str, float]  # pooled out-of-fold scores
    fold_metrics: list[dict[str, float]]
    oof_scores: np.ndarray  # [n]


def _round(metrics: dict[str, float]) -> dict[str, float]:
    return {k: (int(v) if k == "n" else round(float(v), 4)) for k, v in metrics.items()}


def cross_validate(
    data: RoutingData, x: np.ndarray, *, c: float = DEFAULT_C, num_folds: int = DEFAULT_FOLDS
) -> CVResult:
    """Out-of-fold scores for every prompt and the router metrics on them."""
    if num_folds < 2:
        raise DataError(f"Cross-validation needs at least 2 folds, got {num_folds}.")
    folds = fold_ids(data.prompts, num_folds)
    y = data.labels
    oof = np.zeros(len(y), dtype=np.float64)
    per_fold = []
    for f in range(num_folds):
        test = folds == f
        if not test.any() or test.all():
            raise DataError(f"Too few distinct prompts for {num_folds}-fold cross-validation.")
        scorer = LogisticScorer.fit(x[~test], y[~test], c=c)
        oof[test] = scorer.predict(x[test])
        per_fold.append(_round(router_metrics(oof[test], data.weak[test], data.strong[test])))
    pooled = _round(router_metrics(oof, data.weak, data.strong))
    return CVResult(metrics=pooled, fold_metrics=per_fold, oof_scores=oof)


def features_for(data: RoutingData, *, use_embedding: bool) -> np.ndarray:
    embeddings = cached_embeddings(data.prompts) if use_embedding else None
    return feature_matrix(data.prompts, use_embedding=use_embedding, embeddings=embeddings)


def train_router(
    data: RoutingData,
    *,
    use_embedding: bool = True,
    c: float = DEFAULT_C,
    num_folds: int = DEFAULT_FOLDS,
    x: np.ndarray | None = None,
    source: str = "",
) -> Router:
    """Cross-validate, then fit on all rows; the router's ``info`` records both."""
    started = time.perf_counter()
    if x is None:
        x = features_for(data, use_embedding=use_embedding)
    cv = cross_validate(data, x, c=c, num_folds=num_folds)
    scorer = LogisticScorer.fit(x, data.labels, c=c)
    train_scores = np.asarray(scorer.predict(x), dtype=np.float64)
    cloud_fraction = float(cv.metrics["calls_at_95"])
    threshold = float(np.quantile(train_scores, 1.0 - cloud_fraction)) if cloud_fraction > 0 else 1.0
    info: dict[str, Any] = {
        "training": {
            "command": TRAIN_COMMAND if not source else f"hybridllm router train --data {source}",
            "data": Path(source).name if source else "",
            "data_digest": texts_digest(data.prompts),
            "n": len(data.prompts),
            "weak_col": data.weak_col,
            "strong_col": data.strong_col,
            "label": "weak wrong and strong right",
            "positive_rate": round(float(data.labels.mean()), 4),
            "c": c,
            "num_folds": num_folds,
            "threshold_rule": "train-score quantile sending the CV calls_at_95 fraction to cloud",
            "seconds": round(time.perf_counter() - started, 1),
        },
        "metrics": {
            "cv": cv.metrics,
            "cv_per_fold": cv.fold_metrics,
            "train": _round(router_metrics(train_scores, data.weak, data.strong)),
        },
    }
    return Router(scorer=scorer, threshold=threshold, use_embedding=use_embedding, info=info)


def train_from_csv(
    path: str | Path,
    out_dir: str | Path,
    *,
    weak_col: str | None = None,
    strong_col: str | None = None,
    use_embedding: bool = True,
    c: float = DEFAULT_C,
    num_folds: int = DEFAULT_FOLDS,
) -> Router:
    data = load_routellm_csv(path, weak_col=weak_col, strong_col=strong_col)
    if len(np.unique(data.labels)) < 2:
        raise DataError(
            f"{path}: no prompt (or every prompt) needs the strong model, so there is nothing to "
            "learn; label more varied prompts."
        )
    router = train_router(data, use_embedding=use_embedding, c=c, num_folds=num_folds,
                          source=str(path))
    router.save(out_dir)
    return router
