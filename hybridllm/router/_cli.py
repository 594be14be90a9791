"""``hybridllm router ...``: train, eval, label, calibrate. ``register`` adds the command group."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from .._cli_options import non_negative_int, positive_float, positive_int, unit_interval
from .._exceptions import DataError

# how --weak-col / --strong-col are found when not given (dataset.load_routellm_csv)
_DETECTED = "the file's two True/False or score columns, the strong one told by the names or accuracy"


def _folds(text: str) -> int:
    """Cross-validation folds: two at least (checked as parsed: it exited 1 after the data was read)."""
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"expected an integer of at least 2, got {text!r}")
    return value


def _inverse_strength(text: str) -> float:
    """--c: a positive number; inf (no L2 penalty) is taken, as before."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:  # NaN too
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def register(subparsers: Any) -> None:
    router = subparsers.add_parser("router", help="train, evaluate and calibrate the router")
    sub = router.add_subparsers(dest="router_command", required=True)

    p = sub.add_parser("train", help="train a router on labelled CSV (RouteLLM's format) or JSON Lines files")
    p.add_argument(
        "--data",
        required=True,
        action="append",
        help="labelled file, CSV or JSON Lines, with a prompt column and two model score "
        "columns (True/False or graded); repeat it to train on several sources "
        "(cross-validation still folds by question)",
    )
    p.add_argument(
        "--weight",
        type=positive_float,
        action="append",
        default=None,
        help="relative share of each --data file, in order, in the source gate (default: by row "
        "count); with --no-embedding, its total weight in one pooled scorer (default: equal)",
    )
    p.add_argument(
        "--cascade-data",
        action="append",
        default=None,
        help="labelled CSV (from `router label`) whose edge log-probabilities only calibrate the "
        "cascade's floor, without training the scorer; repeatable (default: the --data files' own, "
        "else -1.0)",
    )
    p.add_argument("--weak-col", help="the weak (edge) model's column (in files that have it; "
                   f"default: {_DETECTED})")
    p.add_argument("--strong-col", help="the strong (cloud) model's column (in files that have it; "
                   f"default: {_DETECTED})")
    _prompt_col_arg(p)
    _score_range_arg(p)
    _reference_arg(p)
    _tier_args(p)
    p.add_argument("--out", required=True, help="folder to write router.json and weights.npz")
    # the defaults written out are train.Hyper's (a test holds them together): importing it here
    # would load numpy for every `hybridllm` command
    p.add_argument("--c", type=_inverse_strength, default=None,
                   help="inverse L2 strength of the linear part (default: 0.002)")
    p.add_argument("--k", type=positive_int, default=None,
                   help="neighbors of the neighbor part (default: 50)")
    p.add_argument("--mix", type=unit_interval, default=None,
                   help="weight of the neighbor part against the linear part, 0..1 (default: 0.8)")
    p.add_argument("--topics", type=non_negative_int, default=None,
                   help="k-means clusters of the topic part, 0 turns it off (default: 60)")
    p.add_argument("--topic-mix", type=unit_interval, default=None,
                   help="weight of the topic part, 0..1 (default: 0.5)")
    p.add_argument(
        "--folds",
        type=_folds,
        default=5,
        help="cross-validation folds, by question (default: 5)",
    )
    p.add_argument("--no-embedding", action="store_true",
                   help="text features only (default: text features and the sentence embedding)")
    # usage_error: an argument error that needs the whole command line (one --weight per --data)
    p.set_defaults(func=_train, usage_error=p.error)

    p = sub.add_parser("eval", help="RouteLLM metrics of a router on a labelled CSV or JSON Lines file")
    p.add_argument("--data", required=True, help="labelled file, CSV or JSON Lines (as for train)")
    p.add_argument("--router", help="router folder (default: the shipped router)")
    p.add_argument("--weak-col", help="the weak model's column (default: the router's training "
                   f"columns where the file has them, else {_DETECTED})")
    p.add_argument("--strong-col", help="the strong model's column (default: as for --weak-col)")
    _prompt_col_arg(p)
    _score_range_arg(p)
    _reference_arg(p)
    _tier_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", help="write the cost/quality curves to this PNG (default: no plot)")
    p.set_defaults(func=_eval)

    p = sub.add_parser("label", help="run an edge and a cloud model on questions, write a CSV")
    p.add_argument("--data", required=True, help="JSONL with question and answer per line")
    p.add_argument("--edge", required=True, help="catalog id or GGUF path of the edge model")
    p.add_argument("--cloud", required=True, help="OpenAI-compatible base URL")
    p.add_argument(
        "--cloud-model",
        default="default",
        help="model name sent to the cloud; the CSV's cloud column is cloud:NAME (default: default)",
    )
    p.add_argument("--api-key", default=None, help="default: $HYBRIDLLM_CLOUD_API_KEY")
    p.add_argument(
        "--out",
        default="labels.csv",
        help="CSV to write; if it exists, its prompts are skipped (resume) and new rows are appended "
        "(default: labels.csv)",
    )
    p.add_argument(
        "--answers",
        default=None,
        help="also append both answers per question to this JSONL, for checking grades (default: "
        "not kept)",
    )
    p.add_argument("--limit", type=positive_int, default=None,
                   help="label only the first N questions (default: all)")
    p.add_argument("--max-tokens", type=positive_int, default=256,
                   help="longest answer of either model (default: 256)")
    p.add_argument(
        "--edge-max-tokens",
        type=positive_int,
        default=None,
        help="longest edge answer (default: --max-tokens); one llama.cpp stream on a few cores "
        "can cost more per question than the batched cloud",
    )
    p.add_argument(
        "--concurrency",
        type=positive_int,
        default=8,
        help="cloud requests in flight at once; the edge runs alongside, one at a time (default: 8)",
    )
    p.add_argument("--timeout", type=positive_float, default=900.0,
                   help="seconds to wait for one cloud answer (default: 900)")
    p.set_defaults(func=_label)

    p = sub.add_parser("calibrate", help="set the threshold for a target cloud fraction")
    p.add_argument(
        "--prompts",
        required=True,
        help="JSON Lines (strings or objects), CSV/TSV with a prompt column, or one prompt a line",
    )
    _prompt_col_arg(p)
    p.add_argument(
        "--cloud-fraction",
        type=unit_interval,
        required=True,
        help="share of these prompts to send to the cloud, 0..1; the threshold is set to that "
        "quantile (0: threshold 1, no prompt goes; 1: threshold 0, every prompt)",
    )
    p.add_argument("--router", help="router folder (default: the shipped router)")
    p.add_argument("--out", help="folder for the calibrated router (default: --router)")
    p.set_defaults(func=_calibrate)


