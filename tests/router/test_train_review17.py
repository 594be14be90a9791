"""`router train` on small or odd inputs: a fold whose gap is rounding only, --cascade-data files
read (and refused) before the embedding."""

from __future__ import annotations

import numpy as np
import pytest

from hybridllm._exceptions import DataError
from hybridllm.cli import main
from hybridllm.router import train as train_mod
from hybridllm.router.train import fold_ids


def _rounding_fold_csv(path):
    """60 prompts; the three of fold 0 (of 5) score weak 0.3, 0.2, 0.1 and strong 0.1, 0.2, 0.3:
    no gap, but summed in order the strong mean is one bit above the weak one."""
    names = [f"question number {i}" for i in range(400)]
    folds = fold_ids(names, 5)
    zero = [p for p, f in zip(names, folds, strict=True) if f == 0][:3]
    rest = [p for p, f in zip(names, folds, strict=True) if f != 0][:57]
    rows = ["prompt,weak,strong"]
    rows += [f"{p},{w},{s}" for p, (w, s) in zip(zero, [(0.3, 0.1), (0.2, 0.2), (0.1, 0.3)], strict=True)]
    rows += [f"{p},{float(i % 3 != 0)},1.0" for i, p in enumerate(rest)]
    path.write_text("\n".join(rows) + "\n")
    assert np.mean([0.1, 0.2, 0.3]) > np.mean([0.3, 0.2, 0.1])  # the premise
    return path


def test_a_fold_whose_gap_is_rounding_is_no_gap_not_a_failed_run(tmp_path, capsys):
    """The fold was taken as having a gap (strong mean > weak mean by 1e-17), and its figures
    failed the whole run: "The strong model (0.200) is not more accurate than the weak one
    (0.200) ... check that --weak-col and --strong-col are not swapped", exit 1."""
    data = _rounding_fold_csv(tmp_path / "g.csv")
    rc = main(["router", "train", "--data", str(data), "--out", str(tmp_path / "r"), "--no-embedding"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert (tmp_path / "r" / "router.json").is_file()
    router = train_mod.train_from_csv(data, tmp_path / "r2", use_embedding=False)
    fold0 = router.info["metrics"]["cv_per_fold"][0]
    assert fold0 == {"n": 3, "no_gap": True}


def test_a_file_whose_gap_is_rounding_is_refused_before_the_embedding(tmp_path, monkeypatch):
    """Strong mean above the weak one by one bit passed the early check, and the same "not more
    accurate" error came only after every prompt was embedded and the folds fitted."""
    monkeypatch.setattr(train_mod, "cached_embeddings", _no_embedding)
    rows = ["prompt,weak,strong", "alpha,0.3,0.1", "beta,0.2,0.2", "gamma,0.1,0.3"]
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(DataError, match="not more accurate"):
        train_mod.train_from_csv(tmp_path / "t.csv", tmp_path / "r")


def _no_embedding(*args, **kwargs):
    raise AssertionError("embedded before the --cascade-data files were read")


def _csv(path, n=60):
    rows = ["prompt,weak,strong"]
    rows += [f"question {i} about {'x' * (i % 7)},{i % 3 != 0},True" for i in range(n)]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_a_bad_cascade_file_is_refused_before_the_embedding(tmp_path, monkeypatch):
    """--cascade-data was read after the embedding (minutes for ten thousand prompts): a file
    with one score column, or a missing one, failed only then."""
    monkeypatch.setattr(train_mod, "cached_embeddings", _no_embedding)
    data = _csv(tmp_path / "a.csv")
    (tmp_path / "bad.csv").write_text("prompt,onlyone\nhi,True\n")
    with pytest.raises(DataError, match="bad.csv"):
        train_mod.train_from_csv(data, tmp_path / "r", cascade_paths=[tmp_path / "bad.csv"])
    with pytest.raises(DataError):
        train_mod.train_from_csv(data, tmp_path / "r", cascade_paths=[tmp_path / "missing.csv"])
    assert not (tmp_path / "r").exists()


def test_a_cascade_file_without_log_probabilities_is_refused(tmp_path, capsys):
    """A --cascade-data file without edge log-probabilities calibrated nothing: the router kept
    the default floor and the output said nothing of the file it was given."""
    data = _csv(tmp_path / "a.csv")
    plain = _csv(tmp_path / "plain.csv", 20)  # labels, but no edge_mean_logprob column
    rc = main(["router", "train", "--data", str(data), "--cascade-data", str(plain),
               "--out", str(tmp_path / "r"), "--no-embedding"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "plain.csv" in err and "edge_mean_logprob" in err
    assert not (tmp_path / "r").exists()


def test_a_cascade_file_with_log_probabilities_still_calibrates(tmp_path):
    data = _csv(tmp_path / "a.csv")
    rows = ["prompt,weak,strong,edge_mean_logprob"]
    rows += [f"trivia {i},{i % 2 == 0},True,{-0.2 if i % 2 == 0 else -2.0}" for i in range(20)]
    (tmp_path / "c.csv").write_text("\n".join(rows) + "\n")
    router = train_mod.train_from_csv(
        data, tmp_path / "r", use_embedding=False, cascade_paths=[tmp_path / "c.csv"]
    )
    cascade = router.info["training"]["cascade"]
    assert cascade["n"] == 20 and -2.0 < router.logprob_threshold <= -0.2
    assert router.info["training"]["cascade_data"] == ["c.csv"]


@pytest.mark.parametrize("out", ["a.csv", "a.csv/r", "a.csv/r/s"])
def test_an_out_under_a_file_is_refused_before_the_training(tmp_path, capsys, out):
    """--out data.csv/r trained every fold, then the save ended in "internal error:
    NotADirectoryError ... please report it" (exit 1, the work lost)."""
    data = _csv(tmp_path / "a.csv")
    rc = main(["router", "train", "--data", str(data), "--out", str(tmp_path / out), "--no-embedding"])
    captured = capsys.readouterr()
    assert rc == 1 and "internal error" not in captured.err and "is a file" in captured.err
    assert "training" not in captured.err  # refused before the fits' progress bar
    with pytest.raises(DataError, match="is a file"):
        train_mod.train_from_csv(data, tmp_path / out, use_embedding=False)
    assert data.read_text().startswith("prompt,weak,strong")
