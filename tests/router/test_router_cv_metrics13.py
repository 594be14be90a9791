"""bench.router_cv's --curve figures with the fits replaced by fakes (no data, no training)."""

from __future__ import annotations

import numpy as np
import pytest

from bench import router_cv
from hybridllm.router import _train_cv, train
from hybridllm.router.dataset import RoutingData
from hybridllm.router.evaluate import router_metrics


class _Offset:
    """A scorer that ranks by the one feature, plus a level of its own (its training set's size)."""

    def __init__(self, level: float) -> None:
        self.level = level

    def predict(self, x: np.ndarray, emb: np.ndarray | None) -> np.ndarray:
        return x[:, 0] + self.level


def test_train_share_figures_are_fold_aligned_like_cross_validate(monkeypatch):
    rng = np.random.default_rng(0)
    n = 400
    prompts = [f"question {i}" for i in range(n)]
    signal = rng.random(n)
    weak = (rng.random(n) > signal).astype(float)  # the signal predicts where the weak model fails
    strong = np.ones(n)
    data = RoutingData(prompts=prompts, weak=weak, strong=strong, weak_col="w", strong_col="s")
    x = signal[:, None]

    def fake_fit(x_, gain, emb, hyper, sources, rows):
        return _Offset(float(rows.sum()))  # levels 100s apart: raw pooling ranks whole folds

    def fake_cv(d, x_, emb, *, num_folds=5, **kw):
        oof = x_[:, 0].copy()
        return train.CVResult(metrics=router_metrics(oof, d.weak, d.strong), fold_metrics=[], oof_scores=oof)

    monkeypatch.setattr(_train_cv, "_fit", fake_fit)
    monkeypatch.setattr(train, "cross_validate", fake_cv)
    out = router_cv._curve(data, np.zeros((n, 1)), x, test_rows=50)
    folds = train.fold_ids(prompts, 5)
    aligned = signal.copy()
    for f in range(5):  # the fold's own level out, as align_folds does: here just the signal's
        aligned[folds == f] += signal.mean() - signal[folds == f].mean()
    want = router_metrics(aligned, weak, strong)
    for frac in (0.5, 0.75):
        got = out[f"5fold_train_{frac}"]
        assert got["apgr"] == pytest.approx(want["apgr"], abs=1e-4)
        assert got["calls_at_95"] == pytest.approx(want["calls_at_95"], abs=1e-4)
