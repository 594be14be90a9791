"""`hybridllm router eval --plot data.csv/curve.png`: a --plot path under a file is refused before
the router loads or any prompt is embedded, saying which part is a file. Before, it was found only
after the whole evaluation, as "cannot write the plot (File exists)"."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from hybridllm.cli import main
from hybridllm.router import _cli_eval


@pytest.fixture
def pairs_csv(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "pairs.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["prompt", "small", "big"])
        for i in range(200):
            n = int(rng.integers(1, 60))
            w.writerow([f"q{i} " + "word " * n, rng.random() > (0.7 if n > 30 else 0.1), rng.random() > 0.1])
    return path


@pytest.mark.parametrize("plot", ["pairs.csv/curve.png", "pairs.csv/deeper/curve", "pairs.csv/"])
def test_plot_under_a_file_refused_before_the_work(plot, pairs_csv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)

    def no_router(*_a, **_k):
        raise AssertionError("the router was loaded before --plot was checked")

    monkeypatch.setattr("hybridllm.router.router.load_router", no_router)
    assert main(["router", "eval", "--data", str(pairs_csv), "--plot", plot, "--json"]) == 1
    captured = capsys.readouterr()
    assert f"--plot {plot}: pairs.csv is a file, not a folder" in captured.err
    assert captured.out == ""


def test_plot_in_a_new_folder_still_written(pairs_csv, tmp_path, capsys):
    router = tmp_path / "r"
    assert main(["router", "train", "--data", str(pairs_csv), "--out", str(router), "--no-embedding",
                 "--folds", "2"]) == 0
    capsys.readouterr()
    pytest.importorskip("matplotlib")
    out = tmp_path / "new" / "deep" / "curve"
    result = _cli_eval.evaluate_router_on(str(pairs_csv), str(router), plot=str(out))
    assert result["plot"] == str(out) + ".png" and (tmp_path / "new" / "deep" / "curve.png").is_file()
