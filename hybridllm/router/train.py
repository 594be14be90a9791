"""Training a router on RouteLLM-format CSVs, with cross-validation folded by question.

Label: the strong model was needed (the weak model failed where the strong one succeeded). The
scorer (see ``classifier``) learns the per-prompt quality gain ``strong - weak``, whose positive
class is that label. Folds come from a hash of the prompt text, so copies of one question share a
fold and no test question is ever trained on (nor used as a neighbor). The shipped threshold is the
quantile of the cross-validated (out-of-fold) scores that sends their ``calls_at_95`` fraction to
the cloud: on traffic like the training data, the cheapest setting keeping 95% of strong quality.
Out-of-fold scores (fold-aligned: see :func:`align_folds`), not the final scorer's scores of its
own training prompts: a new prompt is scored like a held-out one, while a training prompt is its
own neighbor and in its own topic (on our GSM8K labels at 195 rows the in-sample quantile kept 94%
of cloud quality out of fold, the out-of-fold one 96%; at 561 rows both 97%).

Several sources (say RouteLLM's MMLU labels and your own pair's GSM8K labels) train one router.
With embeddings, a source mixture (:mod:`.mixture`): each file gets its own scorer, fitted on its
rows alone, and a gate over the sentence embedding blends them by P(file | prompt), its class
priors the files' row counts, or the ``--weight`` shares when given. Two files come from two model
pairs that may disagree about a kind of prompt, so no file may reshape the order another gives its
own prompts: pooled into one scorer (rows weighted to equal shares), our 627 GSM8K rows pulled
MMLU's math questions up, where GPT-4 adds less than average over Mixtral, and MMLU's CV APGR fell
from 0.669 (MMLU alone) to 0.648, calls at 95% rose from 0.441 to 0.471; the mixture keeps 0.663 /
0.447. Without embeddings the rows are pooled into one linear scorer, each source weighing its
``--weight`` share in total (equal by default). Files that should only calibrate the cascade
(``--cascade-data``) do not train the scorer (30 trivia rows weighed like 10,000 MMLU rows pulled
every short general question up), folds still come from the prompt hash, and the metrics are
reported per source as well as pooled (APGR of a pool of two model pairs means little). The
threshold then keeps 95% of strong quality on every source: the lowest of the per-source thresholds
given by the rule above.
"""

from __future__ import annotations

import hashlib
import re
import time
import unicodedata
from collections.abc import Callable
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
from .dataset import LOGPROB_COL, RoutingData, file_columns, load_routellm_csv, prompt_hashes, texts_digest
from .embedding_cache import cached_embeddings
from .evaluate import has_gap, router_metrics
from .features import TEXT_FEATURES, feature_matrix
from .fit import GATE_C, fit_gain_scorer, fit_source_mixture, learnable
from .mixture import SUPPORT_K, SourceMixture
from .preference import is_preference
from .router import DEFAULT_LOGPROB_THRESHOLD, Router

DEFAULT_FOLDS = 5
Scorer = GainScorer | SourceMixture
SHIPPED_COMMAND = (
    "hybridllm router train --data ../shared/data/routellm/mmlu_responses.csv --out hybridllm/_data/router"
)


_OPERATORS = frozenset("*/%&#@")  # punctuation to Unicode, operators in "6*3", "6/3", "50%"


class _KeyChars(dict):  # type: ignore[type-arg]
    """str.translate's table for question_key, filled as characters are first seen: punctuation
    and control characters to a space, format ones (a zero-width space) to none, the rest kept. One
    translate per prompt in C, not a Python loop over its characters (fold_ids runs per salt)."""

    def __missing__(self, code: int) -> str | int | None:
        c, k = chr(code), unicodedata.category(chr(code))
        self[code] = value = None if k == "Cf" else " " if k[0] in "PC" and c not in _OPERATORS else code
        return value


_KEY_CHARS = _KeyChars()


def question_key(prompt: str) -> str:
    """What copies of one question share: case, punctuation and spacing dropped, symbols kept but
    not the spacing around them ("What is 2+2?", "what is 2 + 2" -> "what is 2 + 2"). A prompt
    of punctuation only keeps its own characters (else "?" and "!!" would be one question)."""
    text = unicodedata.normalize("NFKC", prompt).casefold()
    # punctuation and control characters read as a space, format ones (a zero-width space) as none
    text = text.translate(_KEY_CHARS)
    key = " ".join(re.findall(r"\w+|[^\w\s]", text))  # words and single symbols (+, =, emoji)
    return key or " ".join(prompt.split()).casefold()


