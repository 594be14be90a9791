"""Several labelled sources, one score: a gain scorer per source, blended by a source gate.

    score(x) = sum_s P(s | x) * score_s(x)

``score_s`` is a :class:`~.classifier.GainScorer` fitted on source ``s`` alone (its own principal
axes, neighbors, topic clusters and linear part): the files' model pairs may disagree about a kind
of prompt, and no file reshapes the order another gives its own prompts. The gate ``P(s | x)`` is a
multinomial logistic regression over the prompt's sentence embedding, its class priors the files'
row counts (or the ``router train --weight`` shares when given): which file's prompts this one
resembles. Not over the text features: they tell files apart by format (MMLU's four options on
their own lines), so every plain question looked like the other file (on MMLU beside our GSM8K
labels such a gate sent 99.9% of QQP questions to the GSM8K expert).

A linear gate still extrapolates: far from both files it is certain of one ("What is New Zealand
like?" was GSM8K with probability 1.0). So an expert takes part only where the prompt is in its
range: the prompt's typicality of a file (mean cosine similarity to its ``SUPPORT_K`` most similar
prompts of that file, in principal axes of all files' embeddings) at least the ``ALPHA`` quantile of
the file's own prompts' typicality (each against the others). A prompt in no expert's range goes to
the expert it is most typical of. On the shipped router's 2,000 QQP questions, the GSM8K expert
held most of the weight on 4.5% of them instead of 17%, and 74% stayed on the device instead of 53%
(in bench.quality's held-out retrain 61% instead of 46%).

Why not one scorer on the pooled rows: the pairs disagree. On RouteLLM's MMLU labels GPT-4 adds
less than average over Mixtral on math questions (high-school mathematics: mean gain -0.27, the
whole file +0.13), while our 135M edge fails nearly every GSM8K word problem (mean gain +0.26);
pooled, the GSM8K rows pulled MMLU's math questions up, which cost MMLU's cross-validated APGR
0.021 and calls at 95% 0.030 against MMLU alone (0.648 / 0.471 vs 0.669 / 0.441; the mixture
0.665 / 0.444, all 5-fold by question).

Evaluated with numpy only; fitted by :func:`.fit.fit_source_mixture` (build code).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._exceptions import RouterError, RouterFileError
from .classifier import _MIN_SCALE, GainScorer, _check_bound, project_embeddings

EXPERT_PREFIX = "expert{}_"
SUPPORT_K = 10  # neighbors whose mean similarity measures how typical a prompt is of a source
RANGE_DIMS = 64  # principal axes of all the files' embeddings, the space of the range test
RANGE_REFS = 2000  # at most this many prompts per file stand for it in the range test
ALPHA = 0.01  # out of an expert's range: less typical of its file than 99% of the file's own prompts
_MAX_UNIT = 1.01  # range refs are unit vectors and supports cosine similarities: |v| <= 1 (+ float16 error)


@dataclass(frozen=True)
class SourceMixture:
    experts: tuple[GainScorer, ...]  # one per source
    gate_mean: np.ndarray  # [e] over the embedding
    gate_scale: np.ndarray  # [e]
    gate_coef: np.ndarray  # [sources, e]
    gate_intercept: np.ndarray  # [sources]
    # the range test, in one space for all files (an expert's own axes make any prompt look typical)
    range_mean: np.ndarray  # [e]
    range_proj: np.ndarray  # [RANGE_DIMS, e]
    range_refs: tuple[np.ndarray, ...]  # per expert [m_s, RANGE_DIMS] projected training prompts
    supports: tuple[np.ndarray, ...]  # per expert [m_s] those prompts' own typicality, sorted

    def __post_init__(self) -> None:
        s, e = len(self.experts), self.gate_mean.shape[0]
        if s < 2 or self.gate_coef.shape != (s, e) or self.gate_intercept.shape != (s,):
            raise RouterError("A source mixture needs two or more experts and one gate row each.")
        # a gate_mean of shape [e, 1] broadcast each prompt into e rows (a batch: numpy's ValueError)
        if (self.gate_mean.ndim != 1 or self.gate_scale.shape != (e,)
                or len({ex.num_features for ex in self.experts}) != 1):
            raise RouterError("The experts and the gate of a source mixture do not match.")
        dims = self.range_proj.shape[0]
        ok = (
            len(self.supports) == len(self.range_refs) == s
            and self.range_proj.shape == (dims, e) and self.range_mean.shape == (e,)
            and all(r.shape == (len(sup), dims) and len(sup) > SUPPORT_K
                    for r, sup in zip(self.range_refs, self.supports, strict=True))
        )
        if not ok:
            raise RouterError("A source mixture needs one range per expert, over its training prompts.")

    @property
    def num_features(self) -> int:
        return self.experts[0].num_features

    @property
    def uses_neighbors(self) -> bool:
        return any(e.uses_neighbors for e in self.experts)

    @property
    def uses_topics(self) -> bool:
        return any(e.uses_topics for e in self.experts)

    def gate(self, emb: np.ndarray) -> np.ndarray:
        """``[n, sources]``: P(source | embedding), rows sum to 1."""
        with np.errstate(over="ignore", invalid="ignore"):
            z = (np.atleast_2d(emb) - self.gate_mean) / self.gate_scale
            logits = z @ self.gate_coef.T + self.gate_intercept
        if not np.all(np.isfinite(logits)):
            # float32 weights near their limits overflowed a logit to inf, and inf - inf gave every
            # weight NaN (a NaN score never reaches the threshold); float64 holds them
            z = (np.atleast_2d(emb).astype(np.float64) - self.gate_mean) / self.gate_scale
            logits = z @ self.gate_coef.T + self.gate_intercept
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        return p / p.sum(axis=1, keepdims=True)

    def in_range(self, emb: np.ndarray) -> np.ndarray:
        """``[n, sources]`` p-values: the share of each file's prompts that are no more typical of
        it than this prompt (typical: mean similarity of the ``SUPPORT_K`` most similar)."""
        z = project_embeddings(np.atleast_2d(emb).astype(np.float32), self.range_mean, self.range_proj)
        out = np.empty((len(z), len(self.experts)))
        for i, (refs, support) in enumerate(zip(self.range_refs, self.supports, strict=True)):
            v = typicality(z, refs)
            out[:, i] = (1.0 + np.searchsorted(support, v, side="right")) / (len(support) + 1.0)
        return out

    def weights(self, emb: np.ndarray) -> np.ndarray:
        """``[n, sources]``: the gate over the experts in range (p-value >= ``ALPHA``); a prompt
        no expert has in range goes to the one it is most typical of."""
        p = self.gate(emb)
        pv = self.in_range(emb)
        p = p * (pv >= ALPHA)
        none = p.sum(axis=1) <= 0
        if np.any(none):
            p[none] = np.eye(len(self.experts))[np.argmax(pv[none], axis=1)]
        return p / p.sum(axis=1, keepdims=True)

    def predict(self, x: np.ndarray, emb: np.ndarray | None = None) -> np.ndarray:
        """Scores in [0, 1] for ``x`` ``[n, d]`` and ``emb`` ``[n, e]``."""
        if emb is None:
            raise RouterError("This router needs the prompt embedding to score.")
        p = self.weights(emb)
        scores = np.stack([e.predict(x, emb) for e in self.experts], axis=1)  # [n, sources]
        return np.clip(np.sum(p * scores, axis=1), 0.0, 1.0)

    def to_arrays(self) -> dict[str, np.ndarray]:
        arrays = {
            "gate_mean": self.gate_mean, "gate_scale": self.gate_scale,
            "gate_coef": self.gate_coef, "gate_intercept": self.gate_intercept,
            "range_mean": self.range_mean, "range_proj": self.range_proj,
        }
        for i, expert in enumerate(self.experts):
            prefix = EXPERT_PREFIX.format(i)
            arrays.update({prefix + k: v for k, v in expert.to_arrays().items()})
            arrays[prefix + "range_refs"] = self.range_refs[i].astype(np.float16)
            arrays[prefix + "support"] = self.supports[i].astype(np.float32)
        return arrays

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray], *, num_features: int) -> SourceMixture:
        need = ("gate_mean", "gate_scale", "gate_coef", "gate_intercept", "range_mean", "range_proj")
        if any(n not in a for n in need):
            raise RouterFileError("The router's source gate is incomplete; retrain it.")
        gate = [np.asarray(a[n], np.float32) for n in need]
        bad = [n for n, v in zip(need, gate, strict=True) if not np.all(np.isfinite(v))]
        if bad:
            raise RouterFileError(f"The router's source gate holds NaN or inf (in {', '.join(bad)}); "
                                  "retrain it.")
        # the fit writes the embedding's standard deviations, at least 1e-8 (1 for a constant
        # column): one below (or negative) is damage, and the dimension divided by it decided the gate
        if gate[1].size and float(gate[1].min()) < _MIN_SCALE:
            raise RouterFileError(f"The router's source gate's gate_scale holds {float(gate[1].min()):g}, "
                                  f"below the {_MIN_SCALE:g} the fit writes at least; retrain it.")
        for n, v in zip(need, gate, strict=True):
            if n in ("gate_mean", "range_mean", "range_proj"):  # embedding means and unit axes
                _check_bound(v, n)
        experts, refs, supports = [], [], []
        for i in range(len(gate[3])):
            prefix = EXPERT_PREFIX.format(i)
            part = {k[len(prefix):]: v for k, v in a.items() if k.startswith(prefix)}
            if "support" not in part or "range_refs" not in part:
                raise RouterFileError("An expert of the router has no range; retrain it.")
            support = np.asarray(part.pop("support"), np.float32)
            ref = np.asarray(part.pop("range_refs"), np.float32)
            # a NaN or inf here makes the similarities to it NaN, and the range test then moves
            # prompts in or out of the expert's range without a word (one NaN ref moved a prompt's
            # p-value from 0.98 to 0.44)
            if not np.all(np.isfinite(ref)):
                raise RouterFileError(f"Expert {i}'s range refs in the router hold NaN or inf; retrain it.")
            if support.ndim != 1 or not np.all(np.isfinite(support)):
                raise RouterFileError(f"Expert {i}'s range in the router holds NaN or inf; retrain it.")
            if np.any(np.diff(support) < 0):
                raise RouterFileError("An expert's range in the router is not sorted; retrain it.")
            # fitted, refs are unit vectors and supports cosine similarities; a ref of 100 put every
            # prompt near it in the expert's range, a support of 5 put every prompt out of it
            for n, v in ((prefix + "range_refs", ref), (prefix + "support", support)):
                if v.size and float(np.abs(v).max()) > _MAX_UNIT:
                    raise RouterFileError(f"The router's {n} holds {float(np.abs(v).max()):g}, beyond the "
                                          "1 a unit vector or a cosine similarity can hold; retrain it.")
            refs.append(ref)
            try:
                experts.append(GainScorer.from_arrays(part, num_features=num_features))
            except RouterFileError as exc:  # its messages name the array without the expert's prefix
                raise RouterFileError(f"Expert {i} (arrays {prefix}*): {exc}") from exc
            supports.append(support)
        try:
            return cls(tuple(experts), gate_mean=gate[0], gate_scale=gate[1], gate_coef=gate[2],
                       gate_intercept=gate[3], range_mean=gate[4], range_proj=gate[5],
                       range_refs=tuple(refs), supports=tuple(supports))
        except RouterError as exc:
            raise RouterFileError(f"{exc} Retrain the router.") from exc


def typicality(z: np.ndarray, refs: np.ndarray, *, exclude_self: bool = False) -> np.ndarray:
    """Mean cosine similarity of each projected prompt ``z`` ``[n, dims]`` to its ``SUPPORT_K``
    most similar ``refs`` ``[m, dims]`` (``exclude_self``: ``z`` are the refs, skip each one's own)."""
    k = min(SUPPORT_K, len(refs) - int(exclude_self))
    out = np.empty(len(z))
    for start in range(0, len(z), 1024):  # [1024, m] at a time: the refs may be ten thousand
        sims = z[start : start + 1024] @ refs.T
        if exclude_self:
            rows = np.arange(len(sims))
            sims[rows, start + rows] = -np.inf
        out[start : start + 1024] = -np.partition(-sims, k - 1, axis=1)[:, :k].mean(axis=1)
    return out
