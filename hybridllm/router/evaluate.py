"""RouteLLM's router metrics: the cost/quality curve, APGR, CPT(50%), CPT(80%), calls at 95%.

The curve (as in ``../shared/data/README.md`` and RouteLLM's ``evals/``): sort prompts by the
router's score, send the top ``k`` of ``n`` to the strong model and the rest to the weak one, and
read the mean correctness ``q(k/n)`` for every ``k = 0..n``. Prompts with equal scores are
interchangeable, so inside a tie the curve is the expectation over their order (a straight line
between the tie's ends); a constant score therefore gives the random router's diagonal.

    APGR        = (area(q) - W) / (S - W)           W, S: weak and strong mean correctness
    CPT(p)      = min{k/n : q(k/n) >= W + p (S - W)}
    calls_at_95 = min{k/n : q(k/n) >= 0.95 S}
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from .._exceptions import DataError

RANDOM_REPEATS = 10


@dataclass(frozen=True)
class Curve:
    """Quality at each fraction of strong calls: ``x`` and ``quality`` are ``[n + 1]``."""

    x: np.ndarray
    quality: np.ndarray
    weak: float
    strong: float


def quality_curve(scores: ArrayLike, weak: ArrayLike, strong: ArrayLike) -> Curve:
    s = np.asarray(scores, dtype=np.float64)
    w = np.asarray(weak, dtype=np.float64)
    st = np.asarray(strong, dtype=np.float64)
    n = len(s)
    if n == 0 or len(w) != n or len(st) != n:
        raise DataError(
            f"Need one score per prompt and matching correctness columns (got {n} scores, "
            f"{len(w)} weak, {len(st)} strong values)."
        )
    if not np.all(np.isfinite(s)):
        raise DataError("The router produced non-finite scores; check the router file.")
    # a missing (NaN) label made the gap NaN, which no "gap <= 0" test catches: APGR NaN and every
    # CPT 1.0; the loaders drop unlabelled rows, so here it can only be a caller's slip
    if not (np.all(np.isfinite(w)) and np.all(np.isfinite(st))):
        raise DataError(
            "Every prompt needs a weak and a strong score (NaN or inf found); drop unlabelled rows."
        )
    order = np.argsort(-s, kind="stable")
    gain = (st - w)[order]  # +1: the strong call fixes a weak error, -1: it breaks a weak answer
    cum = np.concatenate([[0.0], np.cumsum(gain)])  # [n + 1]
    sorted_scores = s[order]
    # tie groups: boundaries where the sorted score changes, plus both ends
    change = np.flatnonzero(sorted_scores[1:] != sorted_scores[:-1]) + 1
    bounds = np.concatenate([[0], change, [n]])
    k = np.arange(n + 1)
    cum_expected = np.interp(k, bounds, cum[bounds])
    quality = w.mean() + cum_expected / n
    return Curve(x=k / n, quality=quality, weak=float(w.mean()), strong=float(st.mean()))


def _first_reaching(curve: Curve, target: float) -> float:
    reached = np.flatnonzero(curve.quality >= target - 1e-12)
    return float(curve.x[reached[0]]) if len(reached) else 1.0


def has_gap(weak: float, strong: float) -> bool:
    """Whether the strong mean correctness beats the weak one by more than rounding: two means of
    the same values summed in another order may differ in the last bit, and a gap of 1e-16 is no
    gap (APGR divided by it came out -1.7e14). Callers that skip a no-gap subset test this, not
    ``strong > weak``, else :func:`metrics_from_curve` refuses the subset they passed to it."""
    return strong - weak > 1e-9 * max(1.0, abs(strong), abs(weak))


def metrics_from_curve(curve: Curve) -> dict[str, float]:
    gap = curve.strong - curve.weak
    if not has_gap(curve.weak, curve.strong):
        raise DataError(
            f"The strong model ({curve.strong:.3f}) is not more accurate than the weak one "
            f"({curve.weak:.3f}) on this data, so routing cannot gain quality; check that "
            "--weak-col and --strong-col are not swapped."
        )
    area = float(np.sum((curve.quality[1:] + curve.quality[:-1]) * np.diff(curve.x)) / 2.0)
    return {
        "apgr": (area - curve.weak) / gap,
        "cpt50": _first_reaching(curve, curve.weak + 0.5 * gap),
        "cpt80": _first_reaching(curve, curve.weak + 0.8 * gap),
        "calls_at_95": _first_reaching(curve, 0.95 * curve.strong),
    }


def router_metrics(
    scores: ArrayLike, weak: ArrayLike, strong: ArrayLike
) -> dict[str, float]:
    """``apgr``, ``cpt50``, ``cpt80``, ``calls_at_95`` and ``n`` for one router's scores."""
    metrics: dict[str, float] = metrics_from_curve(quality_curve(scores, weak, strong))
    metrics["n"] = int(np.size(scores))
    return metrics


def random_baseline(
    weak: ArrayLike, strong: ArrayLike, *, repeats: int = RANDOM_REPEATS, seed: int = 0
) -> dict[str, float]:
    """The mean of ``repeats`` random routers' metrics."""
    rng = np.random.default_rng(seed)
    runs = [router_metrics(rng.random(np.size(weak)), weak, strong) for _ in range(repeats)]
    return {key: float(np.mean([r[key] for r in runs])) for key in runs[0]}


def length_baseline(
    prompts: Sequence[str], weak: ArrayLike, strong: ArrayLike
) -> dict[str, float]:
    """Prompt length in characters as the score (longer → strong)."""
    return router_metrics([len(p) for p in prompts], weak, strong)


def plot_curves(curves: dict[str, Curve], path: str | Path, *, title: str = "") -> Path:
    """Save the quality vs strong-call-fraction curves as a PNG (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise DataError(
            "--plot needs matplotlib: pip install 'hybridllm[dev]' or matplotlib."
        ) from exc
    fig, ax = plt.subplots(figsize=(7, 4.5))
    any_curve = next(iter(curves.values()))
    for name, curve in curves.items():
        ax.plot(curve.x * 100, curve.quality * 100, label=name)
    ax.axhline(any_curve.weak * 100, color="grey", linestyle="--", label="weak only")
    ax.axhline(any_curve.strong * 100, color="red", linestyle="--", label="strong only")
    ax.set_xlabel("Strong model calls (%)")
    ax.set_ylabel("Accuracy (%)")
    ax.set_title(title or "Cost / quality")
    ax.legend()
    out = Path(path)
    # matplotlib writes "curve" as "curve.png": name the file it writes, not the one asked for
    fmt = os.path.splitext(str(out))[1][1:].lower()
    if not fmt:
        out = out.with_name(out.name.rstrip(".") + ".png")
    supported = fig.canvas.get_supported_filetypes()
    try:
        if fmt and fmt not in supported:  # matplotlib's ValueError read as an internal error
            raise DataError(
                f"--plot {path}: cannot write .{fmt} files; use one of "
                f"{', '.join(sorted(supported))} (say curve.png)."
            )
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110, bbox_inches="tight")
    except OSError as exc:  # a folder, a missing permission, a file where a folder should be
        raise DataError(f"--plot {path}: cannot write the plot ({exc.strerror or exc}).") from exc
    finally:
        plt.close(fig)
    return out