def fold_ids(prompts: list[str], num_folds: int, *, salt: str = "") -> np.ndarray:
    """Fold of each prompt from a hash of its text: ``[n]`` ints in ``[0, num_folds)``. Another
    ``salt`` gives another assignment, still by question (``bench.router_cv`` compares them).
    Copies of a question that differ only in case, punctuation or spacing ("Hi", "hi ", "Hi!";
    "2+2", "2 + 2": :func:`question_key`) take the fold of its first copy: in two folds, the
    held-out one had its own twin among the training neighbors. A prompt without such twins
    keeps the fold of its own text (the shipped MMLU file has two pairs, apart by full stops)."""
    out = np.empty(len(prompts), dtype=np.int64)
    first: dict[str, int] = {}
    for i, p in enumerate(prompts):
        fold = int(hashlib.sha1((salt + p).encode("utf-8", "surrogatepass")).hexdigest()[:12], 16) % num_folds
        out[i] = first.setdefault(question_key(p), fold)
    return out


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
    metrics: dict[str, float]  # on the pooled, fold-aligned out-of-fold scores
    fold_metrics: list[dict[str, Any]]  # a fold without a quality gap: {n, no_gap}
    oof_scores: np.ndarray  # [n] fold-aligned (align_folds)


def _round(metrics: dict[str, float]) -> dict[str, float]:
    return {k: (int(v) if k == "n" else round(float(v), 4)) for k, v in metrics.items()}


def _gain(data: RoutingData) -> np.ndarray:
    return (data.strong - data.weak).astype(np.float64)


def _fit(
    x: np.ndarray,
    gain: np.ndarray,
    emb: np.ndarray | None,
    hp: Hyper,
    sources: Sources | None = None,
    rows: np.ndarray | None = None,
) -> Scorer:
    """Fit on ``rows`` (a boolean mask; all when None): one source, or several without embeddings,
    gives one gain scorer (the sources' shares weigh it); several with embeddings, a source mixture."""
    keep = np.ones(len(gain), dtype=bool) if rows is None else rows
    options = {
        "c": hp.c, "k": hp.k, "mix": hp.mix, "dims": hp.dims, "topics": hp.topics, "topic_mix": hp.topic_mix
    }
    if sources is not None and len(sources.names) > 1 and emb is not None:
        return fit_source_mixture(
            x[keep], gain[keep], sources.ids[keep], emb[keep], shares=sources.gate_shares(), **options
        )
    weight = None if sources is None else sources.sample_weight()
    return fit_gain_scorer(
        x[keep],
        gain[keep],
        embeddings=None if emb is None else emb[keep],
        sample_weight=None if weight is None else weight[keep],
        **options,  # type: ignore[arg-type]
    )


@dataclass(frozen=True)
class Sources:
    """Which source each row of a pooled :class:`RoutingData` came from, and its weight."""

    names: list[str]  # one per source
    ids: np.ndarray  # [n] int index into names
    weights: list[float]  # relative total weight of each source
    given: bool = True  # False: the default (equal shares pooled, row counts in a mixture's gate)

    def gate_shares(self) -> list[float] | None:
        """The source gate's class shares: the given weights, or None (by row count)."""
        return list(self.weights) if self.given else None

    def sample_weight(self) -> np.ndarray | None:
        """``[n]`` per-row weights (mean 1) giving each source its share; None for one source."""
        if len(self.names) < 2:
            return None
        counts = np.bincount(self.ids, minlength=len(self.names)).astype(np.float64)
        share = np.asarray(self.weights, dtype=np.float64) / np.sum(self.weights)
        per_row = share / np.maximum(counts, 1) * len(self.ids)
        return per_row[self.ids]


