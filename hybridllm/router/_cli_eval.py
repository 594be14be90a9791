"""``hybridllm router eval``: a router's RouteLLM metrics on a labelled file, printed or as JSON."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from .._exceptions import DataError
from .._finite import finite_json


def evaluate_router_on(
    data_path: str,
    router_path: str | None,
    *,
    weak_col: str | None = None,
    strong_col: str | None = None,
    plot: str | None = None,
    score_range: tuple[float, float] | None = None,
    prompt_col: str | None = None,
    reference_strong: bool = False,
    strong_models: list[str] | None = None,
    weak_models: list[str] | None = None,
) -> dict[str, Any]:
    import numpy as np

    from .dataset import file_columns, load_routellm_csv, prompt_hashes, texts_digest
    from .embedding_cache import cached_embeddings
    from .evaluate import (
        has_gap,
        length_baseline,
        plot_curves,
        quality_curve,
        random_baseline,
        router_metrics,
    )
    from .router import load_router, sends_to_cloud

    if plot:  # before the work: a --plot under a file failed only once every prompt was embedded
        from ._label_files import refuse_path_under_file

        refuse_path_under_file(Path(plot_target(plot, data_path)).expanduser(), f"--plot {plot}")
    router = load_router(router_path)
    if weak_col is None and strong_col is None and not (strong_models or weak_models):
        # the roles the router was trained with, where this file has those columns: decided again
        # by accuracy, a held-out file whose strong model does worse there swapped them and scored
        # the router backwards
        weak_col, strong_col = _trained_roles(router.info, file_columns(data_path))
    data = load_routellm_csv(
        data_path,
        weak_col=weak_col,
        strong_col=strong_col,
        score_range=score_range,
        prompt_col=prompt_col,
        reference_strong=reference_strong,
        strong_models=strong_models,
        weak_models=weak_models,
    )
    embeddings = None
    if router.use_embedding:
        from .._progress import ProgressBar

        embeddings = cached_embeddings(data.prompts, progress=ProgressBar("embedding prompts", unit="prompts",
                                                                          scale=1))
    scores = router.score_texts(data.prompts, embeddings=embeddings)
    result: dict[str, Any] = {
        k: (round(v, 4) if k != "n" else v) for k, v in router_metrics(scores, data.weak, data.strong).items()
    }
    rnd = random_baseline(data.weak, data.strong)
    length = length_baseline(data.prompts, data.weak, data.strong)
    result["baselines"] = {
        "random": {k: round(v, 4) for k, v in rnd.items() if k != "n"},
        "length": {k: round(v, 4) for k, v in length.items() if k != "n"},
    }
    result["columns"] = {"prompt": data.prompt_col, "weak": data.weak_col, "strong": data.strong_col}
    result["weak_accuracy"] = round(float(data.weak.mean()), 4)
    result["strong_accuracy"] = round(float(data.strong.mean()), 4)
    # what the router does at its own threshold on traffic like this file: the share sent to the
    # strong model and the quality of that mix, also as a share of always using the strong model
    cloud = sends_to_cloud(scores, router.threshold)
    quality = float(np.where(cloud, data.strong, data.weak).mean())
    result["at_threshold"] = {
        "threshold": round(float(router.threshold), 6),
        "cloud_fraction": round(float(cloud.mean()), 4),
        "quality": round(quality, 4),
        # router_metrics above refused data where the strong model is not better: its mean is > 0
        "quality_over_strong": round(quality / float(data.strong.mean()), 4),
    }
    if data.skipped:
        result["skipped_rows"] = data.skipped
    training = router.info.get("training", {})
    digests = {training.get("data_digest")} | {s.get("data_digest") for s in training.get("sources", [])}
    result["trained_on_this_data"] = texts_digest(data.prompts) in digests
    if router.train_hashes is not None:
        # a held-out file that shares questions with the training data (a copy, or the same
        # question with other spacing or case) reads better than new traffic would: the router's
        # neighbors include the question itself. Count them and give the figures without them.
        seen = np.isin(prompt_hashes(data.prompts), router.train_hashes)
        result["seen_in_training"] = int(seen.sum())
        result["trained_on_this_data"] = bool(result["trained_on_this_data"] or seen.all())
        unseen = ~seen
        if seen.any() and unseen.any():
            w, st = data.weak[unseen], data.strong[unseen]
            result["unseen"] = (
                {
                    k: (round(v, 4) if k != "n" else v)
                    for k, v in router_metrics(scores[unseen], w, st).items()
                }
                if has_gap(float(w.mean()), float(st.mean()))  # not '>': a rounding gap failed the eval
                else {"n": int(unseen.sum()), "no_gap": True}
            )
    if plot:
        curves = {
            "router": quality_curve(scores, data.weak, data.strong),
            "length": quality_curve([len(p) for p in data.prompts], data.weak, data.strong),
            "random": quality_curve(np.zeros(len(scores)), data.weak, data.strong),
        }
        result["plot"] = str(plot_curves(curves, plot_target(plot, data_path), title=Path(data_path).name))
    return result


def plot_target(plot: str, data_path: str) -> str:
    """Where ``--plot`` writes: an existing folder, or a path ending in a separator, gets a PNG
    inside named after the data file (``--plot plots/ --data heldout.csv``: ``plots/heldout.png``);
    any other path is the file itself (without an extension, ``.png`` is added)."""
    if plot.endswith(("/", os.sep)) or Path(plot).expanduser().is_dir():
        return str(Path(plot).expanduser() / f"{Path(data_path).stem}.png")
    return plot


def check_router_option(router: str | None) -> None:
    """A ``--router`` folder that is not there, said with the flag to pass or leave out (the
    library's own message speaks of load_router's argument)."""
    if router is not None and not Path(router).expanduser().exists():
        raise DataError(
            f"--router {router} does not exist; pass the folder `hybridllm router train --out` wrote "
            "(or its router.json), or leave out --router for the shipped router."
        )


def _trained_roles(info: dict[str, Any], header: list[str]) -> tuple[str | None, str | None]:
    """The (weak, strong) columns of a training file of the router that ``header`` has both of,
    else (None, None)."""
    training = info.get("training", {})
    pairs = [(c.get("weak"), c.get("strong")) for c in training.get("columns", {}).values()]
    pairs.append((training.get("weak_col"), training.get("strong_col")))  # routers without `columns`
    for weak, strong in pairs:
        if weak in header and strong in header and weak != strong:
            return weak, strong
    return None, None


def _eval(args: argparse.Namespace) -> int:
    check_router_option(args.router)
    result = evaluate_router_on(
        args.data,
        args.router,
        weak_col=args.weak_col,
        strong_col=args.strong_col,
        plot=args.plot,
        score_range=args.score_range,
        prompt_col=args.prompt_col,
        reference_strong=args.reference_strong,
        strong_models=args.strong_models,
        weak_models=args.weak_models,
    )
    if args.json:
        sys.stdout.write(finite_json(result) + "\n")  # a NaN figure: null
        return 0
    base = result["baselines"]
    n = result.get("skipped_rows")
    left = f"  (left out {n} rows: a blank score or prompt, or a judgement outside the tiers)" if n else ""
    lines = [
        f"n={result['n']}  weak={result['weak_accuracy']} ({result['columns']['weak']})  "
        f"strong={result['strong_accuracy']} ({result['columns']['strong']})" + left,
        f"{'':8}{'apgr':>8}{'cpt50':>8}{'cpt80':>8}{'calls@95':>10}",
    ]
    for name, m in (("router", result), ("random", base["random"]), ("length", base["length"])):
        lines.append(f"{name:8}{m['apgr']:8.3f}{m['cpt50']:8.3f}{m['cpt80']:8.3f}{m['calls_at_95']:10.3f}")
    at = result["at_threshold"]
    lines.append(
        f"at the router's threshold {at['threshold']:.4f}: {at['cloud_fraction']:.1%} to the strong model, "
        f"quality {at['quality']:.4f} ({at['quality_over_strong']:.1%} of strong-only)"
    )
    if result["trained_on_this_data"]:
        lines.append("note: the router was trained on this data (in-sample figures)")
    elif result.get("seen_in_training"):
        u = result.get("unseen", {})
        figures = (
            f"apgr {u['apgr']:.3f}, cpt50 {u['cpt50']:.3f}, cpt80 {u['cpt80']:.3f}, "
            f"calls@95 {u['calls_at_95']:.3f}"
            if "apgr" in u
            else "no quality gap there"
        )
        lines.append(
            f"note: {result['seen_in_training']} of {result['n']} prompts were in the router's training "
            f"data (figures on them may read better than on new prompts); on the {u.get('n')} others: "
            f"{figures}"
        )
    if "plot" in result:  # the path written: a bare name gains .png, a folder gets a file inside
        lines.append(f"plot: {result['plot']}")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0
