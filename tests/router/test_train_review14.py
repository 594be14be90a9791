"""Training refuses data it cannot cross-validate with a clear error, before any embedding."""

from __future__ import annotations

import numpy as np
import pytest

from hybridllm._exceptions import DataError
from hybridllm.cli import main
from hybridllm.router import train as train_mod
from hybridllm.router.dataset import RoutingData
from hybridllm.router.train import pool


def _csv(path, n=60, needed=(7,)):
    rows = ["prompt,weak,strong"]
    for i in range(n):
        w = i not in needed  # the weak model fails only on ``needed``; the strong one is always right
        rows.append(f"question number {i} about {'x' * (i % 7)},{w},True")
    path.write_text("\n".join(rows) + "\n")
    return path


def test_one_prompt_needing_the_strong_model_is_refused_clearly(tmp_path, capsys):
    """One such prompt in 60: its fold's training rows have none, and the fit said "the data needs
    prompts where the strong model was needed" (exit 1 after three fits), which the file has."""
    data = _csv(tmp_path / "one.csv")
    rc = main(["router", "train", "--data", str(data), "--out", str(tmp_path / "r"), "--no-embedding"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert "Only 1 distinct prompt(s) need the strong model" in err and "fold" in err
    assert not (tmp_path / "r").exists()


def test_fold_problems_are_found_before_the_embedding(tmp_path, monkeypatch):
    """--folds 1 and a file with one prompt needing the strong model failed only after every
    prompt was embedded (minutes on two cores for ten thousand)."""

    def no_embedding(*args, **kwargs):
        raise AssertionError("embedded before the folds were checked")

    monkeypatch.setattr(train_mod, "cached_embeddings", no_embedding)
    with pytest.raises(DataError, match="Only 1 distinct"):
        train_mod.train_from_csv(_csv(tmp_path / "one.csv"), tmp_path / "r")
    with pytest.raises(DataError, match="at least 2 folds"):
        ok = _csv(tmp_path / "ok.csv", needed=range(0, 60, 3))
        train_mod.train_from_csv(ok, tmp_path / "r", num_folds=1)


def test_check_folds_passes_learnable_folds_and_names_the_fold_that_is_not():
    from hybridllm.router.train import check_folds

    prompts = [f"q{i}" for i in range(40)]
    strong = np.ones(40)
    weak = np.ones(40)
    weak[::4] = 0.0  # ten prompts need the strong model, spread over the folds
    data = RoutingData(prompts=prompts, weak=weak, strong=strong, weak_col="w", strong_col="s")
    assert check_folds(data, 5).shape == (40,)
    weak = np.ones(40)
    weak[3] = 0.0
    one = RoutingData(prompts=prompts, weak=weak, strong=strong, weak_col="w", strong_col="s")
    with pytest.raises(DataError, match=r"Only 1 distinct prompt\(s\).* holds all of them"):
        check_folds(one, 5)
    check_folds(one, 5, mixture=True)  # a source mixture gives such a fold a constant expert


@pytest.mark.parametrize("weight", ["inf", "1e400"])
def test_an_infinite_weight_is_refused_as_such(tmp_path, capsys, weight):
    """--weight inf passed the "positive" test; every row's weight came out NaN (a RuntimeWarning)
    and the fit failed with "sample_weight needs one finite, non-negative weight per prompt"."""
    a = _csv(tmp_path / "a.csv", needed=range(0, 60, 3))
    b = _csv(tmp_path / "b.csv", needed=range(1, 60, 3))
    # a usage error, exit 2 as argparse's own (it exited 1 after parsing), naming the option
    with pytest.raises(SystemExit) as rc:
        main(["router", "train", "--data", str(a), "--weight", weight, "--data", str(b), "--weight", "1",
              "--out", str(tmp_path / "r"), "--no-embedding"])
    err = capsys.readouterr().err
    assert rc.value.code == 2 and "--weight" in err and "finite" in err and "sample_weight" not in err
    parts = [(n, RoutingData([f"{n}{i}" for i in range(3)], np.zeros(3), np.ones(3), "w", "s")) for n in "ab"]
    with pytest.raises(DataError, match="finite"):
        pool(parts, [float("inf"), 1.0])
