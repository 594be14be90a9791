"""The RouteLLM metrics against an independent, plain implementation (exact fractions, and brute
force over every order of the tied prompts), on random and adversarial inputs."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from hybridllm._exceptions import DataError
from hybridllm.router.evaluate import quality_curve, random_baseline, router_metrics


def _plain_curve(scores, weak, strong) -> list[Fraction]:
    """q(k/n), k = 0..n: the top k by score go strong; a partly taken tie group gives each of its
    prompts the same share of the strong call (the mean over the group's orders)."""
    n = len(scores)
    w = [Fraction(v).limit_denominator(10**6) for v in weak]
    s = [Fraction(v).limit_denominator(10**6) for v in strong]
    groups: dict[float, list[int]] = {}
    for i, v in enumerate(scores):
        groups.setdefault(float(v), []).append(i)
    ordered = [groups[v] for v in sorted(groups, reverse=True)]
    out = []
    for k in range(n + 1):
        share = [Fraction(0)] * n  # probability that prompt i goes to the strong model
        left = k
        for g in ordered:
            take = min(left, len(g))
            for i in g:
                share[i] = Fraction(take, len(g))
            left -= take
        out.append(sum(w[i] + share[i] * (s[i] - w[i]) for i in range(n)) / n)
    return out


def _brute_curve(scores, weak, strong) -> list[Fraction]:
    """The same curve as the mean over every order of the prompts that agrees with the scores."""
    n = len(scores)
    totals = [Fraction(0)] * (n + 1)
    count = 0
    for perm in itertools.permutations(range(n)):
        if any(scores[perm[j]] < scores[perm[j + 1]] for j in range(n - 1)):
            continue  # not a descending order of the scores
        count += 1
        for k in range(n + 1):
            top = set(perm[:k])
            totals[k] += Fraction(sum(strong[i] if i in top else weak[i] for i in range(n)), n)
    return [t / count for t in totals]


def _plain_metrics(scores, weak, strong) -> dict[str, float]:
    q = _plain_curve(scores, weak, strong)
    n = len(scores)
    W, S = q[0], q[-1]
    gap = S - W
    area = sum((q[k] + q[k + 1]) / 2 for k in range(n)) / n  # trapezoids of width 1/n

    def first(target: Fraction) -> float:
        return next((k / n for k in range(n + 1) if q[k] >= target), 1.0)

    return {
        "apgr": float((area - W) / gap),
        "cpt50": first(W + gap / 2),
        "cpt80": first(W + gap * Fraction(4, 5)),
        "calls_at_95": first(S * Fraction(95, 100)),
    }


def _compare(scores, weak, strong) -> None:
    got = router_metrics(scores, weak, strong)
    want = _plain_metrics(list(scores), list(weak), list(strong))
    assert got["n"] == len(scores)
    assert got["apgr"] == pytest.approx(want["apgr"], abs=1e-9)
    for key in ("cpt50", "cpt80", "calls_at_95"):
        assert got[key] == pytest.approx(want[key], abs=1e-12), key


def _labels(rng, n, p_weak=0.4, p_strong=0.7):
    while True:
        w = (rng.random(n) < p_weak).astype(float)
        s = (rng.random(n) < p_strong).astype(float)
        if s.mean() > w.mean():
            return w, s


@pytest.mark.parametrize("seed", range(40))
def test_random_inputs_match_the_plain_implementation(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 60))
    w, s = _labels(rng, n)
    # few distinct scores, so that ties are common, every other seed
    scores = rng.integers(0, 4, n).astype(float) if seed % 2 else rng.random(n)
    _compare(scores, w, s)


@pytest.mark.parametrize("seed", range(15))
def test_graded_labels_match_the_plain_implementation(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(2, 40))
    while True:
        w, s = np.round(rng.random(n), 2), np.round(rng.random(n), 2)
        if s.mean() > w.mean():
            break
    _compare(rng.integers(0, 3, n).astype(float), w, s)


@pytest.mark.parametrize("seed", range(25))
def test_tie_expectation_is_the_mean_over_orders(seed):
    rng = np.random.default_rng(200 + seed)
    n = int(rng.integers(1, 7))
    w, s = rng.integers(0, 2, n), rng.integers(0, 2, n)
    scores = rng.integers(0, 3, n).astype(float)
    got = quality_curve(scores, w, s).quality
    want = _brute_curve(list(scores), list(w), list(s))
    assert np.allclose(got, [float(v) for v in want], atol=1e-12)
    assert np.allclose(got, [float(v) for v in _plain_curve(scores, w, s)], atol=1e-12)


def test_adversarial_cases():
    # all ties: the diagonal, APGR exactly 0.5 whatever the labels
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 10, 101):
        w, s = np.zeros(n), np.ones(n)
        assert router_metrics(np.full(n, 0.3), w, s)["apgr"] == pytest.approx(0.5)
        w, s = _labels(rng, max(n, 2))
        _compare(np.zeros(len(w)), w, s)
    # one prompt: the strong model is right, the weak one wrong
    _compare([0.5], [0], [1])
    # every row a tie of labels (both right or both wrong) but one: only that row matters
    _compare([0.1, 0.9, 0.5, 0.5], [1, 0, 1, 0], [1, 0, 1, 1])
    # the strong model breaks as many as it fixes, plus one: gap 1/n
    _compare([4, 3, 2, 1, 0], [0, 1, 0, 1, 0], [1, 0, 1, 0, 1])
    # weak already at 95% of strong: no strong call needed
    m = router_metrics([1, 0] * 20, [1] * 39 + [0], [1] * 40)
    assert m["calls_at_95"] == 0.0
    _compare([1, 0] * 20, [1] * 39 + [0], [1] * 40)
    # -0.0 and 0.0 are one score (one tie group)
    assert router_metrics([0.0, -0.0], [0, 0], [1, 0])["apgr"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    "labels", [([1, 1, 1], [1, 1, 1]), ([0, 0], [0, 0]), ([1, 0], [0, 1]), ([1, 1], [0, 0])]
)
def test_no_gap_is_an_error(labels):
    with pytest.raises(DataError):
        router_metrics([0.2, 0.4, 0.1][: len(labels[0])], *labels)


@pytest.mark.parametrize(
    "weak,strong",
    [([0, float("nan"), 0], [1, 1, 1]), ([0, 0, 0], [1, float("nan"), 0]), ([0, 0, 0], [1, float("inf"), 0])],
)
def test_missing_labels_are_an_error_not_figures(weak, strong):
    # a NaN label made the gap NaN, which passed the "gap <= 0" check: APGR came out NaN and every
    # CPT / calls at 95% read 1.0, a plausible-looking figure for a router that was never scored
    with pytest.raises(DataError):
        router_metrics([0.3, 0.2, 0.1], weak, strong)


def test_random_baseline_centres_on_half():
    rng = np.random.default_rng(3)
    w, s = _labels(rng, 2000)
    assert random_baseline(w, s)["apgr"] == pytest.approx(0.5, abs=0.03)
    assert not math.isnan(random_baseline(w, s, repeats=2)["calls_at_95"])
