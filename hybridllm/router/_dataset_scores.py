"""Score cells and columns of a labelled file: correctness or graded scores, their scale, edge logprobs."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from .._exceptions import DataError
from ._dataset_table import PROMPT_COL

LOGPROB_COL = "edge_mean_logprob"  # written by `hybridllm router label`
CLOUD_TOKENS_COL = "cloud_tokens"  # written by `hybridllm router label`: the cloud answer's tokens
# correctness as graders write it: a judge's "correct"/"incorrect", a test run's "pass"/"fail"
# and Excel's TRUE/FALSE as it writes them in a German, French, Spanish, Italian, Dutch or
# Portuguese locale (the locales whose CSV it writes with ';')
_TRUE = {"true", "1", "yes", "1.0", "correct", "right", "pass", "passed",
         "wahr", "vrai", "verdadero", "vero", "waar", "verdadeiro"}
_FALSE = {"false", "0", "no", "0.0", "incorrect", "wrong", "fail", "failed",
          "falsch", "faux", "falso", "onwaar"}
_DECIMAL_COMMA = re.compile(r"[+-]?\d+,\d+")  # 0,75: a ';' file's number (Excel in such a locale)
_BLANK = {"", "nan", "none", "null", "na", "n/a"}


def _to_bool(value: str) -> float | None:
    v = value.strip().lower()
    if v in _TRUE:
        return 1.0
    if v in _FALSE:
        return 0.0
    return None


def _to_score(value: str, decimal_comma: bool = False) -> float | None:
    """A cell as a number: True/False as 1/0, a blank as NaN; None when it is neither. With
    ``decimal_comma`` (a file separated by ';'), 0,75 is 0.75."""
    v = value.strip().lower()
    if decimal_comma and _DECIMAL_COMMA.fullmatch(v):
        v = v.replace(",", ".")
    if v in _BLANK:
        return float("nan")
    b = _to_bool(v)
    if b is not None:
        return b
    try:
        f = float(v)
    except ValueError:
        return None
    return f if np.isfinite(f) else None


def _score_columns(
    header: list[str], rows: list[dict[str, str]], prompt_col: str = PROMPT_COL, decimal_comma: bool = False
) -> tuple[dict[str, np.ndarray], set[str]]:
    """Every column whose cells are all numbers or blanks (some not blank), and which of those
    hold only True/False-like cells (``decimal_comma``: see _to_score)."""
    values: dict[str, np.ndarray] = {}
    boolean: set[str] = set()
    for col in header:
        if col in (prompt_col, LOGPROB_COL, CLOUD_TOKENS_COL):
            continue
        cells = [r.get(col) or "" for r in rows]
        parsed = [_to_score(c, decimal_comma) for c in cells]
        if any(v is None for v in parsed):
            continue
        arr = np.asarray(parsed, dtype=np.float64)
        if np.isnan(arr).all():
            continue
        values[col] = arr
        if all(_to_bool(c) is not None for c in cells if c.strip().lower() not in _BLANK):
            boolean.add(col)
    return values, boolean


def _bad_cell(rows: list[dict[str, str]], col: str, decimal_comma: bool = False) -> tuple[int, str] | None:
    """The first row (1-based, after the header) whose ``col`` cell is not a score, and the cell."""
    for i, r in enumerate(rows):
        cell = r.get(col) or ""
        if _to_score(cell, decimal_comma) is None:
            return i + 1, cell
    return None


def _spoiled_columns(
    header: list[str], rows: list[dict[str, str]], prompt_col: str, numeric: dict[str, np.ndarray],
    decimal_comma: bool = False,
) -> str:
    """What to say of columns left out as scores for a few cells that are not ("maybe", "inf", a
    typo): at least as many of their cells are scores. Said nowhere, a file whose second model
    column held one such cell was refused as having "one model column", with no row to fix."""
    said = []
    for col in header:
        if col in (prompt_col, LOGPROB_COL, CLOUD_TOKENS_COL) or col in numeric:
            continue
        parsed = [_to_score(r.get(col) or "", decimal_comma) for r in rows]
        good = sum(v is not None and not np.isnan(v) for v in parsed)
        bad = _bad_cell(rows, col, decimal_comma)
        if bad is not None and good >= sum(v is None for v in parsed):
            said.append(f"column {col!r} is not read as scores: row {bad[0]} holds {bad[1]!r}")
        if len(said) == 3:
            break
    return f" ({'; '.join(said)}; fix or blank such cells)" if said else ""


def _scaled(
    numeric: dict[str, np.ndarray], boolean: set[str], score_range: tuple[float, float] | None
) -> dict[str, np.ndarray]:
    """The columns usable as scores in [0, 1]: as they are, or mapped from ``score_range``
    (True/False columns stay 0/1)."""
    if score_range is None:
        return {c: v for c, v in numeric.items() if np.nanmin(v) >= 0.0 and np.nanmax(v) <= 1.0}
    lo, hi = (float(b) for b in score_range)
    if not hi > lo:
        raise DataError(f"--score-range needs LO < HI, got {lo:g},{hi:g}.")
    out = {}
    for col, v in numeric.items():
        if col in boolean:
            out[col] = v
        elif np.nanmin(v) >= lo and np.nanmax(v) <= hi:
            out[col] = (v - lo) / (hi - lo)  # a mark on [lo, hi] as a fraction of the scale
    return out


def _logprob_column(p: Path, rows: list[dict[str, str]], decimal_comma: bool = False) -> np.ndarray | None:
    """The edge answers' mean log-probabilities (blank cells become NaN), or None when no cell
    holds one. A cell that is not a number, or above 0 (a probability, not its log: the floor
    calibrated on it escalated every answer), is refused with its row: one such cell dropped the
    whole column without a word, and the cascade kept the default floor. ``decimal_comma``: -0,31
    in a ';' file (Excel's CSV where the decimal separator is a comma) is -0.31, as for scores."""
    out = np.full(len(rows), np.nan)
    for i, r in enumerate(rows):
        cell = (r.get(LOGPROB_COL) or "").strip()
        if decimal_comma and _DECIMAL_COMMA.fullmatch(cell):
            cell = cell.replace(",", ".")
        if cell.lower() in _BLANK:
            continue
        try:
            out[i] = float(cell)
        except ValueError:
            out[i] = np.inf  # refused below, as not a number
        # 1e-6: a mean of log-probabilities computed in float32 may come out a hair above 0
        if not (out[i] <= 1e-6 or np.isnan(out[i])):
            raise DataError(
                f"{p} row {i + 1}: {LOGPROB_COL} is {cell!r}, not a mean token log-probability (a "
                "number <= 0, blank where unknown); a probability p is written as its log, ln(p)."
            )
    return out if np.isfinite(out).any() else None
