"""The scorer's classifier: standardization plus L2-regularized logistic regression.

Fitted with scikit-learn, stored and evaluated as plain numpy arrays, so a router file is a
``.npz`` of weights and loading it runs no code:

    z = (x - mean) / scale,     score = sigmoid(z · coef + intercept)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._exceptions import RouterError, RouterFileError

ARRAY_NAMES = ("mean", "scale", "coef", "intercept")


@dataclass(frozen=True)
class LogisticScorer:
    mean: np.ndarray  # [d]
    scale: np.ndarray  # [d]
    coef: np.ndarray  # [d]
    intercept: float

    @property
    def num_features(self) -> int:
        return int(self.coef.shape[0])

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, *, c: float = 0.05, seed: int = 0) -> LogisticScorer:
        """Fit on ``x`` ``[n, d]`` and 0/1 labels ``y`` ``[n]``; ``c`` is the inverse L2 strength."""
        from sklearn.linear_model import LogisticRegression

        y = np.asarray(y)
        if x.ndim != 2 or len(x) != len(y):
            raise RouterError(f"Features {x.shape} and labels {y.shape} do not match.")
        if len(np.unique(y)) < 2:
            raise RouterError(
                "Every training label is the same, so there is nothing to learn: the data needs "
                "prompts where the strong model was needed (weak wrong, strong right) and others."
            )
        x64 = np.asarray(x, dtype=np.float64)
        mean = x64.mean(axis=0)
        scale = x64.std(axis=0)
        scale[scale < 1e-8] = 1.0  # constant columns: leave them at zero after centering
        z = (x64 - mean) / scale
        model = LogisticRegression(C=c, max_iter=2000, random_state=seed)
        model.fit(z, y)
        return cls(
            mean=mean.astype(np.float32),
            scale=scale.astype(np.float32),
            coef=model.coef_[0].astype(np.float32),
            intercept=float(model.intercept_[0]),
        )

    def decision(self, x: np.ndarray) -> np.ndarray:
        """The logit: ``[n]`` for ``x`` ``[n, d]``, or a scalar array for ``[d]``."""
        z = (x - self.mean) / self.scale
        return z @ self.coef + self.intercept

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Probability that the strong model is needed, in [0, 1]."""
        logit = np.clip(self.decision(x), -60.0, 60.0)
        return 1.0 / (1.0 + np.exp(-logit))

    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "mean": self.mean,
            "scale": self.scale,
            "coef": self.coef,
            "intercept": np.asarray([self.intercept], dtype=np.float32),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], *, num_features: int) -> LogisticScorer:
        missing = [k for k in ARRAY_NAMES if k not in arrays]
        if missing:
            raise RouterFileError(f"The router weights lack {missing}; retrain the router.")
        mean, scale, coef = (np.asarray(arrays[k], dtype=np.float32) for k in ARRAY_NAMES[:3])
        intercept = np.asarray(arrays["intercept"], dtype=np.float32).reshape(-1)
        shapes_ok = mean.shape == scale.shape == coef.shape == (num_features,)
        if not shapes_ok or intercept.shape != (1,):
            raise RouterFileError(
                f"The router weights have shapes {mean.shape}, {scale.shape}, {coef.shape}, "
                f"{intercept.shape}, expected ({num_features},) each and (1,); retrain the router."
            )
        finite = all(np.all(np.isfinite(a)) for a in (mean, scale, coef, intercept))
        if not finite or np.any(scale == 0):
            raise RouterFileError("The router weights hold NaN, inf or zero scales; retrain it.")
        return cls(mean=mean, scale=scale, coef=coef, intercept=float(intercept[0]))
