"""Telling which of two unnamed model columns is the weak (edge) and which the strong (cloud) one."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from .._exceptions import DataError

# words in a column's name that say which side it is: ``router label`` writes ``edge:<model>`` and
# ``cloud:<model>``; hand-made files often say ``weak``/``strong`` or ``edge``/``cloud``
AMBIGUOUS_MIN_ROWS = 50  # below it the noise estimate itself is too rough to refuse on
_WEAK_WORDS = {"weak", "edge", "device", "local"}
_STRONG_WORDS = {"strong", "cloud", "remote", "server"}


def _side_from_name(col: str) -> str | None:
    words = set(re.split(r"[^a-z0-9]+", col.lower()))
    weak, strong = bool(words & _WEAK_WORDS), bool(words & _STRONG_WORDS)
    return "weak" if weak and not strong else "strong" if strong and not weak else None


def _pick_roles(p: Path, pair: list[str], values: dict[str, np.ndarray]) -> tuple[str, str]:
    """The weak and the strong column of two unnamed model columns: by their names when those say
    it (``edge:``/``cloud:``, weak/strong), else the less accurate one is weak. On a file of
    ``AMBIGUOUS_MIN_ROWS`` rows or more, accuracies too close to tell apart (within two standard
    errors of the mean gain) are refused: a wrong guess trains a router that sends the cloud the
    prompts the edge answers better (MMLU's five math and physics subjects: Mixtral 0.407, GPT-4
    0.399 on 727 rows, and GPT-4 became the weak model). Smaller files keep the accuracy rule."""
    sides = [_side_from_name(c) for c in pair]
    if sorted(s or "" for s in sides) == ["strong", "weak"]:
        weak, strong = pair if sides[0] == "weak" else pair[::-1]
        return weak, strong
    a, b = values[pair[0]], values[pair[1]]
    both = ~(np.isnan(a) | np.isnan(b))
    gain = (b - a)[both]
    weak, strong = sorted(pair, key=lambda c: values[c][both].mean())
    n = len(gain)
    se = float(np.std(gain, ddof=1) / np.sqrt(n)) if n > 1 else float("inf")
    # se 0: every row has one gain (all equal, or one class); the callers say what that means
    if n >= AMBIGUOUS_MIN_ROWS and se > 0 and not abs(float(gain.mean())) > 2 * se:
        acc = ", ".join(f"{c!r} {values[c][both].mean():.3f}" for c in pair)
        raise DataError(
            f"{p}: cannot tell which model is the strong one: their mean scores ({acc} on {n} rows "
            "with both) differ by less than the noise of that many rows. Name them with --weak-col "
            "(the edge, cheap model) and --strong-col (the cloud model)."
        )
    return weak, strong
