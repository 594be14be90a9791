"""Review 28: `--weight` shares are relative, so shares too big to sum (two of 1e308) train as equal
shares instead of an internal error (the sum overflowed to inf and every row's weight came out 0);
shares too far apart for the smaller to count at all are refused on one line."""

from __future__ import annotations

import json

import numpy as np

from hybridllm.cli import main
from hybridllm.router.fit import fit_source_mixture
from tests.router.test_mixture import OPTS, _files


def _labels(path, seed):
    rng = np.random.default_rng(seed)
    lines = ["prompt,weak,strong"]
    for i in range(40):
        words = int(rng.integers(1, 60))
        weak = rng.random() < (0.8 if words < 30 else 0.2)
        lines.append(f"question {seed}-{i} {'word ' * words},{weak},{rng.random() < 0.9}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _train(tmp_path, out, *weights):
    a, b = _labels(tmp_path / "a.csv", 1), _labels(tmp_path / "b.csv", 2)
    args = ["router", "train", "--data", a, "--data", b, "--no-embedding", "--out", str(tmp_path / out)]
    for w in weights:
        args += ["--weight", w]
    return main(args)


def test_huge_equal_weights_train_as_equal_shares(tmp_path, capsys):
    assert _train(tmp_path, "one", "1", "1") == 0
    assert _train(tmp_path, "huge", "1e308", "1e308") == 0
    assert "internal error" not in capsys.readouterr().err
    one = json.loads((tmp_path / "one" / "router.json").read_text())
    huge = json.loads((tmp_path / "huge" / "router.json").read_text())
    assert huge["threshold"] == one["threshold"]
    assert huge["metrics"]["cv"] == one["metrics"]["cv"]


def test_weights_too_far_apart_are_a_one_line_error(tmp_path, capsys):
    assert _train(tmp_path, "r", "1e-320", "1e308") == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "too far apart" in err and err.count("\n") == 1
    assert not (tmp_path / "r").exists()


def test_mixture_gate_takes_huge_shares_as_relative():
    x, g, emb, ids = _files()
    one = fit_source_mixture(x, g, ids, emb, shares=[1.0, 1.0], **OPTS)
    huge = fit_source_mixture(x, g, ids, emb, shares=[1e308, 1e308], **OPTS)
    np.testing.assert_array_equal(huge.gate_coef, one.gate_coef)
    np.testing.assert_array_equal(huge.gate_intercept, one.gate_intercept)
