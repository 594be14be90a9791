"""The scorer: two estimates of the quality a cloud call adds, averaged and mapped to [0, 1].

Per prompt the RouteLLM curve gains ``strong - weak`` in {-1, 0, +1} when the prompt goes to the
strong model (+1 is the training label "weak wrong and strong right"). Both parts estimate its
expectation, so the score ranks prompts by expected gain:

    linear     multinomial logistic regression (L2) over standardized text features + embedding,
               g_lin = P(+1 | x) - P(-1 | x)
    neighbors  mean gain of the k most cosine-similar training prompts, g_nn; similarity in the
               embeddings' top principal components after centering (removing the direction every
               MiniLM vector shares sharpens the neighborhoods; 64 dims also keep a lookup well
               under a millisecond)
    score      (1 + mix * g_nn + (1 - mix) * g_lin) / 2          (g_lin alone without embeddings)

Fitted with scikit-learn, stored and evaluated as numpy arrays (``.npz``, no pickle).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._exceptions import RouterError, RouterFileError

DEFAULT_C = 0.002
DEFAULT_K = 100
DEFAULT_MIX = 0.7
DEFAULT_DIMS = 64


@dataclass(frozen=True)
class GainScorer:
    mean: np.ndarray  # [d]
    scale: np.ndarray  # [d]
    coef: np.ndarray  # [num_classes, d]
    intercept: np.ndarray  # [num_classes]
    classes: np.ndarray  # [num_classes] gains, a subset of {-1, 0, 1}
    proj_mean: np.ndarray | None = None  # [emb_dim]
    proj: np.ndarray | None = None  # [dims, emb_dim] principal axes
    refs: np.ndarray | None = None  # [m, dims] projected unit vectors of the training prompts
    ref_gains: np.ndarray | None = None  # [m]
    k: int = DEFAULT_K
    mix: float = DEFAULT_MIX

    @property
    def num_features(self) -> int:
        return int(self.coef.shape[1])

    @property
    def uses_neighbors(self) -> bool:
        return self.refs is not None and self.mix > 0

    @classmethod
    def fit(
        cls,
        x: np.ndarray,
        gain: np.ndarray,
        *,
        embeddings: np.ndarray | None = None,
        c: float = DEFAULT_C,
        k: int = DEFAULT_K,
        mix: float = DEFAULT_MIX,
        dims: int = DEFAULT_DIMS,
    ) -> GainScorer:
        """``x`` ``[n, d]`` features, ``gain`` ``[n]`` in {-1, 0, 1}; ``embeddings`` ``[n, e]``
        enables the neighbor part."""
        from sklearn.linear_model import LogisticRegression

        g = np.asarray(gain).astype(np.int64)
        if x.ndim != 2 or len(x) != len(g):
            raise RouterError(f"Features {x.shape} and labels {g.shape} do not match.")
        if not np.any(g == 1) or np.all(g == 1):
            raise RouterError(
                "The data needs prompts where the strong model was needed (weak wrong, strong "
                "right) and prompts where it was not; otherwise there is nothing to learn."
            )
        x64 = np.asarray(x, dtype=np.float64)
        mean = x64.mean(axis=0)
        scale = x64.std(axis=0)
        scale[scale < 1e-8] = 1.0  # constant columns stay at zero after centering
        model = LogisticRegression(C=c, max_iter=3000)
        model.fit((x64 - mean) / scale, g)
        coef, intercept = model.coef_, model.intercept_
        if coef.shape[0] == 1:  # two classes: sklearn stores one row for the second class
            coef = np.vstack([np.zeros_like(coef), coef])
            intercept = np.concatenate([[0.0], intercept])
        proj_mean = proj = refs = ref_gains = None
        if embeddings is not None and mix > 0:
            emb = np.asarray(embeddings, dtype=np.float32)
            proj_mean = emb.mean(axis=0)
            _, _, vt = np.linalg.svd(emb - proj_mean, full_matrices=False)
            proj = vt[: min(dims, vt.shape[0])].astype(np.float32)
            # stored as float16: round here so training scores match the saved file exactly
            refs = _project(emb, proj_mean, proj).astype(np.float16).astype(np.float32)
            ref_gains = g.astype(np.float32)
        return cls(
            mean=mean.astype(np.float32), scale=scale.astype(np.float32),
            coef=coef.astype(np.float32), intercept=intercept.astype(np.float32),
            classes=model.classes_.astype(np.float32), proj_mean=proj_mean, proj=proj,
            refs=refs, ref_gains=ref_gains,
            k=int(min(k, len(g))), mix=float(mix) if embeddings is not None else 0.0,
        )

    def linear_gain(self, x: np.ndarray) -> np.ndarray:
        z = (np.atleast_2d(x) - self.mean) / self.scale
        logits = z @ self.coef.T + self.intercept  # [n, num_classes]
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        return p @ self.classes  # [n]

    def neighbor_gain(self, emb: np.ndarray) -> np.ndarray:
        if self.refs is None or self.ref_gains is None or self.proj is None \
                or self.proj_mean is None:
            raise RouterError("This router has no neighbor part.")
        z = _project(np.atleast_2d(emb).astype(np.float32), self.proj_mean, self.proj)
        if len(z) == 1:
            # one request: a plain loop, since waking BLAS threads costs ~10 ms on a busy machine
            sims = np.einsum("md,d->m", self.refs, z[0])[None, :]  # [1, m]
        else:
            sims = z @ self.refs.T  # [n, m]
        k = min(self.k, sims.shape[1])
        top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        return self.ref_gains[top].mean(axis=1)

    def predict(self, x: np.ndarray, emb: np.ndarray | None = None) -> np.ndarray:
        """Scores in [0, 1] for ``x`` ``[n, d]`` (and ``emb`` ``[n, e]`` with neighbors)."""
        g = self.linear_gain(x)
        if self.uses_neighbors:
            if emb is None:
                raise RouterError("This router needs the prompt embedding to score.")
            g = self.mix * self.neighbor_gain(emb) + (1.0 - self.mix) * g
        return np.clip((1.0 + g) / 2.0, 0.0, 1.0)

    def to_arrays(self) -> dict[str, np.ndarray]:
        arrays = {
            "mean": self.mean, "scale": self.scale, "coef": self.coef,
            "intercept": self.intercept, "classes": self.classes,
            "k": np.asarray([self.k], np.int64), "mix": np.asarray([self.mix], np.float32),
        }
        if self.refs is not None and self.ref_gains is not None and self.proj is not None \
                and self.proj_mean is not None:
            arrays["proj_mean"] = self.proj_mean
            arrays["proj"] = self.proj
            arrays["refs"] = self.refs.astype(np.float16)
            arrays["ref_gains"] = self.ref_gains.astype(np.int8)
        return arrays

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray], *, num_features: int) -> GainScorer:
        need = ("mean", "scale", "coef", "intercept", "classes", "k", "mix")
        missing = [n for n in need if n not in a]
        if missing:
            raise RouterFileError(f"The router weights lack {missing}; retrain the router.")
        mean, scale = (np.asarray(a[n], np.float32) for n in ("mean", "scale"))
        coef, intercept = np.asarray(a["coef"], np.float32), np.asarray(a["intercept"], np.float32)
        classes = np.asarray(a["classes"], np.float32)
        nc = len(classes)
        if not (mean.shape == scale.shape == (num_features,) and coef.shape == (nc, num_features)
                and intercept.shape == (nc,)):
            raise RouterFileError(
                f"The router weights have shapes mean {mean.shape}, coef {coef.shape}, intercept "
                f"{intercept.shape}; this version needs {num_features} features. Retrain it."
            )
        arrays = (mean, scale, coef, intercept, classes)
        if not all(np.all(np.isfinite(v)) for v in arrays) or np.any(scale == 0):
            raise RouterFileError("The router weights hold NaN, inf or zero scales; retrain it.")
        proj_mean = proj = refs = ref_gains = None
        if "refs" in a:
            if not all(n in a for n in ("proj_mean", "proj", "ref_gains")):
                raise RouterFileError("The router's neighbor part is incomplete; retrain it.")
            refs = np.asarray(a["refs"], np.float32)
            ref_gains = np.asarray(a["ref_gains"], np.float32)
            proj_mean = np.asarray(a["proj_mean"], np.float32)
            proj = np.asarray(a["proj"], np.float32)
            ok = (refs.ndim == 2 and ref_gains.shape == (len(refs),) and proj.ndim == 2
                  and proj.shape == (refs.shape[1], proj_mean.shape[0]))
            if not ok:
                raise RouterFileError("The router's neighbor arrays do not match; retrain it.")
        return cls(mean=mean, scale=scale, coef=coef, intercept=intercept, classes=classes,
                   proj_mean=proj_mean, proj=proj, refs=refs, ref_gains=ref_gains,
                   k=int(np.asarray(a["k"]).reshape(-1)[0]),
                   mix=float(np.asarray(a["mix"]).reshape(-1)[0]))


def _project(emb: np.ndarray, mean: np.ndarray, proj: np.ndarray) -> np.ndarray:
    """Center, project onto the principal axes and renormalize: ``[n, dims]``."""
    z = (emb - mean) @ proj.T
    return z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
