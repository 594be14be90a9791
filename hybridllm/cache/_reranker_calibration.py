"""Calibrating the fine-tuned reranker: the stacking regression, the threshold and the held-out metrics."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .._exceptions import DataError
from ._reranker_tuning import Say
from ._reranker_weights import _write
from .evaluate import PairSet, pair_metrics
from .prepare import reranker_dir
from .reranker import Reranker, stack_inputs
from .reranker_file import Stack, file_digest
from .train import choose_threshold, featurize, precision_at_recall
from .verifier import HitVerifier
from .verifier import default_path as features_default_path


def fit_stack(
    x: np.ndarray, y: np.ndarray, *, features_digest: str, folds: int = 2
) -> tuple[Stack, np.ndarray]:
    """The stacking regression on ``x`` and its out-of-fold probabilities (to set the threshold)."""
    from sklearn.linear_model import LogisticRegression

    if min(int((y == 1).sum()), int((y == 0).sum())) < 2 * folds:
        raise DataError(
            f"Too few validation pairs to calibrate the reranker ({int(y.sum())} same, "
            f"{int((y == 0).sum())} different); use a larger pairs file."
        )
    mean = x.mean(0)
    scale = x.std(0) + 1e-6
    xs = (x - mean) / scale
    oof = np.empty(len(x))
    fold = np.arange(len(x)) % folds
    for k in range(folds):
        model = LogisticRegression(C=1.0, max_iter=3000).fit(xs[fold != k], y[fold != k])
        oof[fold == k] = model.decision_function(xs[fold == k])
    model = LogisticRegression(C=1.0, max_iter=3000).fit(xs, y)
    stack = Stack(weights=model.coef_[0].astype(np.float64), bias=float(model.intercept_[0]), mean=mean,
                  scale=scale, features_digest=features_digest)
    return stack, 1.0 / (1.0 + np.exp(-oof))



def _calibrate(pairs: PairSet, split: np.ndarray, vecs: dict[str, np.ndarray], interim: Path, path: Path,
               arrays: dict[str, np.ndarray], wd: str, metrics: dict[str, float], *, threads: int,
               target_precision: float, min_similarity: float, say: Say) -> dict[str, float]:
    """Score the validation and test splits with the int8 model of ``interim``, fit the stack and
    the threshold, and write the finished reranker file to ``path``."""
    labels = np.asarray(pairs.labels, dtype=np.int8)
    va, te = np.nonzero(split == 1)[0], np.nonzero(split == 2)[0]
    say(f"preparing the int8 ONNX model in {reranker_dir(wd)}")
    reranker = Reranker(interim, num_threads=threads)
    features = HitVerifier.load(features_default_path())

    def inputs(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Reranker logits, stack inputs and cosines, the cache's way round (text_b asks)."""
        logits = reranker.logits([pairs.text_b[i] for i in idx], [pairs.text_a[i] for i in idx])
        feats, sims = featurize(pairs, vecs, idx, features.idf)
        return logits, stack_inputs(logits, feats, features), sims

    say("scoring the validation and test splits with the int8 ONNX model")
    (z_val, x_val, s_val), (z_test, x_test, s_test) = inputs(va), inputs(te)
    y_val, y_test = labels[va].astype(np.float64), labels[te]
    stack, p_val = fit_stack(x_val, y_val, features_digest=file_digest(features_default_path()))
    p_test = 1.0 / (1.0 + np.exp(-stack.logit(x_test)))
    threshold = choose_threshold(p_val, s_val, y_val, min_similarity=min_similarity, target=target_precision)
    hits_val = (s_val >= min_similarity) & (p_val >= threshold)
    hits_test = (s_test >= min_similarity) & (p_test >= threshold)
    metrics.update({f"val_{k}": v for k, v in pair_metrics(hits_val, labels[va]).items()})
    metrics.update({f"test_{k}": v for k, v in pair_metrics(hits_test, labels[te]).items()})
    # the reranker alone, at its own validation threshold, for comparison
    alone_val, alone_test = 1 / (1 + np.exp(-z_val)), 1 / (1 + np.exp(-z_test))
    t_alone = choose_threshold(alone_val, s_val, y_val, min_similarity=min_similarity,
                               target=target_precision)
    alone = pair_metrics((s_test >= min_similarity) & (alone_test >= t_alone), y_test)
    metrics.update(test_reranker_alone_precision=alone["precision"],
                   test_reranker_alone_recall=alone["recall"])
    for name, scores in (("stacked", np.where(s_test >= min_similarity, p_test, 0.0)),
                         ("reranker", np.where(s_test >= min_similarity, alone_test, 0.0)),
                         ("cosine", s_test)):
        for recall in (0.2, 0.4, 0.6):
            metrics[f"test_{name}_precision_at_recall_{recall}"] = precision_at_recall(scores, y_test, recall)
    metrics.update(threshold=threshold, target_precision=target_precision)
    _write(path, arrays, threshold=threshold, min_similarity=min_similarity, digest=wd, metrics=metrics,
           stack=stack)
    say(f"wrote {path}")
    return metrics