def _print(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, indent=None if obj.get("_compact") else 2) + "\n")


def _train(args: argparse.Namespace) -> int:
    from .train import Hyper, train_from_csv

    names = ("c", "k", "mix", "topics", "topic_mix")
    # the ranges of these and of --weight (inf passed "positive", and every row's weight came out
    # NaN at the fit) are checked as they are parsed (hybridllm._cli_options)
    given = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
    if args.weight is not None and len(args.weight) != len(args.data):
        # a usage error as argparse's own (exit 2, "see --help"), before any file is read
        args.usage_error(
            f"give one --weight per --data file ({len(args.data)} files, "
            f"{len(args.weight)} weights), or none for the default"
        )
    data = args.data[0] if len(args.data) == 1 else list(args.data)
    router = train_from_csv(
        data,
        args.out,
        weak_col=args.weak_col,
        strong_col=args.strong_col,
        use_embedding=not args.no_embedding,
        hyper=Hyper(**given),
        num_folds=args.folds,
        weights=args.weight,
        cascade_paths=args.cascade_data,
        score_range=args.score_range,
        prompt_col=args.prompt_col,
        reference_strong=args.reference_strong,
        strong_models=args.strong_models,
        weak_models=args.weak_models,
        progress=True,
    )
    _print(
        {
            "out": str(Path(args.out)),
            "threshold": round(router.threshold, 6),
            "logprob_threshold": round(router.logprob_threshold, 5),
            "columns": router.info["training"]["columns"],
            **(
                {"skipped_rows": router.info["training"]["skipped_rows"]}
                if "skipped_rows" in router.info.get("training", {})
                else {}
            ),
            **router.info.get("metrics", {}),
        }
    )
    return 0


def _check_out_folder(out: str) -> None:
    """Refuse an --out that is a file before the calibration, not after it (train_from_csv checks
    its own --out, and the folders above it, first)."""
    if Path(out).exists() and not Path(out).is_dir():
        raise DataError(f"--out {out} is a file; pass a folder for the router.")


def _score_range(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO,HI such as 1,10, got {text!r}") from None
    if not hi > lo:
        raise argparse.ArgumentTypeError(f"LO must be below HI, got {text!r}")
    if not (math.isfinite(lo) and math.isfinite(hi)):  # 1,inf mapped every mark to 0, silently
        raise argparse.ArgumentTypeError(f"LO and HI must be finite numbers, got {text!r}")
    return lo, hi


def _prompt_col_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prompt-col",
        default=None,
        metavar="COL",
        help="the prompt column (default: 'prompt', else the file's only 'question', 'query', "
        "'input', 'instruction', 'text', 'messages', 'conversation' or 'turns' column)",
    )


def _reference_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--reference-strong",
        action="store_true",
        help="a file with one model column grades the weak model against the strong model's "
        "answers as the reference (a judge's marks): the strong model scores the top of the scale",
    )


def _tier_args(p: argparse.ArgumentParser) -> None:
    for side, example in (("strong", "gpt-4*"), ("weak", "mixtral*")):
        p.add_argument(
            f"--{side}-models",
            action="append",
            default=None,
            metavar="NAMES",
            help=f"in files of pairwise judgements (a 'winner' column, arena-style): the {side} "
            f"tier's models, names or globs such as '{example}', comma-separated or repeated; rows "
            "between a strong and a weak model are kept (default: none; such a file needs both)",
        )


