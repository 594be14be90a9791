"""Cascade calibration on log-probabilities that do not tell wrong answers from right ones: the
floor came out as their lowest value, which escalates nothing, and nothing said so."""

from __future__ import annotations

import numpy as np
import pytest

from hybridllm._exceptions import DataError
from hybridllm.cli import main
from hybridllm.router.calibrate import calibrate_logprob_threshold


def test_all_equal_log_probabilities_are_refused_with_the_value() -> None:
    with pytest.raises(DataError, match=r"all 6 are -0\.5.*never escalate"):
        calibrate_logprob_threshold([-0.5] * 6, [1, 0, 1, 0, 1, 1])


def test_wrong_answers_more_confident_than_right_ones_are_refused() -> None:
    # the floor was -3.0, the lowest value: no answer is below it
    with pytest.raises(DataError, match="no less confident than the right ones"):
        calibrate_logprob_threshold([-3.0, -2.0, -0.1, -0.2], [1, 1, 0, 0])


def test_a_floor_that_escalates_something_is_still_returned() -> None:
    t = calibrate_logprob_threshold([-3.0, -2.0, -0.1, -0.2], [0, 0, 1, 1])
    assert t == -0.2  # wrong ones below it, right ones at or above
    lp = np.array([-3.0, -2.0, -0.1, -0.2])
    assert (lp < t).sum() == 2


def test_router_train_says_so_in_one_line(tmp_path, capsys) -> None:
    rows = ["prompt,weak,strong,edge_mean_logprob"]
    rows += [f"question {i},{i % 3 == 0},True,-0.7" for i in range(40)]
    data = tmp_path / "a.csv"
    data.write_text("\n".join(rows) + "\n")
    rc = main(["router", "train", "--data", str(data), "--out", str(tmp_path / "r"), "--no-embedding"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err and "never escalate" in err
    assert not (tmp_path / "r").exists()  # no router with a floor that never escalates


def test_training_refuses_before_any_fitting(monkeypatch) -> None:
    # the floor does not depend on the scorer: a run whose log-probabilities are refused stops
    # before the embedding and the cross-validation (minutes on a large file), not after them
    from hybridllm.router import train as train_mod
    from hybridllm.router.dataset import RoutingData

    def no_fitting(*a, **k):
        raise AssertionError("fitted before the log-probabilities were checked")

    monkeypatch.setattr(train_mod, "cross_validate", no_fitting)
    monkeypatch.setattr(train_mod, "feature_matrix", no_fitting)
    data = RoutingData(prompts=[f"q{i}" for i in range(8)], weak=np.array([1.0, 0.0] * 4),
                       strong=np.ones(8), weak_col="weak", strong_col="strong",
                       edge_logprob=np.full(8, -0.7))
    with pytest.raises(DataError, match="never escalate"):
        train_mod.train_router(data, use_embedding=False)
