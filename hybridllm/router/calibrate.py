"""Calibration on the user's own data.

Threshold: on the user's traffic, the score quantile that sends the wanted fraction to the cloud,

    threshold = quantile(scores, 1 - cloud_fraction)   =>   P(score >= threshold) ~ cloud_fraction

Cascade: the edge answer's mean token log-probability below ``t`` escalates to the cloud; ``t``
maximizes balanced accuracy (mean of the true-positive and true-negative rates) of "low confidence"
as a predictor of "the edge answer is wrong" on labelled answers.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from .._exceptions import DataError


def calibrate_threshold(scores: ArrayLike, cloud_fraction: float) -> float:
    """The threshold that routes ``cloud_fraction`` of ``scores`` to the cloud."""
    if not 0.0 <= cloud_fraction <= 1.0:
        raise DataError(f"--cloud-fraction must be between 0 and 1, got {cloud_fraction}.")
    s = np.sort(np.asarray(scores, dtype=np.float64))
    if len(s) == 0:
        raise DataError("Calibration needs at least one prompt.")
    n_cloud = int(round(cloud_fraction * len(s)))
    if n_cloud == 0:
        return float(min(1.0, np.nextafter(s[-1], np.inf)))
    if n_cloud >= len(s):
        return float(s[0])
    # midway between the last edge score and the first cloud score generalizes best
    return float((s[len(s) - n_cloud - 1] + s[len(s) - n_cloud]) / 2.0)


def calibrate_logprob_threshold(mean_logprobs: ArrayLike, correct: ArrayLike) -> float:
    """The cascade's escalation threshold from edge answers' confidence and correctness."""
    lp = np.asarray(mean_logprobs, dtype=np.float64)
    ok = np.asarray(correct, dtype=bool)
    keep = np.isfinite(lp)
    lp, ok = lp[keep], ok[keep]
    if len(lp) == 0 or ok.all() or (~ok).all():
        raise DataError(
            "Cascade calibration needs edge answers that are both right and wrong, each with "
            "its mean log-probability."
        )
    best_t, best = float(lp.min()), -1.0
    for t in np.unique(lp):
        escalate = lp < t
        balanced = (escalate[~ok].mean() + (~escalate[ok]).mean()) / 2.0
        if balanced > best:
            best_t, best = float(t), float(balanced)
    return best_t


def _prompt_of(record: object) -> str:
    if isinstance(record, str):
        return record
    if isinstance(record, dict):
        for key in ("prompt", "question", "text", "input"):
            if isinstance(record.get(key), str):
                return str(record[key])
        msgs = record.get("messages")
        if isinstance(msgs, list):
            users = [m.get("content") for m in msgs
                     if isinstance(m, dict) and m.get("role") == "user"]
            if users and isinstance(users[-1], str):
                return users[-1]
    raise DataError(
        "Each prompt record needs a 'prompt', 'question', 'text' or 'messages' field."
    )


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from ``.jsonl`` (prompt/question/text/messages), ``.csv`` (prompt) or text lines."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p} does not exist; pass a file of prompts with --prompts.")
    try:
        raw = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{p} is not UTF-8 text.") from exc
    if p.suffix == ".jsonl":
        prompts = []
        for i, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                prompts.append(_prompt_of(json.loads(line)))
            except json.JSONDecodeError as exc:
                raise DataError(f"{p} line {i} is not JSON ({exc.msg}).") from exc
    elif p.suffix == ".csv":
        rows = list(csv.DictReader(raw.splitlines()))
        if rows and "prompt" not in rows[0]:
            raise DataError(f"{p} has no 'prompt' column.")
        prompts = [r["prompt"] for r in rows]
    else:
        prompts = [line for line in raw.splitlines() if line.strip()]
    prompts = [t for t in prompts if t.strip()]
    if not prompts:
        raise DataError(f"{p} holds no prompts.")
    return prompts
