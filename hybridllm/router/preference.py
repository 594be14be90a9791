"""Pairwise judgements as routing labels: which of two answers was better, not a score of each.

Two shapes are read, the ones arena-style data comes in:

- a ``winner`` column: ``model_a``, ``model_b`` (or ``a``, ``b``), ``tie``, ``tie (bothbad)``,
  or the winning model's own name;
- indicator columns ``winner_model_a``, ``winner_model_b`` (and ``winner_tie``), 1 on the outcome.

``model_a`` and ``model_b`` columns name the two sides of each row; the models may change from row
to row. Which models count as strong and which as weak is the user's choice (RouteLLM groups
arena models into tiers by rating): a row is kept when one side is a strong model and the other a
weak one, and becomes a pair of scores

    strong side wins    strong 1, weak 0          tie              both 1
    weak side wins      strong 0, weak 1          tie (bothbad)    both 0

so the gain ``strong - weak`` is +1, -1 or 0, as with two correctness columns. Rows between two
models of one tier, or with a model of neither, are left out and counted. Without model columns the
file is one fixed pair and ``winner`` names a model (or a tie).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import NoReturn

import numpy as np

from .._exceptions import DataError

WINNER_COL = "winner"
FLAG_COLS = ("winner_model_a", "winner_model_b", "winner_tie")
SIDE_COLS = ("model_a", "model_b")
_A, _B, _TIE, _BAD = "a", "b", "tie", "bothbad"
_OUTCOMES = {
    "model_a": _A,
    "a": _A,
    "model_b": _B,
    "b": _B,
    "tie": _TIE,
    "draw": _TIE,
    "tie (bothbad)": _BAD,
    "tie(bothbad)": _BAD,
    "bothbad": _BAD,
    "both_bad": _BAD,
    "both bad": _BAD,
}
_BLANK = {"", "nan", "none", "null", "na", "n/a"}


def is_preference(header: list[str], tiers_given: bool = False) -> bool:
    """Whether a file holds pairwise judgements rather than one score column per model: indicator
    columns, or a ``winner`` column beside ``model_a``/``model_b`` (a ``winner`` column alone is
    read as judgements only when the tiers are given: a score file may carry one as a note)."""
    if FLAG_COLS[0] in header and FLAG_COLS[1] in header:
        return True
    return WINNER_COL in header and (tiers_given or all(c in header for c in SIDE_COLS))


@dataclass(frozen=True)
class Judged:
    weak: np.ndarray  # [kept] scores as above
    strong: np.ndarray
    keep: np.ndarray  # [kept] row indices
    weak_name: str  # the weak tier's models that occur, for the output
    strong_name: str
    left_out: int  # rows not between the tiers, or not judged


def tiers_from(values: list[str] | None) -> list[str]:
    """Model names or globs from repeated or comma-separated options, lower-cased."""
    return [p.strip().lower() for v in values or [] for p in v.split(",") if p.strip()]


def judged_scores(
    path: Path, header: list[str], rows: list[dict[str, str]], strong: list[str], weak: list[str]
) -> Judged:
    """The strong and weak scores of each row between the two tiers (see the module docstring)."""
    sides = all(c in header for c in SIDE_COLS)
    named = SIDE_COLS if sides else (WINNER_COL,)
    models = Counter(
        m
        for r in rows
        for m in (_name(r.get(c)) for c in named)
        if m.lower() not in _BLANK and m.lower() not in _OUTCOMES
    )
    if not strong or not weak:
        raise DataError(
            f"{path} holds pairwise judgements ({_shape(header)}) between {len(models)} models; say "
            "which are strong and which weak with --strong-models and --weak-models (names or "
            "globs, comma-separated), or, to train on score columns it also has, name them with "
            f"--weak-col and --strong-col. Most judged: {_most(models)}."
        )
    tier: dict[str, str] = {}
    for m in models:
        s, w = _matches(m, strong), _matches(m, weak)
        if s and w:
            raise DataError(f"{path}: model {m!r} matches both --strong-models and --weak-models.")
        if s or w:
            tier[m.lower()] = "strong" if s else "weak"  # names match as the tier globs do, any case
    if not sides:  # one fixed pair: a winner names one model of each tier, never two of one
        for t in ("strong", "weak"):
            ms = sorted(m for m, v in tier.items() if v == t)
            if len(ms) > 1:
                raise DataError(
                    f"{path} has no model_a and model_b columns, so it must judge one fixed pair, but "
                    f"its winners name {len(ms)} {t} models ({', '.join(ms[:4])}); add model_a and "
                    "model_b columns naming each row's two models."
                )
    weak_s, strong_s, keep = [], [], []
    for i, r in enumerate(rows):
        outcome = _outcome(path, i, r, header)
        if outcome is None:
            continue
        if sides:
            a, b = (_name(r.get(c)) for c in SIDE_COLS)
            ta, tb = tier.get(a.lower()), tier.get(b.lower())
            if {ta, tb} != {"strong", "weak"}:
                continue
            strong_side = _A if ta == "strong" else _B
            if outcome not in (_TIE, _BAD, _A, _B):  # the winner named by model
                won = outcome.lower()
                if won not in (a.lower(), b.lower()):
                    _unknown(path, i, outcome, a, b)
                outcome = _A if won == a.lower() else _B
        else:
            if outcome in (_A, _B):
                raise DataError(
                    f"{path} row {i + 1}: the winner is {r.get(WINNER_COL)!r} but the file has no "
                    "model_a and model_b columns naming the sides; add them, or write the winning "
                    "model's name."
                )
            if outcome not in (_TIE, _BAD):
                if outcome.lower() not in tier:
                    continue
                outcome = _A if tier[outcome.lower()] == "strong" else _B
            strong_side = _A
        if outcome == _TIE:
            st, wk = 1.0, 1.0
        elif outcome == _BAD:
            st, wk = 0.0, 0.0
        else:
            st, wk = (1.0, 0.0) if outcome == strong_side else (0.0, 1.0)
        strong_s.append(st)
        weak_s.append(wk)
        keep.append(i)
    if not keep:
        raise DataError(
            f"No judgement in {path} is between a --strong-models and a --weak-models model "
            f"(strong: {', '.join(strong)}; weak: {', '.join(weak)}). Most judged: {_most(models)}."
        )
    return Judged(
        weak=np.asarray(weak_s),
        strong=np.asarray(strong_s),
        keep=np.asarray(keep, dtype=np.int64),
        weak_name=_names({m for m in models if tier.get(m.lower()) == "weak"}),
        strong_name=_names({m for m in models if tier.get(m.lower()) == "strong"}),
        left_out=len(rows) - len(keep),
    )


def _outcome(path: Path, i: int, row: dict[str, str], header: list[str]) -> str | None:
    """The row's outcome (a, b, tie, bothbad, or a model's name), or None when it was not judged."""
    if WINNER_COL in header:
        raw = (row.get(WINNER_COL) or "").strip()
        if raw.lower() in _BLANK:
            return None
        return _OUTCOMES.get(raw.lower(), raw)
    flags = []
    for col, outcome in zip(FLAG_COLS, (_A, _B, _TIE), strict=True):
        cell = (row.get(col) or "").strip().lower()
        if cell in ("1", "1.0", "true", "yes"):
            flags.append(outcome)
        elif cell not in ("0", "0.0", "false", "no") and cell not in _BLANK:
            raise DataError(f"{path} row {i + 1}: {col} is {cell!r}; it should be 1 or 0.")
    if len(flags) > 1:
        raise DataError(f"{path} row {i + 1}: more than one of {', '.join(FLAG_COLS)} is 1.")
    return flags[0] if flags else None


def _unknown(path: Path, i: int, outcome: str, a: str, b: str) -> NoReturn:
    raise DataError(
        f"{path} row {i + 1}: the winner {outcome!r} is neither side ({a!r}, {b!r}) nor one of "
        "model_a, model_b, tie, tie (bothbad)."
    )


def _name(cell: str | None) -> str:
    """A model name as written, without the spaces around it."""
    return (cell or "").strip()


def _matches(model: str, patterns: list[str]) -> bool:
    m = model.strip().lower()
    return any(fnmatchcase(m, p) for p in patterns)


def _shape(header: list[str]) -> str:
    return "a winner column" if WINNER_COL in header else ", ".join(c for c in FLAG_COLS if c in header)


def _most(models: Counter[str], n: int = 8) -> str:
    return ", ".join(f"{m} ({c})" for m, c in models.most_common(n)) or "none"


def _names(models) -> str:  # noqa: ANN001 - any iterable of names
    ms = sorted(models)
    return ", ".join(ms[:4]) + (f" and {len(ms) - 4} more" if len(ms) > 4 else "")
