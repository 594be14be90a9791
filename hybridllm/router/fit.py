"""Fit the router's scorer (build code): scikit-learn's logistic regression and k-means, kept out of
the run-time scorer in :mod:`.classifier`, which evaluates the fitted arrays with numpy only."""

from __future__ import annotations

import numpy as np

from .._exceptions import RouterError
from .classifier import (
    DEFAULT_C,
    DEFAULT_DIMS,
    DEFAULT_K,
    DEFAULT_MIX,
    DEFAULT_TOPIC_MIX,
    DEFAULT_TOPICS,
    SHRINK,
    TOPIC_RESTARTS,
    GainScorer,
    project_embeddings,
)
from .mixture import RANGE_DIMS, RANGE_REFS, SUPPORT_K, SourceMixture, typicality


def fit_gain_scorer(
    x: np.ndarray,
    gain: np.ndarray,
    *,
    embeddings: np.ndarray | None = None,
    c: float = DEFAULT_C,
    k: int = DEFAULT_K,
    mix: float = DEFAULT_MIX,
    dims: int = DEFAULT_DIMS,
    topics: int = DEFAULT_TOPICS,
    topic_mix: float = DEFAULT_TOPIC_MIX,
    sample_weight: np.ndarray | None = None,
) -> GainScorer:
    """``x`` ``[n, d]`` features, ``gain`` ``[n]`` in {-1, 0, 1} (correctness) or in [-1, 1]
    (graded scores: strong - weak); ``embeddings`` ``[n, e]``
    enables the neighbor part. ``sample_weight`` ``[n]`` weighs prompts in the topic means, and in
    the linear part only when there is no topic part to carry it. The neighbor part stays a plain
    mean: a prompt's neighbors come from its own kind of traffic, whatever that source's weight.

    Why the linear part is fitted unweighted next to topics: equal source shares weigh each row of
    a small file up by the size ratio (50x for 195 GSM8K rows beside 9,772 MMLU rows), which leaves
    a 400-feature regression an effective sample of a few hundred rows, and it learns that file's
    surface (on ours: short "How ...?" questions scored like GSM8K problems; cross-validated, the
    unweighted fit kept 69% of QQP questions on the device instead of 54%, MMLU APGR +0.003). The
    topic means are where a source's level of gain belongs: a cluster's mean is per region."""
    from sklearn.linear_model import LogisticRegression

    g = np.asarray(gain, dtype=np.float64)
    if x.ndim != 2 or g.ndim != 1 or len(x) != len(g):
        raise RouterError(f"Features {x.shape} and labels {g.shape} do not match.")
    _check_data(x, g, embeddings)
    _check_options(c=c, k=k, mix=mix, dims=dims, topics=topics, topic_mix=topic_mix)
    if not learnable(g):
        raise RouterError(
            "The data needs prompts where the strong model was needed (it scored higher than "
            "the weak one) and prompts where it was needed less or not at all; otherwise there "
            "is nothing to learn."
        )
    x64 = np.asarray(x, dtype=np.float64)
    mean = x64.mean(axis=0)
    scale = x64.std(axis=0)
    scale[scale < 1e-8] = 1.0  # constant columns stay at zero after centering
    w = None
    if sample_weight is not None:
        w = np.asarray(sample_weight, dtype=np.float64)
        if w.shape != g.shape or not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise RouterError("sample_weight needs one finite, non-negative weight per prompt.")
        if not learnable(g[w > 0]):  # the weighted rows alone must still hold an order
            raise RouterError(
                "sample_weight leaves weight only on prompts that gain alike from the strong model; "
                "give weight to prompts where it was needed and to prompts where it was not."
            )
        w = w * (len(w) / w.sum())  # mean 1: C keeps its meaning
    use_topics = topics > 1 and topic_mix > 0 and len(g) > topics
    has_topics = embeddings is not None and use_topics
    model = LogisticRegression(C=c, max_iter=3000)
    z, classes, row_w = _soft_classes((x64 - mean) / scale, g, None if has_topics else w)
    model.fit(z, classes, sample_weight=row_w)
    coef, intercept = model.coef_, model.intercept_
    if coef.shape[0] == 1:  # two classes: sklearn stores one row for the second class
        coef = np.vstack([np.zeros_like(coef), coef])
        intercept = np.concatenate([[0.0], intercept])
    proj_mean = proj = refs = ref_gains = centroids = topic_gains = None
    if embeddings is not None and (mix > 0 or use_topics):
        emb = np.asarray(embeddings, dtype=np.float32)
        proj_mean = emb.mean(axis=0)
        _, _, vt = np.linalg.svd(emb - proj_mean, full_matrices=False)
        proj = vt[: min(dims, vt.shape[0])].astype(np.float32)
        # stored as float16: round here so training scores match the saved file exactly
        refs = project_embeddings(emb, proj_mean, proj).astype(np.float16).astype(np.float32)
        ref_gains = g.astype(np.float32)
        if use_topics:
            centroids, topic_gains = _fit_topics(refs, ref_gains, topics, weights=w)
    return GainScorer(
        mean=mean.astype(np.float32),
        scale=scale.astype(np.float32),
        coef=coef.astype(np.float32),
        intercept=intercept.astype(np.float32),
        classes=model.classes_.astype(np.float32),
        proj_mean=proj_mean,
        proj=proj,
        refs=refs,
        ref_gains=ref_gains,
        k=int(min(k, len(g))),
        mix=float(mix) if embeddings is not None else 0.0,
        centroids=centroids,
        topic_gains=topic_gains,
        topic_mix=float(topic_mix) if centroids is not None else 0.0,
    )


