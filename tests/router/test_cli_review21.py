"""`hybridllm router eval --plot` says where the plot went (a folder gets a file inside), `router
train --out` over a router says it replaced it, and a missing --router names the flag to pass or
leave out. Text-only routers: no embedder needed."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from hybridllm.cli import main


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A labelled file (long prompts need the strong model) and a router trained on it."""
    root = tmp_path_factory.mktemp("routercli")
    rng = np.random.default_rng(0)
    data = root / "pairs.csv"
    with data.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["prompt", "small", "big"])
        for i in range(200):
            n = int(rng.integers(1, 60))
            w.writerow([f"q{i} " + "word " * n, rng.random() > (0.7 if n > 30 else 0.1), rng.random() > 0.1])
    out = root / "r"
    assert main(["router", "train", "--data", str(data), "--out", str(out), "--no-embedding",
                 "--folds", "2"]) == 0
    return data, out


def _eval(data, router, *extra):
    return main(["router", "eval", "--data", str(data), "--router", str(router), *extra])


def test_the_text_output_names_the_plot_written(trained, tmp_path, capsys):
    """Without --json nothing said where the PNG went ("curve" is written as curve.png)."""
    pytest.importorskip("matplotlib")
    data, router = trained
    capsys.readouterr()
    assert _eval(data, router, "--plot", str(tmp_path / "curve")) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"plot: {tmp_path / 'curve.png'}"
    assert (tmp_path / "curve.png").is_file()


@pytest.mark.parametrize("given", ["plots", "fresh/"])
def test_a_folder_gets_the_plot_inside_named_after_the_data(trained, tmp_path, capsys, given):
    """--plot plots (an existing folder) wrote plots.png beside it; --plot fresh/ wrote fresh.png."""
    pytest.importorskip("matplotlib")
    data, router = trained
    (tmp_path / "plots").mkdir()
    assert _eval(data, router, "--json", "--plot", f"{tmp_path}/{given}") == 0  # the / kept
    folder = tmp_path / given.rstrip("/")
    assert json.loads(capsys.readouterr().out)["plot"] == str(folder / "pairs.png")
    assert (folder / "pairs.png").is_file() and not (tmp_path / f"{folder.name}.png").exists()


def test_training_over_a_router_says_it_replaced_it(trained, tmp_path, capsys):
    data, _ = trained
    out = tmp_path / "r"
    argv = ["router", "train", "--data", str(data), "--out", str(out), "--no-embedding", "--folds", "2"]
    assert main(argv) == 0
    assert "replaced" not in capsys.readouterr().err  # a new folder: nothing replaced
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert f"note: replaced the router that was in {out} (trained on pairs.csv)" in captured.err
    assert json.loads(captured.out)["out"] == str(out)  # stdout stays one JSON object


def test_a_damaged_router_in_out_is_still_replaced_and_said(trained, tmp_path, capsys):
    data, _ = trained
    out = tmp_path / "r"
    out.mkdir()
    (out / "router.json").write_text("{not json")
    assert main(["router", "train", "--data", str(data), "--out", str(out), "--no-embedding",
                 "--folds", "2"]) == 0
    assert "note: replaced the router that was in" in capsys.readouterr().err
    assert json.loads((out / "router.json").read_text())["format"] == "hybridllm-router"


@pytest.mark.parametrize("command", ["eval", "calibrate"])
def test_a_missing_router_names_the_flag(trained, tmp_path, capsys, command):
    """It ended "or None for the shipped router": Python's word, on a command line."""
    data, _ = trained
    missing = tmp_path / "nope"
    argv = (["router", "eval", "--data", str(data)] if command == "eval" else
            ["router", "calibrate", "--prompts", str(data), "--cloud-fraction", "0.3",
             "--out", str(tmp_path / "o")])
    assert main([*argv, "--router", str(missing)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: --router {missing} does not exist;") and err.count("\n") == 1
    assert "leave out --router for the shipped router" in err and "None" not in err


def test_load_router_message_has_no_python_none(tmp_path):
    from hybridllm._exceptions import RouterFileError
    from hybridllm.router.router import load_router

    with pytest.raises(RouterFileError) as exc:
        load_router(tmp_path / "nope")
    assert "None" not in str(exc.value) and "shipped router" in str(exc.value)
