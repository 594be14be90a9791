"""The cache's command-line numbers go through hybridllm._cli_options, as both servers' do: an
infinite learning rate or epoch count is refused before any work, as NaN and 0 already were."""

from __future__ import annotations

import pytest

from hybridllm import cli
from hybridllm.cache import train_reranker as tr


@pytest.mark.parametrize("option, value", [
    ("--epochs", "inf"),  # was accepted: an OverflowError once training began (int(inf))
    ("--lr", "inf"),  # was accepted: AdamW steps with it leave the weights non-finite
    ("--lr", "Infinity"),
    ("--epochs", "0"),
    ("--lr", "nan"),
    ("--lr", "fast"),
])
def test_train_reranker_refuses_a_number_that_is_not_finite_and_positive(tmp_path, capsys, option, value):
    with pytest.raises(SystemExit) as exc:
        tr.main(["--data", str(tmp_path / "none.jsonl"), option, value])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert f"argument {option}: expected a positive, finite number, got {value!r}" in err


@pytest.mark.parametrize("argv", [["--batch-size", "0"], ["--threads", "x"]])
def test_train_reranker_refuses_a_count_below_one(tmp_path, capsys, argv):
    with pytest.raises(SystemExit) as exc:
        tr.main(["--data", str(tmp_path / "none.jsonl"), *argv])
    assert exc.value.code == 2
    assert f"argument {argv[0]}: expected a positive integer, got {argv[1]!r}" in capsys.readouterr().err


@pytest.mark.parametrize("limit", ["0", "many"])
def test_cache_eval_names_what_limit_takes(capsys, limit):
    # was "invalid positive_int value: 'many'", the name of a Python function
    with pytest.raises(SystemExit) as exc:
        cli.main(["cache", "eval", "--pairs", "pairs.jsonl", "--limit", limit])
    assert exc.value.code == 2
    assert f"argument --limit: expected a positive integer, got {limit!r}" in capsys.readouterr().err