def pool(
    parts: list[tuple[str, RoutingData]],
    weights: list[float] | None = None,
) -> tuple[RoutingData, Sources]:
    """Stack labelled files into one :class:`RoutingData` (``weak``/``strong`` mean the edge and the
    cloud side of each file's own pair) and record where each row came from."""
    if not parts:
        raise DataError("Pass at least one --data file.")
    given = weights is not None
    if weights is None:  # equal shares: a big public file does not drown a small one of your pair
        weights = [1.0] * len(parts)
    if len(weights) != len(parts) or not all(0 < w < float("inf") for w in weights):
        raise DataError(
            f"Give one positive, finite --weight per --data file ({len(parts)} files, "
            f"{len(weights)} weights)."
        )
    if len(parts) == 1:
        name, data = parts[0]
        return data, Sources([name], np.zeros(len(data.prompts), np.int64), list(weights), given)
    lps = [
        d.edge_logprob if d.edge_logprob is not None else np.full(len(d.prompts), np.nan) for _, d in parts
    ]
    any_lp = any(d.edge_logprob is not None for _, d in parts)
    pooled = RoutingData(
        prompts=[p for _, d in parts for p in d.prompts],
        weak=np.concatenate([d.weak for _, d in parts]),
        strong=np.concatenate([d.strong for _, d in parts]),
        weak_col=" + ".join(d.weak_col for _, d in parts),
        strong_col=" + ".join(d.strong_col for _, d in parts),
        edge_logprob=np.concatenate(lps) if any_lp else None,
    )
    ids = np.concatenate([np.full(len(d.prompts), i, np.int64) for i, (_, d) in enumerate(parts)])
    return pooled, Sources([n for n, _ in parts], ids, list(weights), given)


