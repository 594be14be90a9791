"""``hybridllm router train``, ``label`` and ``calibrate``: run the library call, print its JSON summary."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from .._exceptions import DataError
from .._finite import finite_json
from ._cli_eval import check_router_option


def _print(obj: dict[str, Any]) -> None:
    sys.stdout.write(finite_json(obj, indent=None if obj.get("_compact") else 2) + "\n")  # NaN: null


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
    replacing = _router_in(args.out)
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
    if replacing is not None:  # --out is replaced whole (atomically), as documented: said, not silent
        sys.stderr.write(f"note: replaced the router that was in {args.out} ({replacing})\n")
    return 0


def _router_in(out: str) -> str | None:
    """What the router already in ``out`` was trained on, read leniently (a damaged one is still
    replaced), or None where there is none."""
    config = Path(out) / "router.json"  # as train_from_csv writes it
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text(encoding="utf-8-sig"))["training"]["data"]
    except (OSError, ValueError, KeyError, TypeError):
        return "its training data unknown"
    return f"trained on {data}"


def _check_out_folder(out: str) -> None:
    """Refuse an --out that is a file before the calibration, not after it (train_from_csv checks
    its own --out, and the folders above it, first)."""
    if Path(out).exists() and not Path(out).is_dir():
        raise DataError(f"--out {out} is a file; pass a folder for the router.")


def _edge_file(edge: str) -> Path:
    """--edge as a GGUF file: the file named, else the catalog model pulled. A path that is not
    there (a typo in a folder or file name) is said to be missing, not an unknown catalog id."""
    path = Path(edge).expanduser()
    if path.is_file():
        return path
    if path.is_dir() or "/" in edge or os.sep in edge or edge.lower().endswith(".gguf"):
        what = "is a folder" if path.is_dir() else "does not exist"
        raise DataError(
            f"--edge {edge} {what}; pass a GGUF file or a catalog model id (see `hybridllm models list`)."
        )
    from ..models import pull

    return Path(pull(edge))


def _label(args: argparse.Namespace) -> int:
    from .label import (
        SYSTEM_PROMPT,
        check_out_paths,
        check_resumable,
        label_to_csv,
        llama_cpp_edge,
        openai_cloud,
        read_questions,
    )

    # --concurrency, --max-tokens, --edge-max-tokens, --limit and --timeout: ranges checked as
    # they are parsed (hybridllm._cli_options), before any model loads
    questions = read_questions(args.data)[: args.limit]
    # a GGUF file's name without .gguf; a catalog id whole (Path.stem cut qwen2.5-coder-0.5b-instruct
    # to qwen2.5-coder-0)
    edge_name = Path(args.edge).name
    edge_name = edge_name[: -len(".gguf")] if edge_name.lower().endswith(".gguf") else edge_name
    edge_col, cloud_col = f"edge:{edge_name}", f"cloud:{args.cloud_model}"
    # --out and --answers before the edge model is pulled and loaded: a folder there, or labels
    # of other models, was said only after it (or as an internal error)
    check_out_paths(args.out, args.answers, data=args.data)
    check_resumable(args.out, edge_col=edge_col, cloud_col=cloud_col)
    edge_path = _edge_file(args.edge)
    api_key = args.api_key or os.environ.get("HYBRIDLLM_CLOUD_API_KEY")
    # what else decides a grade, checked when a run resumes (see _label_files.settings_path)
    settings = {
        "edge": edge_path.name,
        "edge_bytes": edge_path.stat().st_size if edge_path.is_file() else None,
        "cloud": args.cloud.rstrip("/"),
        "cloud_model": args.cloud_model,
        "max_tokens": args.max_tokens,
        "edge_max_tokens": args.edge_max_tokens or args.max_tokens,
        "system_prompt": SYSTEM_PROMPT,
        # the questions' file, by name: a second dataset labelled into the same --out (the
        # default labels.csv) was appended to the first, one file of two sources that `router
        # train` can only learn from apart (one --data each)
        "data": Path(args.data).name,
    }
    check_resumable(args.out, edge_col=edge_col, cloud_col=cloud_col, settings=settings)
    edge = llama_cpp_edge(edge_path, max_tokens=args.edge_max_tokens or args.max_tokens)
    cloud = openai_cloud(
        args.cloud, model=args.cloud_model, api_key=api_key, max_tokens=args.max_tokens, timeout=args.timeout
    )
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
            # quoted for a shell: an --out with a space, a column with a quote, pasted as they are
            "train_with": f"hybridllm router train --data {shlex.quote(str(run.out))} --weak-col "
            f"{_single_quoted(edge_col)} --strong-col {_single_quoted(cloud_col)} --out DIR",
        }
    )
    return 0 if n else 1


def _single_quoted(text: str) -> str:
    """``text`` in single quotes for a POSIX shell, a quote in it closed, escaped and reopened."""
    return "'" + text.replace("'", "'\\''") + "'"


def _calibrate(args: argparse.Namespace) -> int:
    import numpy as np

    from .calibrate import calibrate_threshold, read_prompts
    from .router import load_router, sends_to_cloud

    if args.out is None and args.router is None:
        raise DataError("Pass --out DIR for the calibrated router (the shipped one is read-only).")
    check_router_option(args.router)
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