def share_fractions(shares: list[float]) -> np.ndarray:
    """Relative shares (positive, finite) as fractions summing to 1, scaled by the largest first:
    summed as given, two shares of 1e308 overflowed to inf and every row's weight came out 0 (an
    internal error from the fit). A share too small beside the largest to be held comes out 0."""
    s = np.asarray(shares, dtype=np.float64)
    s = s / s.max()
    return s / s.sum()


def learnable(gain: np.ndarray) -> bool:
    """Some prompt gains from the strong model and the gains differ (else there is no order)."""
    g = np.asarray(gain, dtype=np.float64)
    return bool(len(g) and np.any(g > 0) and np.ptp(g) > 0)


def _check_data(x: np.ndarray, g: np.ndarray, embeddings: np.ndarray | None) -> None:
    """A :class:`RouterError` naming the first bad rows, not sklearn's or an SVD's error later (or,
    for a NaN gain or an embedding per other row, a router whose scores are NaN or misattributed)."""

    def rows(bad: np.ndarray) -> str:
        idx = np.flatnonzero(bad)
        more = f" and {len(idx) - 5} more" if len(idx) > 5 else ""
        return ("row " if len(idx) == 1 else "rows ") + ", ".join(map(str, idx[:5])) + more

    bad = ~np.isfinite(g) | (np.abs(g) > 1)
    if np.any(bad):
        raise RouterError(
            f"The gains (strong - weak scores, each score in [0, 1]) of {rows(bad)} are NaN, "
            "inf or outside [-1, 1]; fix or drop those rows."
        )
    bad = ~np.all(np.isfinite(np.asarray(x, dtype=np.float64)), axis=1)
    if np.any(bad):
        raise RouterError(f"The features of {rows(bad)} hold NaN or inf; fix or drop those rows.")
    if embeddings is not None:
        e = np.asarray(embeddings, dtype=np.float64)
        if e.ndim != 2 or len(e) != len(g):
            raise RouterError(
                f"Embeddings {e.shape} do not match the {len(g)} labelled rows; pass one per row."
            )
        bad = ~np.all(np.isfinite(e), axis=1)
        if np.any(bad):
            raise RouterError(f"The embeddings of {rows(bad)} hold NaN or inf; re-embed those prompts.")


