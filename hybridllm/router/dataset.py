"""Reading RouteLLM-format CSV files: a ``prompt`` column and one True/False column per model."""

from __future__ import annotations

import csv
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._exceptions import DataError

PROMPT_COL = "prompt"
LOGPROB_COL = "edge_mean_logprob"  # written by `hybridllm router label`
CLOUD_TOKENS_COL = "cloud_tokens"  # written by `hybridllm router label`: the cloud answer's tokens
_TRUE = {"true", "1", "yes", "1.0"}
_FALSE = {"false", "0", "no", "0.0"}


@dataclass(frozen=True)
class RoutingData:
    """Prompts with the weak and the strong model's correctness (0/1 floats)."""

    prompts: list[str]
    weak: np.ndarray  # [n] float64 in {0, 1}
    strong: np.ndarray  # [n] float64 in {0, 1}
    weak_col: str
    strong_col: str
    edge_logprob: np.ndarray | None = None  # [n] mean token logprob of the weak (edge) answer

    @property
    def labels(self) -> np.ndarray:
        """1 where the strong model was needed: the weak one failed and the strong one succeeded."""
        return ((self.weak == 0) & (self.strong == 1)).astype(np.int64)


def _to_bool(value: str) -> float | None:
    v = value.strip().lower()
    if v in _TRUE:
        return 1.0
    if v in _FALSE:
        return 0.0
    return None


def load_routellm_csv(
    path: str | Path, *, weak_col: str | None = None, strong_col: str | None = None
) -> RoutingData:
    """Load a RouteLLM-format CSV.

    Without ``weak_col``/``strong_col`` the file must hold exactly two True/False model columns;
    the less accurate one is the weak model.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p} does not exist; pass a RouteLLM-format CSV with --data.")
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    try:
        with p.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            header = list(reader.fieldnames or [])
            rows = list(reader)
    except (UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{p} is not a readable UTF-8 CSV file ({exc}).") from exc
    if not header:
        raise DataError(f"{p} is empty; it needs a header with 'prompt' and two model columns.")
    if PROMPT_COL not in header:
        raise DataError(
            f"{p} has no '{PROMPT_COL}' column (columns: {', '.join(header)}); "
            "RouteLLM-format files have 'prompt' plus one True/False column per model."
        )
    if not rows:
        raise DataError(f"{p} has a header but no rows; add labelled prompts.")
    for name, col in (("--weak-col", weak_col), ("--strong-col", strong_col)):
        if col is not None and col not in header:
            raise DataError(f"{p} has no column {col!r} for {name}; columns: {', '.join(header)}.")
    values: dict[str, np.ndarray] = {}
    for col in header:
        if col in (PROMPT_COL, LOGPROB_COL, CLOUD_TOKENS_COL):
            continue
        parsed = [_to_bool(r.get(col) or "") for r in rows]
        if all(v is not None for v in parsed):
            values[col] = np.asarray(parsed, dtype=np.float64)
    for col in (weak_col, strong_col):
        if col is not None and col not in values:
            raise DataError(f"Column {col!r} of {p} is not all True/False values.")
    if weak_col is None or strong_col is None:
        candidates = [c for c in values if c not in (weak_col, strong_col)]
        known = [c for c in (weak_col, strong_col) if c is not None]
        if len(candidates) + len(known) != 2:
            raise DataError(
                f"{p} has {len(values)} True/False model columns ({', '.join(values) or 'none'}); "
                "name the two models with --weak-col and --strong-col."
            )
        pair = known + candidates
        pair.sort(key=lambda c: values[c].mean())
        if weak_col is None and strong_col is None:
            weak_col, strong_col = pair
        elif weak_col is None:
            weak_col = next(c for c in pair if c != strong_col)
        else:
            strong_col = next(c for c in pair if c != weak_col)
    if weak_col is None or strong_col is None:  # unreachable: both are set above
        raise DataError(f"{p}: could not tell the weak and the strong model columns apart.")
    prompts = [r.get(PROMPT_COL) or "" for r in rows]
    if not any(pr.strip() for pr in prompts):
        raise DataError(f"Every prompt in {p} is empty.")
    return RoutingData(
        prompts=prompts,
        weak=values[weak_col],
        strong=values[strong_col],
        weak_col=weak_col,
        strong_col=strong_col,
        edge_logprob=_float_column(rows, LOGPROB_COL) if LOGPROB_COL in header else None,
    )


def _float_column(rows: list[dict[str, str]], col: str) -> np.ndarray | None:
    """A numeric column (blank cells become NaN), or None when it holds no number at all."""
    out = np.full(len(rows), np.nan)
    for i, r in enumerate(rows):
        try:
            out[i] = float(r.get(col) or "nan")
        except ValueError:
            return None
    return out if np.isfinite(out).any() else None


def texts_digest(texts: list[str]) -> str:
    """A short content hash of a list of prompts (keys the feature cache)."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()[:20]
