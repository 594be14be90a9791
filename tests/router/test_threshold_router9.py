"""The threshold's ends and the reason that shows it.

RouteLLM's rule, the cloud when score >= threshold, with its ends exact: threshold 0 sends every
prompt and threshold 1 none. Before: a score of exactly 1.0 went to the cloud at threshold 1 (and a
threshold above 1 is refused), so nothing said "never the cloud"; calibrating to 0% gave a
threshold just above the sample's top score (1.0 when that was 1.0: still the cloud), and to 100%
the sample's lowest score (a new, lower-scoring prompt stayed on the device). And a reason rounded
to 3 decimals read "score 0.560 < threshold 0.560"."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

from hybridllm.router.calibrate import calibrate_threshold
from hybridllm.router.classifier import GainScorer
from hybridllm.router.features import TEXT_FEATURES
from hybridllm.router.policy import RoutingPolicy, apart
from hybridllm.router.router import Router, load_router, sends_to_cloud

from .fakes import length_router

TRAFFIC = [f"Question {i}: " + "x" * (20 * i) for i in range(1, 21)]


def _sure_router(threshold: float) -> Router:
    """Every prompt scores exactly 1.0: one class, gain +1, so (1 + 1) / 2."""
    d = len(TEXT_FEATURES)
    scorer = GainScorer(mean=np.zeros(d, np.float32), scale=np.ones(d, np.float32),
                        coef=np.zeros((1, d), np.float32), intercept=np.zeros(1, np.float32),
                        classes=np.asarray([1.0], np.float32))
    return Router(scorer=scorer, threshold=threshold, use_embedding=False)


def test_threshold_1_sends_nothing_to_the_cloud_not_even_a_score_of_1():
    router = _sure_router(1.0)
    assert router.score("anything") == 1.0
    assert router.route("anything") == ("edge", 1.0)
    d = RoutingPolicy(router, privacy="off").decide("anything")
    assert d.route == "edge" and d.reason == "score 1.000, threshold 1.000: never the cloud"
    # just below 1 the rule is RouteLLM's again
    assert _sure_router(float(np.nextafter(1.0, 0.0))).route("anything")[0] == "cloud"
    assert RoutingPolicy(_sure_router(0.0), privacy="off").decide("anything").route == "cloud"


def test_sends_to_cloud_on_arrays_and_one_score():
    scores = np.asarray([0.0, 0.3, 0.5, 1.0])
    assert sends_to_cloud(scores, 0.5).tolist() == [False, False, True, True]
    assert sends_to_cloud(scores, 0.0).all() and not sends_to_cloud(scores, 1.0).any()
    assert bool(sends_to_cloud(1.0, 1.0)) is False and bool(sends_to_cloud(0.5, 0.5)) is True


def test_calibrating_to_0_percent_keeps_even_a_score_of_1_on_the_device():
    tuned = _sure_router(0.5).calibrated(["a prompt", "another prompt"], 0.0)
    assert tuned.threshold == 1.0 and tuned.route("a third prompt")[0] == "edge"
    assert calibrate_threshold([0.1, 0.4, 1.0], 0.0) == 1.0


def test_calibrating_to_100_percent_sends_prompts_below_the_samples_lowest_score_too():
    router = length_router(0.5)
    tuned = router.calibrated(TRAFFIC, 1.0)
    assert tuned.threshold == 0.0
    assert router.score("Hi") < min(router.score_texts(TRAFFIC))  # scores below the whole sample
    assert tuned.route("Hi")[0] == "cloud"


def test_a_calibrated_threshold_between_two_scores_of_1_stays_below_1():
    """Half of [0.2, 1, 1, 1] to the cloud: midway between the two middle scores is 1.0, which
    would now keep them on the device; the threshold is the float below 1 instead."""
    t = calibrate_threshold([0.2, 1.0, 1.0, 1.0], 0.5)
    assert t < 1.0 and sends_to_cloud([0.2, 1.0], t).tolist() == [False, True]


def test_calibrate_command_at_0_says_threshold_1_and_no_cloud(tmp_path, capsys):
    from hybridllm.cli import main

    _sure_router(0.5).save(tmp_path / "r")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("first prompt\nsecond prompt\nthird prompt\n")
    assert main(["router", "calibrate", "--prompts", str(prompts), "--cloud-fraction", "0",
                 "--router", str(tmp_path / "r"), "--out", str(tmp_path / "out")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["threshold"] == 1.0 and out["realized_cloud_fraction"] == 0.0
    assert load_router(tmp_path / "out").route("a new prompt")[0] == "edge"


def test_eval_at_threshold_1_counts_no_cloud_call(tmp_path):
    from hybridllm.router._cli import evaluate_router_on

    router = length_router(1.0)
    # a prompt so long that its score is exactly 1.0 in float32: before, it went to the cloud
    long_prompt = "y" * 200_000
    assert router.score(long_prompt) == 1.0
    dataclasses.replace(router).save(tmp_path / "r")
    rows = [("short q", True, True), ("mid question " * 3, False, True), (long_prompt, False, True),
            ("another one", True, False)]
    csv = tmp_path / "labels.csv"
    csv.write_text("prompt,weak,strong\n" + "".join(f"{p},{w},{s}\n" for p, w, s in rows))
    result = evaluate_router_on(str(csv), str(tmp_path / "r"), weak_col="weak", strong_col="strong")
    assert result["at_threshold"]["threshold"] == 1.0
    assert result["at_threshold"]["cloud_fraction"] == 0.0


# the reason ----------------------------------------------------------------------------------------
def _shown(reason: str) -> tuple[str, str, str]:
    m = re.fullmatch(r"score (\S+) (<|>=) threshold (\S+)", reason)
    assert m, reason
    return m[1], m[2], m[3]


@pytest.mark.parametrize("offset", [1e-4, 1e-7, 1e-12, -1e-4, -1e-7, -1e-12, 0.0])
def test_the_reason_shows_enough_digits_for_the_comparison_made(offset):
    router = length_router(0.5)
    prompt = "How far is the moon from the earth, in kilometres and in miles?"
    score = router.score(prompt)
    t = score + offset
    assert f"{score:.3f}" == f"{t:.3f}"  # at 3 decimals the two read the same
    d = RoutingPolicy(dataclasses.replace(router, threshold=t), privacy="off").decide(prompt)
    shown_score, op, shown_t = _shown(d.reason)
    assert d.route == ("edge" if score < t else "cloud")
    assert op == ("<" if d.route == "edge" else ">=")
    # what is shown compares as the numbers do
    assert (float(shown_score) < float(shown_t)) == (score < t)
    assert (float(shown_score) == float(shown_t)) == (score == t)
    assert len(shown_score) == len(shown_t) >= 5  # "0.xyz" at the least, both alike


def test_apart_takes_the_fewest_digits():
    assert apart(0.559539, 0.55954) == ("0.559539", "0.559540")
    assert apart(0.1234, 0.5) == ("0.123", "0.500")
    assert apart(0.5, 0.5) == ("0.500", "0.500")
    assert apart(0.25, 0.2500001) == ("0.2500000", "0.2500001")
    assert apart(1e-300, 2e-300) == ("1e-300", "2e-300")  # closer than any fixed decimals show


def test_the_shipped_router_reason_at_a_threshold_next_to_a_real_score():
    """The real router and embedder: a threshold one float above a prompt's score keeps it on the
    device, and the reason shows the two apart; at the score itself, the cloud."""
    router = load_router()
    prompt = "Prove that there are infinitely many primes of the form 4k + 3."
    score = router.score(prompt)
    above = float(np.nextafter(score, 1.0))
    d = RoutingPolicy(dataclasses.replace(router, threshold=above), privacy="off").decide(prompt)
    shown_score, op, shown_t = _shown(d.reason)
    assert d.route == "edge" and op == "<" and float(shown_score) < float(shown_t), d.reason
    d = RoutingPolicy(dataclasses.replace(router, threshold=score), privacy="off").decide(prompt)
    assert d.route == "cloud" and d.reason == f"score {score:.3f} >= threshold {score:.3f}"
    d = RoutingPolicy(dataclasses.replace(router, threshold=1.0), privacy="off").decide(prompt)
    assert d.route == "edge" and d.reason.endswith("never the cloud")
