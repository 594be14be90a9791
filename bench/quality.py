"""Answer quality of the hybrid on questions the router never trained on, for our own model pair.

    python -m bench.quality [--json] [--labels CSV] [--qqp-n 2000]

The router is retrained here exactly as shipped (``hybridllm router train`` on RouteLLM's MMLU
labels plus our pair's GSM8K labels, default settings and threshold rule), but without one fold in
five of each file, chosen by a hash of the question (the folds ``router train`` uses, salted, so
every copy of a question is on one side; the factual questions that calibrate the cascade are split
the same way). On the held-out GSM8K questions:

- ``device_only`` / ``cloud_only``: accuracy of SmolLM2-135M (edge) / Qwen2.5-Coder-1.5B (cloud).
- ``hybrid``: accuracy when the questions scoring at or above the router's threshold go to the
  cloud and the rest stay on the device; ``hybrid_over_cloud`` = hybrid / cloud-only.
- ``cloud_fraction``; ``cloud_tokens`` (the hybrid's) against ``cloud_only_tokens``: completion
  tokens of the cloud answers, from the labels' ``cloud_tokens`` column.
- ``apgr`` / ``calls_at_95``: the router's RouteLLM metrics on the held-out questions.
On the held-out MMLU questions: ``apgr`` and ``calls_at_95`` (and the training's own
cross-validated figures per source). On ``--qqp-n`` general questions from QQP (Quora, no labels):
``device_fraction`` at the same threshold.

Needs ../shared/data; the labels default to bench/data/gsm8k_smollm2-135m_vs_qwen2.5-coder-1.5b.csv.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from hybridllm._cli_options import positive_int

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
MMLU = SHARED / "routellm" / "mmlu_responses.csv"
QQP = SHARED / "paraphrase" / "qqp_pairs.jsonl"
LABELS = ROOT / "bench" / "data" / "gsm8k_smollm2-135m_vs_qwen2.5-coder-1.5b.csv"
FACTUAL = ROOT / "bench" / "data" / "factual_smollm2-135m_vs_qwen2.5-coder-1.5b.csv"
SALT = "bench.quality"
NUM_FOLDS = 5  # one fold held out: 20%


def _cloud_tokens(path: Path) -> np.ndarray:
    """The ``cloud_tokens`` column on the rows ``load_routellm_csv`` keeps, in its order."""
    from hybridllm.router._dataset_scores import _to_score
    from hybridllm.router._dataset_table import _read_table
    from hybridllm.router.dataset import load_routellm_csv

    # the loader drops rows without both models' scores: every row of the file here shifted the
    # tokens against the questions (and the held-out mask no longer fit) once a row was unlabelled
    data = load_routellm_csv(path)
    header, rows = _read_table(path)
    cols = [c for c in (data.weak_col, data.strong_col) if c in header]  # not a "(reference)" one

    def labelled(r: dict[str, str]) -> bool:
        return all(not np.isnan(_to_score(r.get(c) or "") or 0.0) for c in cols)  # blank: NaN

    kept = [r for r in rows if labelled(r)]
    if len(kept) != len(data.prompts):
        raise ValueError(f"{path}: {len(kept)} labelled rows, the loader kept {len(data.prompts)}")
    return np.asarray([float(r.get("cloud_tokens") or "nan") for r in kept], dtype=np.float64)


def held_out_masks(prompt_lists: list[list[str]]) -> list[np.ndarray]:
    """Each file's held-out rows (fold 0 of ``NUM_FOLDS``), from one fold assignment over every
    file's questions, so a question in two files (case and spacing aside) is held out in both or
    in neither: per file, "Hi" in one and "hi " in the other hashed to folds of their own."""
    from hybridllm.router.train import fold_ids

    held = fold_ids([p for ps in prompt_lists for p in ps], NUM_FOLDS, salt=SALT) == 0
    ends = np.cumsum([len(ps) for ps in prompt_lists])
    return np.split(held, ends[:-1])


def qqp_questions(n: int) -> list[str]:
    """``n`` distinct QQP questions (first of each pair), in file order."""
    out: list[str] = []
    seen: set[str] = set()
    with QQP.open(encoding="utf-8") as fh:
        for line in fh:
            q = json.loads(line)["text_a"].strip()
            if q and q not in seen:
                seen.add(q)
                out.append(q)
                if len(out) == n:
                    break
    return out


def _r(x: float) -> float:
    return round(float(x), 4)


def evaluate_split(
    scores: np.ndarray,
    threshold: float,
    weak: np.ndarray,
    strong: np.ndarray,
    tokens: np.ndarray | None = None,
) -> dict[str, Any]:
    """Device-only, cloud-only and hybrid accuracy at ``threshold`` plus the RouteLLM metrics."""
    from hybridllm.router.evaluate import router_metrics
    from hybridllm.router.router import sends_to_cloud

    cloud = sends_to_cloud(scores, threshold)  # the router's own rule (threshold 1: never)
    hybrid = np.where(cloud, strong, weak)
    m = router_metrics(scores, weak, strong)
    out = {
        "n": int(len(scores)),
        "device_only": _r(weak.mean()),
        "cloud_only": _r(strong.mean()),
        "hybrid": _r(hybrid.mean()),
        "hybrid_over_cloud": _r(hybrid.mean() / strong.mean()) if strong.mean() > 0 else None,
        "cloud_fraction": _r(cloud.mean()),
        "apgr": _r(m["apgr"]),
        "calls_at_95": _r(m["calls_at_95"]),
    }
    if tokens is not None and np.isfinite(tokens).any():
        out["cloud_tokens"] = int(np.nansum(tokens[cloud]))
        out["cloud_only_tokens"] = int(np.nansum(tokens))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--labels", type=Path, default=LABELS, help="our pair's labelled CSV")
    ap.add_argument(
        "--extra",
        type=Path,
        action="append",
        default=None,
        help="labelled files that only calibrate the cascade (split the same way); default: the shipped "
        "router's factual questions",
    )
    ap.add_argument("--qqp-n", type=positive_int, default=2000, help="QQP questions for device_fraction")
    args = ap.parse_args(argv)
    extra = [FACTUAL] if args.extra is None else args.extra
    for need in (MMLU, QQP, args.labels, *extra):
        if not need.is_file():
            sys.stderr.write(
                f"{need} is missing; this benchmark needs ../shared/data and the "
                "labels from `hybridllm router label`.\n"
            )
            return 2

    from hybridllm.router.dataset import load_routellm_csv
    from hybridllm.router.embedding_cache import cached_embeddings
    from hybridllm.router.features import feature_matrix
    from hybridllm.router.router import sends_to_cloud
    from hybridllm.router.train import pool, train_router

    ours = load_routellm_csv(args.labels)
    mmlu = load_routellm_csv(MMLU)
    tokens = _cloud_tokens(args.labels)
    extra_data = [load_routellm_csv(path) for path in extra]
    held_mmlu, held_ours, *held_extra = held_out_masks(
        [mmlu.prompts, ours.prompts, *(d.prompts for d in extra_data)]
    )
    emb_ours, emb_mmlu = cached_embeddings(ours.prompts), cached_embeddings(mmlu.prompts)

    def subset(d: Any, keep: np.ndarray) -> Any:
        from hybridllm.router.dataset import RoutingData

        return RoutingData(
            prompts=[p for p, k in zip(d.prompts, keep, strict=True) if k],
            weak=d.weak[keep],
            strong=d.strong[keep],
            weak_col=d.weak_col,
            strong_col=d.strong_col,
            edge_logprob=None if d.edge_logprob is None else d.edge_logprob[keep],
        )

    parts = [(MMLU.name, subset(mmlu, ~held_mmlu)), (args.labels.name, subset(ours, ~held_ours))]
    embs = [emb_mmlu[~held_mmlu], emb_ours[~held_ours]]
    held_lp, held_weak, cascade_data = [], [], []
    for d, held in zip(extra_data, held_extra, strict=True):
        cascade_data.append(subset(d, ~held))
        if d.edge_logprob is not None:
            held_lp.append(d.edge_logprob[held])
            held_weak.append(d.weak[held])
    data, sources = pool(parts)
    emb = np.concatenate(embs)
    router = train_router(
        data, embeddings=emb, sources=sources, cascade_data=cascade_data, command="bench.quality"
    )

    def score(prompts: list[str], e: np.ndarray) -> np.ndarray:
        x = feature_matrix(prompts, use_embedding=True, embeddings=e)
        return np.asarray(router.scorer.predict(x, e), dtype=np.float64)

    t = router.threshold
    test_ours = subset(ours, held_ours)
    test_mmlu = subset(mmlu, held_mmlu)
    gsm = evaluate_split(
        score(test_ours.prompts, emb_ours[held_ours]), t, test_ours.weak, test_ours.strong, tokens[held_ours]
    )
    mm = evaluate_split(score(test_mmlu.prompts, emb_mmlu[held_mmlu]), t, test_mmlu.weak, test_mmlu.strong)
    qqp = qqp_questions(args.qqp_n)
    qqp_scores = score(qqp, cached_embeddings(qqp))
    if test_ours.edge_logprob is not None:
        held_lp.append(test_ours.edge_logprob)
        held_weak.append(test_ours.weak)
    cascade: dict[str, Any] = {"logprob_threshold": _r(router.logprob_threshold)}
    if held_lp:  # the floor on held-out edge answers of every labelled file of our pair
        lp, weak = np.concatenate(held_lp), np.concatenate(held_weak)
        esc = lp < router.logprob_threshold
        wrong = weak == 0
        cascade["n"] = int(len(lp))
        cascade["escalated_when_wrong"] = _r(esc[wrong].mean()) if wrong.any() else None
        cascade["kept_when_right"] = _r((~esc[~wrong]).mean()) if (~wrong).any() else None
    out = {
        "labels": args.labels.name,
        "threshold": _r(t),
        "gsm8k_held_out": gsm,
        "mmlu_held_out": {k: mm[k] for k in ("n", "apgr", "calls_at_95", "cloud_fraction")},
        "qqp": {"n": len(qqp), "device_fraction": _r(np.mean(~sends_to_cloud(qqp_scores, t)))},
        "cascade_held_out": cascade,
        "train_cv_per_source": router.info["metrics"].get("cv_per_source"),
        "acceptance": {
            "gsm8k_hybrid_over_cloud_at_least_0.95": bool((gsm["hybrid_over_cloud"] or 0) >= 0.95),
            "qqp_device_fraction_at_least_0.5": bool(np.mean(~sends_to_cloud(qqp_scores, t)) >= 0.5),
        },
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
