"""`router train --cascade-data`: the cascade file is read with the options the --data files are.
It was read with none of them, so a file of a judge's 1-10 marks was refused for want of the
--score-range the command gave, and a file with several model columns for want of the
--weak-col/--strong-col it gave."""

from __future__ import annotations

import pytest

from hybridllm.router import train as train_mod


def _marks(path, n=60, *, extra=False):
    """A judge's 1-10 marks of an edge and a cloud model, with the edge answers' log-probabilities."""
    head = "prompt,edge,cloud" + (",judge" if extra else "") + ",edge_mean_logprob"
    rows = [head]
    for i in range(n):
        weak = 8 if i % 3 else 2
        cells = [f"question {i} about {'x' * (i % 7)}", str(weak), "9"]
        cells += ["5"] if extra else []
        cells += ["-0.2" if weak == 8 else "-2.0"]
        rows.append(",".join(cells))
    path.write_text("\n".join(rows) + "\n")
    return path


def test_a_cascade_file_on_the_score_range_given_calibrates(tmp_path):
    data = _marks(tmp_path / "a.csv")
    cascade = _marks(tmp_path / "c.csv", 20)
    router = train_mod.train_from_csv(
        data, tmp_path / "r", use_embedding=False, score_range=(1, 10), cascade_paths=[cascade]
    )
    assert router.info["training"]["cascade"]["n"] == 80  # both files' edge answers
    assert -2.0 < router.logprob_threshold <= -0.2


def test_a_cascade_file_with_the_columns_named_calibrates(tmp_path):
    data = _marks(tmp_path / "a.csv", extra=True)
    cascade = _marks(tmp_path / "c.csv", 20, extra=True)
    router = train_mod.train_from_csv(
        data,
        tmp_path / "r",
        use_embedding=False,
        score_range=(1, 10),
        weak_col="edge",
        strong_col="cloud",
        cascade_paths=[cascade],
    )
    assert router.info["training"]["cascade"]["n"] == 80


@pytest.mark.parametrize("prompt_col", ["query"])
def test_a_cascade_file_read_with_the_prompt_col_given(tmp_path, prompt_col):
    data = tmp_path / "a.csv"
    cascade = tmp_path / "c.csv"
    for path, n in ((data, 60), (cascade, 20)):
        rows = [f"{prompt_col},text,weak,strong,edge_mean_logprob"]
        rows += [
            f"q {i} {'y' * (i % 5)},note,{i % 2 == 0},True,{-0.2 if i % 2 == 0 else -2.0}" for i in range(n)
        ]
        path.write_text("\n".join(rows) + "\n")
    router = train_mod.train_from_csv(
        data, tmp_path / "r", use_embedding=False, prompt_col=prompt_col, cascade_paths=[cascade]
    )
    assert router.info["training"]["cascade"]["n"] == 80