def _score_range_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--score-range",
        type=_score_range,
        default=None,
        metavar="LO,HI",
        help="graded scores on this scale (say 1,10 for a judge's marks) are mapped to [0, 1]; "
        "True/False columns and scores already in [0, 1] need nothing (default: read as they are)",
    )


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
        result["plot"] = str(plot_curves(curves, plot, title=Path(data_path).name))
    return result


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
        sys.stdout.write(json.dumps(result) + "\n")
        return 0
    base = result["baselines"]
    n = result.get("skipped_rows")
    left = f"  (left out {n} rows: a blank score, or a judgement outside the tiers)" if n else ""
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
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _label(args: argparse.Namespace) -> int:
    from .label import SYSTEM_PROMPT, label_to_csv, llama_cpp_edge, openai_cloud, read_questions

    # --concurrency, --max-tokens, --edge-max-tokens, --limit and --timeout: ranges checked as
    # they are parsed (hybridllm._cli_options), before any model loads
    questions = read_questions(args.data)[: args.limit]
    edge_path = Path(args.edge)
    if not edge_path.is_file():
        from ..models import pull

        edge_path = Path(pull(args.edge))
    api_key = args.api_key or os.environ.get("HYBRIDLLM_CLOUD_API_KEY")
    edge = llama_cpp_edge(edge_path, max_tokens=args.edge_max_tokens or args.max_tokens)
    cloud = openai_cloud(
        args.cloud, model=args.cloud_model, api_key=api_key, max_tokens=args.max_tokens, timeout=args.timeout
    )
    # a GGUF file's name without .gguf; a catalog id whole (Path.stem cut qwen2.5-coder-0.5b-instruct
    # to qwen2.5-coder-0)
    edge_name = Path(args.edge).name
    edge_name = edge_name[: -len(".gguf")] if edge_name.lower().endswith(".gguf") else edge_name
    edge_col, cloud_col = f"edge:{edge_name}", f"cloud:{args.cloud_model}"
    # what else decides a grade, checked when a run resumes (see _label_files.settings_path)
    settings = {
        "edge": edge_path.name,
        "edge_bytes": edge_path.stat().st_size if edge_path.is_file() else None,
        "cloud": args.cloud.rstrip("/"),
        "cloud_model": args.cloud_model,
        "max_tokens": args.max_tokens,
        "edge_max_tokens": args.edge_max_tokens or args.max_tokens,
        "system_prompt": SYSTEM_PROMPT,
    }
    run = label_to_csv(
        questions,
        edge,
        cloud,
        args.out,
        edge_col=edge_col,
        cloud_col=cloud_col,
        concurrency=args.concurrency,
        answers_out=args.answers,
        progress=sys.stderr,
        settings=settings,
    )
    n = run.num_rows
    _print(
        {
            "out": str(run.out),
            "n": n,
            "added": run.num_added,
            "resumed_from": run.num_skipped,
            "failed": run.num_failed,
            "first_error": run.errors[0] if run.errors else None,
            "edge_accuracy": round(run.edge_correct / n, 4) if n else None,
            "cloud_accuracy": round(run.cloud_correct / n, 4) if n else None,
            "train_with": f"hybridllm router train --data {run.out} --weak-col '{edge_col}' "
            f"--strong-col '{cloud_col}' --out DIR",
        }
    )
    return 0 if n else 1


def _calibrate(args: argparse.Namespace) -> int:
    import numpy as np

    from .calibrate import calibrate_threshold, read_prompts
    from .router import load_router, sends_to_cloud

    if args.out is None and args.router is None:
        raise DataError("Pass --out DIR for the calibrated router (the shipped one is read-only).")
    if args.out is not None:
        _check_out_folder(args.out)
    router = load_router(args.router)
    prompts = read_prompts(args.prompts, args.prompt_col)
    embeddings = None
    if router.use_embedding:  # with progress: ten thousand prompts take over a minute on two cores
        from .._progress import ProgressBar
        from .features import embed_texts

        # not through the embeddings cache: these are the user's own requests, kept nowhere
        embeddings = embed_texts(prompts, progress=ProgressBar("embedding prompts", unit="prompts", scale=1))
    scores = router.score_texts(prompts, embeddings=embeddings)
    router.threshold = calibrate_threshold(scores, args.cloud_fraction)
    out_dir = Path(args.out or args.router)
    if args.out is None and out_dir.is_file():  # --router named its router.json, as load_router takes
        out_dir = out_dir.parent
    out = router.save(out_dir)
    _print(
        {
            "out": str(out),
            "threshold": round(router.threshold, 6),
            "n": len(prompts),
            "target_cloud_fraction": args.cloud_fraction,
            "realized_cloud_fraction": round(float(np.mean(sends_to_cloud(scores, router.threshold))), 4),
        }
    )
    return 0
