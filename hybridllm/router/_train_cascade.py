"""The cascade's log-probability floor, calibrated on the edge answers of the training and cascade files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .._exceptions import DataError
from .calibrate import calibrate_logprob_threshold
from .dataset import LOGPROB_COL, RoutingData, file_columns, load_routellm_csv
from .router import DEFAULT_LOGPROB_THRESHOLD


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


def _cascade_file(path: str | Path, **options: Any) -> RoutingData:
    """A --cascade-data file, refused without edge log-probabilities: it would calibrate nothing,
    and the router kept the default floor without a word. It is read with the options the --data
    files are (``load_routellm_csv``'s: the columns named, where it has them, and the scale): read
    without them, a file of a judge's 1-10 marks was refused for want of the --score-range the
    command had given."""
    header = file_columns(path)
    for col in ("weak_col", "strong_col", "prompt_col"):
        if options.get(col) not in header:
            options[col] = None
    data = load_routellm_csv(path, **options)
    if data.edge_logprob is None or not np.isfinite(data.edge_logprob).any():
        raise DataError(
            f"--cascade-data {path} has no edge log-probabilities (a {LOGPROB_COL!r} column with "
            "numbers, as `hybridllm router label` writes), so it cannot calibrate the cascade's "
            "floor; pass such a file, or train without it."
        )
    return data
