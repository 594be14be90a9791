"""`hybridllm router ...` with a path option given blank (an unset shell variable: `--out "$DIR"`)
or a --cloud without its scheme: a usage error (exit 2) naming the option, before anything is read
or written. Before, Path("") was the current folder: `train --out ""` wrote router.json and
weights.npz there (replacing a router already in it), `calibrate --out ""` rewrote the --router
folder in place, `eval --plot ""` and `label --answers ""` were dropped without a word, and
`label --cloud localhost:8731` wrote the --out file and its settings before the first request
failed on the missing scheme."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from hybridllm.cli import main


@pytest.fixture
def pairs_csv(tmp_path):
    # long prompts need the strong model more often: learnable from text features alone
    rng = np.random.default_rng(0)
    path = tmp_path / "pairs.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["prompt", "small", "big"])
        for i in range(200):
            n = int(rng.integers(1, 60))
            weak = rng.random() > (0.7 if n > 30 else 0.1)
            w.writerow([f"q{i} " + "word " * n, weak, rng.random() > 0.1])
    return path


def _usage_error(argv, capsys, option):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}:" in err and "Traceback" not in err


def test_train_out_blank_writes_nothing_into_the_current_folder(pairs_csv, tmp_path, monkeypatch, capsys):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    _usage_error(["router", "train", "--data", str(pairs_csv), "--out", "", "--no-embedding"],
                 capsys, "--out")
    assert list(cwd.iterdir()) == []


def test_calibrate_out_blank_leaves_the_router_as_it_was(pairs_csv, tmp_path, capsys):
    router = tmp_path / "r"
    assert main(["router", "train", "--data", str(pairs_csv), "--out", str(router), "--no-embedding",
                 "--folds", "2"]) == 0
    capsys.readouterr()
    before = (router / "router.json").read_bytes()
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\nword word word word word word word word\n")
    for out in ("", "  "):
        _usage_error(["router", "calibrate", "--prompts", str(prompts), "--cloud-fraction", "1",
                      "--router", str(router), "--out", out], capsys, "--out")
        assert (router / "router.json").read_bytes() == before
    # the option given whole still works, into its own folder
    assert main(["router", "calibrate", "--prompts", str(prompts), "--cloud-fraction", "1",
                 "--router", str(router), "--out", str(tmp_path / "c")]) == 0
    assert json.loads(capsys.readouterr().out)["threshold"] == 0.0
    assert (router / "router.json").read_bytes() == before


@pytest.mark.parametrize("option", ["--router", "--plot", "--data"])
def test_eval_blank_path(option, pairs_csv, capsys):
    argv = {"--data": str(pairs_csv), "--router": None, "--plot": None}
    argv[option] = ""
    args = ["router", "eval", "--json"]
    for name, value in argv.items():
        if value is not None:
            args += [name, value]
    _usage_error(args, capsys, option)


@pytest.mark.parametrize("option, value", [
    ("--answers", ""), ("--out", ""), ("--edge", " "), ("--data", ""),
    ("--cloud", ""), ("--cloud", "localhost:8731"), ("--cloud", "127.0.0.1:8731/v1"), ("--cloud", "ftp://x"),
])
def test_label_blank_or_schemeless(option, value, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question": "What is 2+2?", "answer": "4"}\n')
    argv = {"--data": str(questions), "--edge": str(tmp_path / "edge.gguf"),
            "--cloud": "http://127.0.0.1:1", "--out": str(tmp_path / "labels.csv"),
            "--answers": str(tmp_path / "answers.jsonl")}
    argv[option] = value
    _usage_error(["router", "label", *[x for kv in argv.items() for x in kv]], capsys, option)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.jsonl"]


@pytest.mark.parametrize("url", ["http://127.0.0.1:1", "https://cloud.example/v1", "HTTP://[::1]:8000"])
def test_label_cloud_urls_still_taken(url):
    from hybridllm.cli import build_parser

    args = build_parser().parse_args(["router", "label", "--data", "q.jsonl", "--edge", "e",
                                      "--cloud", url])
    assert args.cloud == url
