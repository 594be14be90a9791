"""Out-of-range numbers given to `hybridllm router ...` are usage errors: exit 2, naming the option."""

from __future__ import annotations

import pytest

from hybridllm.cli import main

LABEL = ["router", "label", "--data", "q.jsonl", "--edge", "missing.gguf", "--cloud", "http://127.0.0.1:1"]
TRAIN = ["router", "train", "--data", "missing.csv", "--out", "r", "--no-embedding"]
CALIBRATE = ["router", "calibrate", "--prompts", "missing.txt", "--out", "r"]


@pytest.mark.parametrize(
    ("argv", "option", "value"),
    [
        (LABEL, "--concurrency", "-1"),
        (LABEL, "--concurrency", "0"),
        (LABEL, "--max-tokens", "0"),
        (LABEL, "--limit", "-5"),
        (LABEL, "--timeout", "-1"),
        (LABEL, "--timeout", "inf"),  # passed "positive"; each cloud call then died in an OverflowError
        (TRAIN, "--mix", "1.5"),
        (TRAIN, "--topic-mix", "nan"),
        (TRAIN, "--k", "0"),
        (TRAIN, "--c", "0"),
        (TRAIN, "--topics", "-1"),
        (TRAIN, "--folds", "1"),
        (TRAIN, "--weight", "0"),
        (TRAIN, "--weight", "1e400"),
        (CALIBRATE, "--cloud-fraction", "-0.1"),
        (CALIBRATE, "--cloud-fraction", "1.5"),
    ],
)
def test_out_of_range_numbers_are_usage_errors(tmp_path, monkeypatch, capsys, argv, option, value):
    """They exited 1, as a failure of the run would (--folds 1 only once the data was read; --timeout
    inf not at all), where argparse's own errors (a missing or non-numeric value) exit 2."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main([*argv, option, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hybridllm router {argv[1]}: error: argument {option}: expected ")
    assert repr(value) in err and err.count("\n") == 1


def test_in_range_values_still_parse():
    from hybridllm.cli import build_parser

    args = build_parser().parse_args([*TRAIN, "--mix", "0", "--topic-mix", "1", "--k", "1", "--c", "1e-4",
                                      "--topics", "0", "--folds", "2", "--weight", "0.5"])
    assert (args.mix, args.topic_mix, args.k, args.c, args.topics, args.folds) == (0.0, 1.0, 1, 1e-4, 0, 2)
    assert args.weight == [0.5]
    args = build_parser().parse_args([*LABEL, "--concurrency", "1", "--timeout", "0.5", "--limit", "1"])
    assert (args.concurrency, args.timeout, args.limit, args.max_tokens) == (1, 0.5, 1, 256)


@pytest.mark.parametrize("value", ["1,inf", "-inf,10", "-inf,inf"])
def test_an_infinite_score_range_is_refused(tmp_path, monkeypatch, capsys, value):
    """--score-range 1,inf passed "LO below HI" and mapped every mark to (s - 1) / inf = 0: a graded
    file trained on all-zero scores without a word."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main([*TRAIN, f"--score-range={value}"])  # "=": a value starting with "-" is taken for an option
    assert exc.value.code == 2
    assert "argument --score-range: LO and HI must be finite" in capsys.readouterr().err
