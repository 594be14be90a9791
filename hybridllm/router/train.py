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

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._exceptions import DataError
from ._train_cascade import _cascade_file, _cascade_floor
from ._train_cv import (
    DEFAULT_FOLDS,
    CVResult,
    Hyper,
    Scorer,  # noqa: F401 - re-exported: a public name of this module
    _fit,
    _gain,
    _is_mixture,
    _round,
    align_folds,  # noqa: F401 - re-exported: tests (test_cv_small) and bench.router_cv use train.align_folds
    check_folds,
    cross_validate,
)
from ._train_folds import (
    fold_ids,  # noqa: F401 - re-exported: tests, bench.quality and bench.router_cv use train.fold_ids
    question_key,  # noqa: F401 - re-exported: a public name of this module
)
from ._train_sources import Sources, pool
from .dataset import RoutingData, file_columns, load_routellm_csv, prompt_hashes, texts_digest
from .embedding_cache import cached_embeddings
from .evaluate import has_gap, router_metrics
from .features import TEXT_FEATURES, feature_matrix
from .fit import GATE_C, learnable
from .mixture import SourceMixture
from .preference import is_preference
from .router import NEVER_CLOUD, Router

SHIPPED_COMMAND = (
    "hybridllm router train --data ../shared/data/routellm/mmlu_responses.csv --out hybridllm/_data/router"
)


def train_router(
    data: RoutingData,
    *,
    use_embedding: bool = True,
    hyper: Hyper = Hyper(),  # noqa: B008 - a frozen dataclass, defined in _train_cv
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
    threshold, per_source = _threshold_and_source_metrics(data, sources, cv, train_scores)
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
    train_scores: np.ndarray,
) -> tuple[float, dict[str, dict[str, float]]]:
    """Per source: the out-of-fold score quantile sending its CV ``calls_at_95`` fraction to the cloud.
    The router's threshold is the lowest of them, so every source keeps 95% of strong quality.

    A source whose prompts the final scorer (``train_scores``) scores all alike (no feature tells
    them apart: text features only, prompts of one shape) can keep it only by sending all of them:
    its quantile, set on out-of-fold scores a hair apart, fell on either side of that one score by
    rounding, and one such router sent none of its prompts to the cloud (calls at 95%: 0.93)."""
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
            alike = train_scores[rows]
            if np.all(alike == alike[0]):  # below 1.0: threshold 1 sends nothing
                threshold = min(threshold, float(alike[0]), float(np.nextafter(NEVER_CLOUD, 0.0)))
    return threshold, per_source


def train_from_csv(
    path: str | Path | list[str | Path],
    out_dir: str | Path,
    *,
    weak_col: str | None = None,
    strong_col: str | None = None,
    use_embedding: bool = True,
    hyper: Hyper = Hyper(),  # noqa: B008 - a frozen dataclass, defined in _train_cv
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
    # one file twice (a shell glob and a name, a copy-pasted command): trained as two sources of the
    # same rows, each row counted twice, the per-source metrics and columns under one name
    resolved = [p.resolve() for p in paths]
    twice = next((p for i, p in enumerate(paths) if resolved[i] in resolved[:i]), None)
    if twice is not None:
        raise DataError(f"--data {twice} is given twice; pass each labelled file once.")
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
    cascade = [
        _cascade_file(
            p,
            weak_col=weak_col,
            strong_col=strong_col,
            score_range=score_range,
            prompt_col=prompt_col,
            reference_strong=reference_strong,
        )
        for p in cascade_paths or []
    ]
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


def _bar(show: bool, label: str, unit: str) -> Callable[[int, int], None] | None:
    """A stderr progress bar counting ``unit`` ("%": steps, shown as a share), or None."""
    if not show:
        return None
    from .._progress import ProgressBar

    return ProgressBar(label, unit=unit, scale=1)


def _shifted(bar: Callable[[int, int], None], base: int, total: int) -> Callable[[int, int], None]:
    return lambda done, _: bar(base + done, total)