def cross_validate(
    data: RoutingData,
    x: np.ndarray,
    emb: np.ndarray | None,
    *,
    hyper: Hyper = Hyper(),
    num_folds: int = DEFAULT_FOLDS,
    fold_salt: str = "",
    sources: Sources | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> CVResult:
    """Out-of-fold scores for every prompt and the router metrics on them (``sources``: several
    labelled files, fitted as :func:`train_router` fits them)."""
    mixture = _is_mixture(sources, emb is not None)
    folds = check_folds(data, num_folds, fold_salt=fold_salt, mixture=mixture, sources=sources)
    gain = _gain(data)
    oof = np.zeros(len(gain), dtype=np.float64)
    per_fold = []
    for f in range(num_folds):
        test = folds == f
        scorer = _fit(x, gain, emb, hyper, sources, ~test)
        oof[test] = scorer.predict(x[test], None if emb is None else emb[test])
        # has_gap, not ">": a fold whose means differ by rounding only failed the whole run with
        # "the strong model is not more accurate ... check ... not swapped"
        if has_gap(float(data.weak[test].mean()), float(data.strong[test].mean())):
            per_fold.append(_round(router_metrics(oof[test], data.weak[test], data.strong[test])))
        else:  # a small file's fold can hold no quality gap: no figures for it, the pooled ones stand
            per_fold.append({"n": int(test.sum()), "no_gap": True})
        if progress is not None:
            progress(f + 1, num_folds)
    oof = align_folds(oof, folds, None if sources is None else sources.ids)
    pooled = _round(router_metrics(oof, data.weak, data.strong))
    return CVResult(metrics=pooled, fold_metrics=per_fold, oof_scores=oof)


def _is_mixture(sources: Sources | None, embeddings: bool) -> bool:
    """Whether :func:`_fit` fits a source mixture (which gives a source without a gain in a
    training fold a constant expert) rather than one gain scorer."""
    return sources is not None and len(sources.names) > 1 and embeddings


def check_folds(
    data: RoutingData, num_folds: int, *, fold_salt: str = "", mixture: bool = False,
    sources: Sources | None = None,
) -> np.ndarray:
    """The fold of each prompt (:func:`fold_ids`), or a :class:`DataError` when some fold cannot be
    cross-validated: it holds none or all of the prompts, or (one gain scorer) its training rows
    hold no prompt that needs the strong model, or (a source mixture of ``sources``) too few of
    some file's prompts for its range test. Cheap: :func:`train_from_csv` calls it before the
    embedding, so a file with one such prompt is refused at once, not after minutes of embedding
    with "the data needs prompts where the strong model was needed" from the fold that lacks it."""
    if num_folds < 2:
        raise DataError(f"Cross-validation needs at least 2 folds, got {num_folds}.")
    folds = fold_ids(data.prompts, num_folds, salt=fold_salt)
    gain = _gain(data)
    for f in range(num_folds):
        test = folds == f
        if not test.any() or test.all():
            distinct = len(set(data.prompts))
            raise DataError(
                f"Too few distinct prompts ({distinct}) for {num_folds}-fold cross-validation: folds "
                f"come from a hash of each prompt, and fold {f + 1} got "
                f"{'none' if not test.any() else 'all'} of them. Label more prompts, or pass "
                "fewer --folds (at least 2)."
            )
        if not mixture and learnable(gain) and not learnable(gain[~test]):
            if np.any(gain[~test] > 0):  # every training prompt of the fold gains alike: no order
                raise DataError(
                    f"The training rows of fold {f + 1} of {num_folds} all gain alike from the strong "
                    "model, so there is no order to learn there; label more varied prompts, or pass "
                    "fewer --folds (at least 2)."
                )
            needed = {question_key(data.prompts[i]) for i in np.flatnonzero(gain > 0)}
            raise DataError(
                f"Only {len(needed)} distinct prompt(s) need the strong model (it scores higher than "
                f"the weak one), too few for {num_folds}-fold cross-validation: fold {f + 1} holds "
                "all of them, so its training rows have none to learn from. Label more prompts "
                "(more that the weak model gets wrong)"
                + (", or pass fewer --folds (at least 2)." if len(needed) > 1 else ".")
            )
    if mixture and sources is not None:
        # each expert's range test needs more than SUPPORT_K of its file's prompts in every fit;
        # the fit said only "Each file needs more than 10 prompts", after minutes of embedding
        for i, name in enumerate(sources.names):
            mine = sources.ids == i
            fewest = min(int(np.sum(mine & (folds != f))) for f in range(num_folds))
            if fewest <= SUPPORT_K:
                raise DataError(
                    f"{name}: {int(mine.sum())} prompts, of which {fewest} train one of the "
                    f"{num_folds} folds; a source mixture needs more than {SUPPORT_K} of each "
                    "file's prompts there. Label more prompts in it, pass fewer --folds, or train "
                    "without it."
                )
    return folds


def align_folds(oof: np.ndarray, folds: np.ndarray, source_ids: np.ndarray | None = None) -> np.ndarray:
    """Out-of-fold scores with each fold model's own level taken out, per source:
        aligned = score - mean(scores of its fold and source) + mean(scores of its source)
    Each fold's model sees all rows but that fold's, so its mean score moves against the fold's own
    labels (a fold with more prompts that need the strong model leaves fewer in training); pooled,
    those offsets rank whole folds backwards. On 80 MMLU rows the pooled APGR read 0.38 while the
    same design scored 0.58 on 2,000 held-out rows (fold-aligned: 0.53; 600 rows: 0.59 / 0.61 /
    0.60, 2,000 rows: 0.630 / 0.650 / 0.634). One model's ranking has no such offsets."""
    out = np.asarray(oof, dtype=np.float64).copy()
    ids = np.zeros(len(out), np.int64) if source_ids is None else np.asarray(source_ids)
    for s in np.unique(ids):
        in_s = ids == s
        level = out[in_s].mean()
        for f in np.unique(folds[in_s]):
            rows = in_s & (folds == f)
            out[rows] += level - out[rows].mean()
    return out


def _cascade_floor(data: RoutingData, cascade_data: list[RoutingData] | None) -> tuple[float, dict[str, Any]]:
    """The cascade's log-probability floor and its record; a DataError for log-probabilities
    that do not tell wrong answers from right ones (before any fitting, so it costs nothing)."""
    logprob_threshold = DEFAULT_LOGPROB_THRESHOLD
    cascade: dict[str, Any] = {
        "logprob_threshold": logprob_threshold,
        "rule": "default (no edge log-probabilities in the data)",
    }
    # the cascade's floor: every edge answer with a log-probability, in the training files and in
    # ``cascade_data`` (answers that calibrate the floor without training the scorer)
    with_lp = [d for d in [data, *(cascade_data or [])] if d.edge_logprob is not None]
    if with_lp:
        all_lp = np.concatenate([d.edge_logprob for d in with_lp])  # type: ignore[misc]
        # graded edge scores count as right from half marks up
        all_ok = np.concatenate([(d.weak >= 0.5).astype(np.float64) for d in with_lp])
        has_lp = np.isfinite(all_lp)
        lp, ok = all_lp[has_lp], all_ok[has_lp]
        if 0 < ok.sum() < len(ok):
            logprob_threshold = calibrate_logprob_threshold(lp, ok)
            esc = lp < logprob_threshold
            cascade = {
                "logprob_threshold": round(logprob_threshold, 5),
                "rule": "max balanced accuracy of 'mean logprob < t' for 'edge answer wrong'",
                "n": int(len(lp)),
                "edge_right": int(ok.sum()),
                "escalated_when_wrong": round(float(esc[ok == 0].mean()), 4),
                "kept_when_right": round(float((~esc[ok == 1]).mean()), 4),
            }
    return logprob_threshold, cascade


def train_router(
    data: RoutingData,
    *,
    use_embedding: bool = True,
    hyper: Hyper = Hyper(),
    num_folds: int = DEFAULT_FOLDS,
    embeddings: np.ndarray | None = None,
    source: str = "",
    command: str = "",
    sources: Sources | None = None,
    cascade_data: list[RoutingData] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Router:
    """Cross-validate, then fit on all rows; the router's ``info`` records both. ``progress(done,
    total)`` counts the fits: one per fold, then the final one."""
    started = time.perf_counter()
    logprob_threshold, cascade = _cascade_floor(data, cascade_data)
    if sources is None:
        sources = Sources([Path(source).name if source else ""], np.zeros(len(data.prompts), np.int64), [1.0])
    emb = None
    if use_embedding:
        emb = cached_embeddings(data.prompts) if embeddings is None else embeddings
    x = feature_matrix(data.prompts, use_embedding=use_embedding, embeddings=emb)
    steps = None if progress is None else (lambda done, _: progress(done, num_folds + 1))
    cv = cross_validate(data, x, emb, hyper=hyper, num_folds=num_folds, sources=sources, progress=steps)
    scorer = _fit(x, _gain(data), emb, hyper, sources)
    if progress is not None:
        progress(num_folds + 1, num_folds + 1)
    train_scores = np.asarray(scorer.predict(x, emb), dtype=np.float64)
    threshold, per_source = _threshold_and_source_metrics(data, sources, cv)
    info: dict[str, Any] = {
        "training": {
            "command": command or SHIPPED_COMMAND,
            "data": " + ".join(sources.names),
            "data_digest": texts_digest(data.prompts),
            "n": len(data.prompts),
            "weak_col": data.weak_col,
            "strong_col": data.strong_col,
            "label": (
                "graded scores in [0, 1]; scorer target: strong - weak"
                if data.graded
                else "weak wrong and strong right (gain +1); scorer target: strong - weak"
            ),
            "positive_rate": round(float(data.labels.mean()), 4),
            "c": hyper.c,
            "k": hyper.k,
            "mix": hyper.mix if use_embedding else 0.0,
            "dims": hyper.dims,
            "topics": hyper.topics,
            "topic_mix": hyper.topic_mix if scorer.uses_topics else 0.0,
            "num_folds": num_folds,
            "num_text_features": len(TEXT_FEATURES),
            "threshold_rule": "out-of-fold score quantile sending the CV calls_at_95 fraction to cloud"
            + ("; the lowest over sources" if len(sources.names) > 1 else ""),
            "cascade": cascade,
            "seconds": round(time.perf_counter() - started, 1),
        },
        "metrics": {
            "cv": cv.metrics,
            "cv_per_fold": cv.fold_metrics,
            "train": _round(router_metrics(train_scores, data.weak, data.strong)),
        },
    }
    if len(sources.names) > 1:
        info["training"]["sources"] = [
            {
                "data": name,
                "n": int(np.sum(sources.ids == i)),
                "weight": sources.weights[i] if sources.given else None,
                "data_digest": texts_digest([data.prompts[j] for j in np.flatnonzero(sources.ids == i)]),
            }
            for i, name in enumerate(sources.names)
        ]
        info["metrics"]["cv_per_source"] = per_source
        if isinstance(scorer, SourceMixture):
            info["training"]["model"] = (
                "source mixture: one scorer per --data file, blended by P(file | embedding) "
                + ("with the given shares" if sources.given else "with priors by row count")
            )
            info["training"]["gate_c"] = GATE_C
    return Router(
        scorer=scorer,
        threshold=threshold,
        use_embedding=use_embedding,
        logprob_threshold=logprob_threshold,
        info=info,
        train_hashes=np.unique(prompt_hashes(data.prompts)),
    )


def _threshold_and_source_metrics(
    data: RoutingData,
    sources: Sources,
    cv: CVResult,
) -> tuple[float, dict[str, dict[str, float]]]:
    """Per source: the out-of-fold score quantile sending its CV ``calls_at_95`` fraction to the cloud.
    The router's threshold is the lowest of them, so every source keeps 95% of strong quality."""
    threshold, per_source = 1.0, {}
    for i, name in enumerate(sources.names):
        rows = sources.ids == i
        m = (
            cv.metrics
            if len(sources.names) == 1
            else _round(router_metrics(cv.oof_scores[rows], data.weak[rows], data.strong[rows]))
        )
        per_source[name] = m
        fraction = float(m["calls_at_95"])
        if fraction > 0:
            threshold = min(threshold, float(np.quantile(cv.oof_scores[rows], 1.0 - fraction)))
    return threshold, per_source


def train_from_csv(
    path: str | Path | list[str | Path],
    out_dir: str | Path,
    *,
    weak_col: str | None = None,
    strong_col: str | None = None,
    use_embedding: bool = True,
    hyper: Hyper = Hyper(),
    num_folds: int = DEFAULT_FOLDS,
    weights: list[float] | None = None,
    cascade_paths: list[str | Path] | None = None,
    score_range: tuple[float, float] | None = None,
    prompt_col: str | None = None,
    reference_strong: bool = False,
    strong_models: list[str] | None = None,
    weak_models: list[str] | None = None,
    progress: bool = False,
) -> Router:
    """Train on one CSV or several (``weights``: each file's relative total weight, equal by
    default). ``weak_col``/``strong_col`` apply to the files that have those columns; the others
    must hold exactly two True/False (or [0, 1] score) columns, the less accurate one the edge;
    ``score_range`` maps graded scores on another scale to [0, 1]; ``prompt_col`` names the prompt
    column in the files that have it; ``reference_strong``: a file with one model column grades
    the weak model against the strong one's answers (see :func:`load_routellm_csv`);
    ``strong_models``/``weak_models``: the two tiers of files of pairwise judgements. ``cascade_paths``:
    labelled files whose edge log-probabilities calibrate the cascade's floor only. ``progress``:
    progress bars on stderr for embedding the prompts and for the fits (work over a second)."""
    paths = [Path(p) for p in (path if isinstance(path, list) else [path])]
    _check_out(out_dir)
    headers = [file_columns(p) for p in paths]
    for flag, col in (("--weak-col", weak_col), ("--strong-col", strong_col), ("--prompt-col", prompt_col)):
        if col and all(h and col not in h for h in headers):  # an unreadable file says so below
            raise DataError(
                f"No --data file has the column {col!r} given with {flag}; their columns: "
                + "; ".join(f"{p.name}: {', '.join(h)}" for p, h in zip(paths, headers, strict=True))
            )
    if (strong_models or weak_models) and not any(is_preference(h, tiers_given=True) for h in headers if h):
        raise DataError(
            "--strong-models and --weak-models apply to files of pairwise judgements (a 'winner' "
            "column, or winner_model_a and winner_model_b), and no --data file has one; name score "
            "columns with --weak-col and --strong-col."
        )
    parts = []
    for p, header in zip(paths, headers, strict=True):
        data = load_routellm_csv(
            p,
            weak_col=weak_col if weak_col in header else None,
            strong_col=strong_col if strong_col in header else None,
            score_range=score_range,
            prompt_col=prompt_col if prompt_col in header else None,
            reference_strong=reference_strong,
            strong_models=strong_models,
            weak_models=weak_models,
        )
        if not np.any(data.labels == 1):
            raise DataError(
                f"{p}: no prompt needs the strong model (it is never right where the weak one is "
                "wrong), so there is nothing to learn from it; label more varied prompts."
            )
        if not has_gap(float(data.weak.mean()), float(data.strong.mean())):  # before the embedding
            raise DataError(
                f"{p}: the strong model {data.strong_col!r} ({data.strong.mean():.3f}) is not more "
                f"accurate than the weak one {data.weak_col!r} ({data.weak.mean():.3f}), so sending "
                "prompts to it cannot gain quality on average and RouteLLM's figures are undefined; "
                "check that --weak-col and --strong-col are not swapped."
            )
        parts.append((p.name, data))
    if len({name for name, _ in parts}) < len(parts):
        parts = [(str(p), d) for p, (_, d) in zip(paths, parts, strict=True)]
    data, sources = pool(parts, weights)
    if not learnable(_gain(data)):  # this and the folds' checks before minutes of embedding
        raise DataError(
            f"{', '.join(map(str, paths))}: every prompt needs the strong model, so there is "
            "nothing to learn; label more varied prompts."
        )
    check_folds(data, num_folds, mixture=_is_mixture(sources, use_embedding), sources=sources)
    # read before the embedding too: a bad --cascade-data file failed only after it
    cascade = [_cascade_file(p) for p in cascade_paths or []]
    # per file: each file's embeddings are cached on their own, so adding a file reuses the others
    emb = None
    if use_embedding:
        bar = _bar(progress, "embedding prompts", "prompts")
        chunks: list[np.ndarray] = []
        for _, d in parts:  # one bar over all files: each file's count starts where the last ended
            base = sum(len(c) for c in chunks)
            tick = None if bar is None else _shifted(bar, base, len(data.prompts))
            chunks.append(cached_embeddings(d.prompts, progress=tick))
        emb = np.concatenate(chunks)
    parts_cmd = ["hybridllm router train"]
    for i, p in enumerate(paths):
        parts_cmd += ["--data", str(p)]
        if weights is not None:
            parts_cmd += ["--weight", f"{weights[i]:g}"]
    if weak_col:
        parts_cmd += ["--weak-col", repr(weak_col)]
    if strong_col:
        parts_cmd += ["--strong-col", repr(strong_col)]
    if score_range is not None:
        parts_cmd += ["--score-range", f"{score_range[0]:g},{score_range[1]:g}"]
    if prompt_col:
        parts_cmd += ["--prompt-col", repr(prompt_col)]
    if reference_strong:
        parts_cmd += ["--reference-strong"]
    for flag, tier in (("--strong-models", strong_models), ("--weak-models", weak_models)):
        for names in tier or []:
            parts_cmd += [flag, repr(names)]
    for cpath in cascade_paths or []:
        parts_cmd += ["--cascade-data", str(cpath)]
    parts_cmd += ["--out", str(out_dir)]
    router = train_router(
        data,
        use_embedding=use_embedding,
        hyper=hyper,
        num_folds=num_folds,
        embeddings=emb,
        source=str(paths[0]),
        command=" ".join(parts_cmd),
        sources=sources,
        cascade_data=cascade,
        progress=_bar(progress, f"training ({num_folds}-fold CV, then all rows)", "%"),
    )
    if cascade_paths:
        router.info["training"]["cascade_data"] = [Path(p).name for p in cascade_paths]
    # which columns each file was read with (auto-detected ones included), for the output
    router.info["training"]["columns"] = {
        name: {"prompt": d.prompt_col, "weak": d.weak_col, "strong": d.strong_col} for name, d in parts
    }
    skipped = {name: d.skipped for name, d in parts if d.skipped}
    if skipped:  # rows with a blank weak or strong score: not labelled, left out
        router.info["training"]["skipped_rows"] = skipped
    router.save(out_dir)
    return router


def _check_out(out_dir: str | Path) -> None:
    """Refuse an --out that cannot be a folder before the training, not when saving after it: a
    file there or above it ("--out data.csv/r" trained, then ended in "internal error:
    NotADirectoryError")."""
    out = Path(out_dir)
    existing = next((p for p in (out, *out.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise DataError(f"--out {out_dir}: {existing} is a file; pass a folder for the router.")


def _cascade_file(path: str | Path) -> RoutingData:
    """A --cascade-data file, refused without edge log-probabilities: it would calibrate nothing,
    and the router kept the default floor without a word."""
    data = load_routellm_csv(path)
    if data.edge_logprob is None or not np.isfinite(data.edge_logprob).any():
        raise DataError(
            f"--cascade-data {path} has no edge log-probabilities (a {LOGPROB_COL!r} column with "
            "numbers, as `hybridllm router label` writes), so it cannot calibrate the cascade's "
            "floor; pass such a file, or train without it."
        )
    return data


def _bar(show: bool, label: str, unit: str) -> Callable[[int, int], None] | None:
    """A stderr progress bar counting ``unit`` ("%": steps, shown as a share), or None."""
    if not show:
        return None
    from .._progress import ProgressBar

    return ProgressBar(label, unit=unit, scale=1)


def _shifted(bar: Callable[[int, int], None], base: int, total: int) -> Callable[[int, int], None]:
    return lambda done, _: bar(base + done, total)
