"""The scorer: three estimates of the quality a cloud call adds, averaged and mapped to [0, 1].

Per prompt the RouteLLM curve gains ``strong - weak`` in {-1, 0, +1} when the prompt goes to the
strong model (+1 is the training label "weak wrong and strong right"). Every part estimates its
expectation, so the score ranks prompts by expected gain:

    linear     multinomial logistic regression (L2) over standardized text features + embedding,
               g_lin = P(+1 | x) - P(-1 | x)
    neighbors  mean gain of the k most cosine-similar training prompts, g_nn; similarity in the
               embeddings' top principal components after centering (removing the direction every
               MiniLM vector shares sharpens the neighborhoods; 128 dims keep a lookup under a
               millisecond)
    topics     k-means clusters of the training prompts in the same space; a prompt gets the mean
               gain of its cluster, shrunk toward the overall mean by ``SHRINK`` pseudo-prompts,
               averaged over several k-means restarts, g_top. Where the gain depends on the subject
               (it does: on MMLU the mean gain of the true subject alone reaches calls_at_95 0.45),
               a cluster of ~150 prompts estimates it with less noise than 50 neighbors do.
    score      (1 + topic_mix * g_top + (1 - topic_mix) * (mix * g_nn + (1 - mix) * g_lin)) / 2
               (g_lin alone without embeddings)

Evaluated here with numpy only; fitted with scikit-learn by :mod:`.fit` (build code); stored as
numpy arrays (``.npz``, no pickle).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._exceptions import RouterError, RouterFileError

DEFAULT_C = 0.002
DEFAULT_K = 50
DEFAULT_MIX = 0.8
DEFAULT_DIMS = 128
DEFAULT_TOPICS = 60
DEFAULT_TOPIC_MIX = 0.5
_NEIGHBOR_ROWS = 2048  # rows of a batch scored at once: 2048 x 60,000 float32 similarities, 0.5 GB
TOPIC_RESTARTS = 5
SHRINK = 10.0
_MIN_SCALE = 1e-9  # the fit's floor is 1e-8 (float32 rounds it to just below)
_MAX_EMBEDDING_PART = 1e6  # far above a fitted value (<= 1), far below a float32 overflow


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
    centroids: np.ndarray | None = None  # [restarts, topics, dims]
    topic_gains: np.ndarray | None = None  # [restarts, topics]
    topic_mix: float = 0.0

    @property
    def num_features(self) -> int:
        return int(self.coef.shape[1])

    @property
    def uses_neighbors(self) -> bool:
        return self.refs is not None and self.mix > 0

    @property
    def uses_topics(self) -> bool:
        return self.centroids is not None and self.topic_mix > 0

    def linear_gain(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):
            z = (np.atleast_2d(x) - self.mean) / self.scale
            logits = z @ self.coef.T + self.intercept  # [n, num_classes]
        if not np.all(np.isfinite(logits)):
            # weights near float32's limits (a coef of 1e38) overflowed a logit to inf, and inf - inf
            # scored NaN, which never reaches the threshold; float64 holds any finite float32 weights
            z = (np.atleast_2d(x).astype(np.float64) - self.mean) / self.scale
            logits = z @ self.coef.T + self.intercept
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        return p @ self.classes  # [n]

    def _projected(self, emb: np.ndarray) -> np.ndarray:
        if self.proj is None or self.proj_mean is None:
            raise RouterError("This router has no embedding part.")
        return project_embeddings(np.atleast_2d(emb).astype(np.float32), self.proj_mean, self.proj)

    def neighbor_gain(self, emb: np.ndarray, z: np.ndarray | None = None) -> np.ndarray:
        if self.refs is None or self.ref_gains is None:
            raise RouterError("This router has no neighbor part.")
        z = self._projected(emb) if z is None else z
        k = min(self.k, len(self.refs))
        if len(z) == 1:
            # one request: a plain loop, since waking BLAS threads costs ~10 ms on a busy machine
            sims = np.einsum("md,d->m", self.refs, z[0])
            return self.ref_gains[np.argpartition(-sims, k - 1)[:k]][None, :].mean(axis=1)
        # a batch in slices of rows: [n, m] similarities at once would be 14 GB for a file of
        # 60,000 prompts scored against itself (and argpartition's int64 copy twice that)
        out = np.empty(len(z), dtype=np.float64)
        # two buffers for all slices: each fresh [rows, m] array faults its pages in again (half
        # the time of a retrain's scoring went to allocating them slice after slice)
        shape = (min(len(z), _NEIGHBOR_ROWS), len(self.refs))
        sims, work = (np.empty(shape, np.result_type(z, self.refs)) for _ in range(2))
        for start in range(0, len(z), _NEIGHBOR_ROWS):
            rows = z[start : start + _NEIGHBOR_ROWS]
            np.matmul(rows, self.refs.T, out=sims[: len(rows)])  # [rows, m]
            out[start : start + len(rows)] = top_k_mean(sims[: len(rows)], self.ref_gains, k, work)
        return out

    def topic_gain(self, emb: np.ndarray, z: np.ndarray | None = None) -> np.ndarray:
        if self.centroids is None or self.topic_gains is None:
            raise RouterError("This router has no topic part.")
        z = self._projected(emb) if z is None else z
        gains = np.zeros(len(z), dtype=np.float64)
        for cent, cgain in zip(self.centroids, self.topic_gains, strict=True):
            # nearest centroid: argmin |z - c|^2 = argmax z.c - |c|^2 / 2
            near = np.argmax(z @ cent.T - 0.5 * np.einsum("td,td->t", cent, cent), axis=1)
            gains += cgain[near]
        return gains / len(self.centroids)

    def predict(self, x: np.ndarray, emb: np.ndarray | None = None) -> np.ndarray:
        """Scores in [0, 1] for ``x`` ``[n, d]`` (and ``emb`` ``[n, e]`` with neighbors)."""
        g = self.linear_gain(x)
        if self.uses_neighbors or self.uses_topics:
            if emb is None:
                raise RouterError("This router needs the prompt embedding to score.")
            z = self._projected(emb)
            if self.uses_neighbors:
                g = self.mix * self.neighbor_gain(emb, z) + (1.0 - self.mix) * g
            if self.uses_topics:
                g = self.topic_mix * self.topic_gain(emb, z) + (1.0 - self.topic_mix) * g
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
            graded = bool(np.any(self.ref_gains % 1 != 0))
            arrays["ref_gains"] = self.ref_gains.astype(np.float16 if graded else np.int8)
        if self.centroids is not None and self.topic_gains is not None:
            arrays["centroids"] = self.centroids
            arrays["topic_gains"] = self.topic_gains
            arrays["topic_mix"] = np.asarray([self.topic_mix], np.float32)
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
        nc = len(classes) if classes.ndim == 1 else -1  # a [3, 1] one scored [n, 1] gains
        if not (mean.shape == scale.shape == (num_features,) and coef.shape == (nc, num_features)
                and intercept.shape == (nc,)):
            raise RouterFileError(
                f"The router weights have shapes mean {mean.shape}, coef {coef.shape}, intercept "
                f"{intercept.shape}, classes {classes.shape}; this version needs {num_features} "
                "features and one class per row of coef. Retrain it."
            )
        arrays = {"mean": mean, "scale": scale, "coef": coef, "intercept": intercept, "classes": classes}
        bad = [n for n, v in arrays.items() if not np.all(np.isfinite(v))]
        if bad:
            raise RouterFileError(f"The router weights hold NaN, inf or zero scales (in {', '.join(bad)}); "
                                  "retrain it.")
        # the fit writes standard deviations, 1 for a constant column: one below its floor of 1e-8
        # (or negative) is damage, and a feature divided by it outweighed every other
        if np.any(scale < _MIN_SCALE):
            raise RouterFileError(f"The router weights' scale holds {float(scale.min()):g}, below the "
                                  f"{_MIN_SCALE:g} the fit writes at least; retrain it.")
        _check_gains(classes, "classes")
        proj_mean = proj = refs = ref_gains = None
        if "refs" in a:
            if not all(n in a for n in ("proj_mean", "proj", "ref_gains")):
                raise RouterFileError("The router's neighbor part is incomplete; retrain it.")
            refs = np.asarray(a["refs"], np.float32)
            ref_gains = np.asarray(a["ref_gains"], np.float32)
            proj_mean = np.asarray(a["proj_mean"], np.float32)
            proj = np.asarray(a["proj"], np.float32)
            # proj_mean one-dimensional: one of shape [e, 1] broadcast each prompt into e rows, and
            # the router scored the first of those (a single scorer: silently) or failed at the
            # first request (a mixture's experts: numpy's "all input arrays must have the same shape")
            ok = (refs.ndim == 2 and len(refs) > 0 and ref_gains.shape == (len(refs),)
                  and proj_mean.ndim == 1
                  and proj.ndim == 2 and proj.shape == (refs.shape[1], proj_mean.shape[0]))
            if not ok:
                raise RouterFileError("The router's neighbor arrays do not match; retrain it.")
            # a NaN here makes every score NaN, and a NaN score never reaches the threshold: the
            # router would keep all traffic on the device without a word
            parts = {"refs": refs, "ref_gains": ref_gains, "proj_mean": proj_mean, "proj": proj}
            bad = [n for n, v in parts.items() if not np.all(np.isfinite(v))]
            if bad:
                raise RouterFileError(f"The router's neighbor arrays hold NaN or inf (in {', '.join(bad)}); "
                                      "retrain it.")
            _check_gains(ref_gains, "ref_gains")
            for n in ("refs", "proj_mean", "proj"):
                _check_bound(parts[n], n)
        centroids = topic_gains = None
        topic_mix = 0.0
        if "centroids" in a:
            if refs is None or not all(n in a for n in ("topic_gains", "topic_mix")):
                raise RouterFileError("The router's topic part is incomplete; retrain it.")
            centroids = np.asarray(a["centroids"], np.float32)
            topic_gains = np.asarray(a["topic_gains"], np.float32)
            topic_mix = _one_number(a, "topic_mix")
            # no restart scored NaN (a mean over none), no topic an argmax error
            ok = (centroids.ndim == 3 and min(centroids.shape[:2]) > 0 and centroids.shape[2] == refs.shape[1]
                  and topic_gains.shape == centroids.shape[:2] and 0.0 <= topic_mix <= 1.0
                  and bool(np.all(np.isfinite(centroids))) and bool(np.all(np.isfinite(topic_gains))))
            if not ok:
                raise RouterFileError("The router's topic arrays do not match; retrain it.")
            _check_gains(topic_gains, "topic_gains")
            _check_bound(centroids, "centroids")
        k, mix = _one_number(a, "k"), _one_number(a, "mix")
        if k != int(k) or k < 1:
            raise RouterFileError(f"The router weights have k {k:g}, not a whole number of neighbors "
                                  "of at least 1; retrain it.")
        if not 0.0 <= mix <= 1.0:
            raise RouterFileError(f"The router weights have mix {mix:g}, not a share in [0, 1]; retrain it.")
        return cls(mean=mean, scale=scale, coef=coef, intercept=intercept, classes=classes,
                   proj_mean=proj_mean, proj=proj, refs=refs, ref_gains=ref_gains, k=int(k), mix=mix,
                   centroids=centroids, topic_gains=topic_gains, topic_mix=topic_mix)


def _check_gains(v: np.ndarray, name: str) -> None:
    """Gains are strong - weak scores, in [-1, 1]; one outside made every score 0 or 1 (clipped)."""
    if v.size and (float(v.min()) < -1.0 or float(v.max()) > 1.0):
        raise RouterFileError(f"The router weights' {name} holds {float(np.abs(v).max()):g}, a gain outside "
                              "[-1, 1]; retrain it.")


def _check_bound(v: np.ndarray, name: str) -> None:
    """The embedding side is scored in float32: fitted, these are unit vectors, their mean and
    centroids (|v| <= 1); one beyond ``_MAX_EMBEDDING_PART`` overflows a projection to inf, then NaN."""
    if v.size and float(np.abs(v).max()) > _MAX_EMBEDDING_PART:
        raise RouterFileError(f"The router weights' {name} holds {float(np.abs(v).max()):g}, beyond the "
                              f"{_MAX_EMBEDDING_PART:g} an embedding part can hold; retrain it.")


def _one_number(a: dict[str, np.ndarray], name: str) -> float:
    """The single number a weights array ``name`` holds, or a :class:`RouterFileError`."""
    v = np.asarray(a[name]).reshape(-1)
    if v.shape != (1,) or v.dtype.kind not in "iuf" or not np.isfinite(v[0]):
        raise RouterFileError(
            f"The router weights' {name!r} should hold one finite number, not {v.tolist()[:4]!r}; "
            "retrain it."
        )
    return float(v[0])


def top_k_mean(sims: np.ndarray, gains: np.ndarray, k: int, work: np.ndarray | None = None) -> np.ndarray:
    """``[rows]``: the mean of ``gains`` ``[m]`` over each row's ``k`` highest ``sims`` ``[rows, m]``
    (``work``: scratch of at least that shape). Each row's k-th highest similarity by a partition,
    then every ref at or above it: on a retrain of the shipped router argpartition took 13 of its
    63 s, this a tenth of that. A row whose k-th value is tied (copies of a prompt among the refs)
    or NaN keeps argpartition's pick."""
    n, m = sims.shape
    buf = np.empty_like(sims) if work is None else work[:n]
    np.copyto(buf, sims)
    buf.partition(m - k, axis=1)
    kth = buf[:, m - k, None].copy()
    np.greater_equal(sims, kth, out=buf)  # 1 where the ref is among the row's top k
    # integer gains sum exactly in float32, in any order: the same figures as the mean of the picks
    out = (buf @ gains) / np.asarray(k, gains.dtype)
    tied = np.flatnonzero(buf.sum(axis=1) != k)
    if len(tied):
        picks = np.argpartition(-sims[tied], k - 1, axis=1)[:, :k]
        out[tied] = gains[picks].mean(axis=1)
    return out


def project_embeddings(emb: np.ndarray, mean: np.ndarray, proj: np.ndarray) -> np.ndarray:
    """Center, project onto the principal axes and renormalize: ``[n, dims]``."""
    z = (emb - mean) @ proj.T
    return z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