def _check_options(*, c: float, k: int, mix: float, dims: int, topics: int, topic_mix: float) -> None:
    """The scorer options as ``router train`` takes them (``--c``, ``--k``, ...): k 0 scored NaN."""
    problems = [
        f"{name} {value!r} ({want})"
        for name, value, ok, want in (
            ("c", c, c > 0, "a positive number, inf for no penalty"),
            ("k", k, k >= 1 and float(k).is_integer(), "a whole number of neighbors, at least 1"),
            ("mix", mix, 0 <= mix <= 1, "a share in [0, 1]"),
            ("dims", dims, dims >= 1 and float(dims).is_integer(), "a whole number, at least 1"),
            ("topics", topics, topics >= 0 and float(topics).is_integer(), "a whole number, 0 for none"),
            ("topic_mix", topic_mix, 0 <= topic_mix <= 1, "a share in [0, 1]"),
        )
        if not ok
    ]
    if problems:
        raise RouterError(f"Invalid scorer options: {'; '.join(problems)}.")


def _soft_classes(
    z: np.ndarray, g: np.ndarray, w: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The linear part's rows, classes and weights. Correctness gains are the classes themselves.
    A graded gain g becomes two weighted rows, so the fitted class probabilities still estimate
    the expected gain:
        g in (0, 1]:  class +1 with weight g,  class 0 with weight 1 - g
        g in [-1, 0): class -1 with weight -g, class 0 with weight 1 + g
    and E[gain] = P(+1) - P(-1) reads the same as with 0/1 labels."""
    if np.all(g % 1 == 0):
        return z, g.astype(np.int64), w
    base = np.ones(len(g)) if w is None else w
    zz = np.concatenate([z, z])
    cls = np.concatenate([np.sign(g), np.zeros(len(g))]).astype(np.int64)
    ww = np.concatenate([np.abs(g), 1.0 - np.abs(g)]) * np.concatenate([base, base])
    keep = ww > 0
    return zz[keep], cls[keep], ww[keep]


def _fit_topics(
    refs: np.ndarray, gains: np.ndarray, topics: int, *, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """k-means restarts over the projected training prompts: centroids ``[r, t, dims]`` and each
    cluster's shrunk (weighted) mean gain ``[r, t]``."""
    from sklearn.cluster import KMeans

    w = np.ones(len(gains)) if weights is None else weights
    prior = float(np.average(gains, weights=w))
    centroids, topic_gains = [], []
    for seed in range(TOPIC_RESTARTS):
        km = KMeans(n_clusters=topics, n_init=1, random_state=seed).fit(refs)
        labels = km.labels_
        sums = np.bincount(labels, weights=gains * w, minlength=topics)
        counts = np.bincount(labels, weights=w, minlength=topics)
        centroids.append(km.cluster_centers_.astype(np.float32))
        topic_gains.append(((sums + SHRINK * prior) / (counts + SHRINK)).astype(np.float32))
    return np.stack(centroids), np.stack(topic_gains)


# inverse L2 strength of the source gate: of 0.3, 1, 3, 10, 30 and 100 the lowest held-out log-loss
# of the source (MMLU + our GSM8K labels, 3 folds by question: 0.0066, next 0.0070 at 3)
GATE_C = 1.0


def fit_source_mixture(
    x: np.ndarray,
    gain: np.ndarray,
    source_ids: np.ndarray,
    embeddings: np.ndarray,
    *,
    shares: list[float] | None = None,
    gate_c: float = GATE_C,
    **scorer_options: float,
) -> SourceMixture:
    """One :func:`fit_gain_scorer` per source on that source's rows alone (``scorer_options``:
    its ``c``, ``k``, ``mix``, ``dims``, ``topics``, ``topic_mix``), and a multinomial logistic gate
    over the embedding telling the sources apart: each row weighs 1 (class priors by row count), or
    each source ``shares[s]`` (relative) in total. A source whose rows never (or always) need the
    strong model, as a small file's training fold may, gets a constant expert: its mean gain."""
    from sklearn.linear_model import LogisticRegression

    raw_ids = np.asarray(source_ids)
    g = np.asarray(gain, dtype=np.float64)
    if not (raw_ids.ndim == g.ndim == 1 and np.ndim(x) == 2 and len(raw_ids) == len(g) == len(x) > 0):
        raise RouterError(
            f"A source mixture needs one source id and one gain per row of the features: ids "
            f"{raw_ids.shape}, gains {g.shape}, features {np.shape(x)}."
        )
    # ids cast to int silently turned 0.5 into 0 and a negative id into a bincount error
    if raw_ids.dtype.kind not in "biuf" or np.any(raw_ids % 1 != 0) or np.any(raw_ids < 0):
        raise RouterError("Source ids must be whole numbers from 0 (one per source).")
    if embeddings is None:
        raise RouterError("A source mixture's gate needs the prompts' embeddings.")
    _check_data(x, g, embeddings)  # a source whose gains do not vary gets no fit to catch a NaN
    ids = raw_ids.astype(np.int64)
    if shares is not None and (
        len(shares) <= ids.max() or not all(0 < float(v) < float("inf") for v in shares)
    ):
        raise RouterError(
            f"shares needs one positive, finite share per source ({int(ids.max()) + 1} sources, "
            f"{len(shares)} shares)."
        )
    num = int(ids.max()) + 1 if shares is None else len(shares)
    if num < 2:
        raise RouterError(
            "A source mixture needs rows of two or more sources; fit one source with fit_gain_scorer."
        )
    counts = np.bincount(ids, minlength=num).astype(np.float64)
    if len(ids) != len(g) or np.any(counts == 0):
        raise RouterError("Every source needs rows of its own to fit a source mixture.")
    experts = []
    for s in range(num):
        rows = ids == s
        if learnable(g[rows]):
            experts.append(
                fit_gain_scorer(
                    x[rows],
                    g[rows],
                    embeddings=embeddings[rows],
                    **scorer_options,  # type: ignore[arg-type]
                )
            )
        else:
            experts.append(_constant_scorer(x.shape[1], float(g[rows].mean())))
    e64 = np.asarray(embeddings, dtype=np.float64)
    mean = e64.mean(axis=0)
    scale = e64.std(axis=0)
    scale[scale < 1e-8] = 1.0
    w = None
    if shares is not None:
        w = (share_fractions(shares) / counts * len(ids))[ids]
    gate = LogisticRegression(C=gate_c, max_iter=3000).fit((e64 - mean) / scale, ids, sample_weight=w)
    coef, intercept = gate.coef_, gate.intercept_
    if num == 2:  # sklearn keeps one row (the second class's log-odds) for two classes
        coef = np.vstack([np.zeros_like(coef), coef])
        intercept = np.concatenate([[0.0], intercept])
    # the range test: every file's prompts in one principal space (up to RANGE_REFS per file,
    # evenly spaced), each prompt's typicality among the others of its file, sorted
    e32 = np.asarray(embeddings, dtype=np.float32)
    range_mean = e32.mean(axis=0)
    _, _, vt = np.linalg.svd(e32 - range_mean, full_matrices=False)
    range_proj = vt[: min(RANGE_DIMS, vt.shape[0])].astype(np.float32)
    range_refs, supports = [], []
    for s in range(num):
        rows = np.flatnonzero(ids == s)
        rows = rows[np.unique(np.linspace(0, len(rows) - 1, min(len(rows), RANGE_REFS)).astype(np.int64))]
        refs = project_embeddings(e32[rows], range_mean, range_proj).astype(np.float16).astype(np.float32)
        if len(refs) <= SUPPORT_K:
            raise RouterError(f"Each file needs more than {SUPPORT_K} prompts for the range test.")
        range_refs.append(refs)
        supports.append(np.sort(typicality(refs, refs, exclude_self=True)).astype(np.float32))
    return SourceMixture(
        range_mean=range_mean,
        range_proj=range_proj,
        range_refs=tuple(range_refs),
        supports=tuple(supports),
        experts=tuple(experts),
        gate_mean=mean.astype(np.float32),
        gate_scale=scale.astype(np.float32),
        gate_coef=coef.astype(np.float32),
        gate_intercept=intercept.astype(np.float32),
    )


def _constant_scorer(num_features: int, mean_gain: float) -> GainScorer:
    return GainScorer(
        mean=np.zeros(num_features, np.float32),
        scale=np.ones(num_features, np.float32),
        coef=np.zeros((1, num_features), np.float32),
        intercept=np.zeros(1, np.float32),
        classes=np.asarray([mean_gain], np.float32),
        mix=0.0,
    )
