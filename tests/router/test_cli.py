"""`hybridllm router ...` end to end on small files (text-only training, no embedder needed)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from hybridllm.cli import main


@pytest.fixture
def small_csv(tmp_path):
    # long prompts need the strong model more often: learnable from text features alone
    rng = np.random.default_rng(0)
    path = tmp_path / "pairs.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["prompt", "small", "big"])
        for i in range(400):
            n = int(rng.integers(1, 60))
            hard = n > 30
            weak = rng.random() > (0.7 if hard else 0.1)
            strong = rng.random() > 0.1
            w.writerow([f"q{i} " + "word " * n, weak, strong])
    return path


def test_train_eval_calibrate(small_csv, tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["router", "train", "--data", str(small_csv), "--out", str(out),
                 "--no-embedding"]) == 0
    trained = json.loads(capsys.readouterr().out)
    assert trained["cv"]["apgr"] > 0.6 and (out / "weights.npz").is_file()

    plot = tmp_path / "curve.png"
    assert main(["router", "eval", "--data", str(small_csv), "--router", str(out), "--json",
                 "--plot", str(plot)]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert {"apgr", "cpt50", "cpt80", "calls_at_95", "n"} <= set(ev) and ev["n"] == 400
    assert set(ev["baselines"]) == {"random", "length"}
    assert plot.stat().st_size > 1000
    # at the router's own threshold: the share sent to the strong model and the mix's quality
    from hybridllm.router.dataset import load_routellm_csv
    from hybridllm.router.router import load_router

    router, data = load_router(out), load_routellm_csv(small_csv)
    cloud = router.score_texts(data.prompts) >= router.threshold
    mixed = np.where(cloud, data.strong, data.weak).mean()
    at = ev["at_threshold"]
    assert at["threshold"] == pytest.approx(router.threshold, abs=1e-6)
    assert at["cloud_fraction"] == pytest.approx(cloud.mean(), abs=1e-4) and 0 < at["cloud_fraction"] < 1
    assert at["quality"] == pytest.approx(mixed, abs=1e-4)
    assert at["quality_over_strong"] == pytest.approx(mixed / data.strong.mean(), abs=1e-4)
    assert main(["router", "eval", "--data", str(small_csv), "--router", str(out)]) == 0
    assert "to the strong model, quality" in capsys.readouterr().out

    prompts = tmp_path / "traffic.txt"
    prompts.write_text("\n".join("hello " * (i % 50 + 1) + str(i) for i in range(400)))
    assert main(["router", "calibrate", "--prompts", str(prompts), "--cloud-fraction", "0.3",
                 "--router", str(out)]) == 0
    cal = json.loads(capsys.readouterr().out)
    assert cal["realized_cloud_fraction"] == pytest.approx(0.3, abs=0.02)
    # the calibrated threshold is the one saved: the router read back sends ~30% of that traffic
    calibrated = load_router(out)
    assert calibrated.threshold == pytest.approx(cal["threshold"], abs=1e-6)
    traffic = prompts.read_text().splitlines()
    sent = float(np.mean(calibrated.score_texts(traffic) >= calibrated.threshold))
    assert sent == pytest.approx(0.3, abs=0.02)


def test_errors_are_one_line(tmp_path, capsys):
    empty = tmp_path / "e.csv"
    empty.write_text("")
    assert main(["router", "train", "--data", str(empty), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and "empty" in err and err.count("\n") == 1
    assert main(["router", "eval", "--data", str(empty), "--router", str(tmp_path / "none"),
                 "--json"]) == 1
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.real
def test_train_with_embeddings_and_score(small_csv, tmp_path, capsys):
    out = tmp_path / "emb"
    assert main(["router", "train", "--data", str(small_csv), "--out", str(out), "--k", "20"]) == 0
    capsys.readouterr()
    from hybridllm.router import load_router

    router = load_router(out)
    assert router.use_embedding and router.scorer.uses_neighbors
    short, long = router.score("q1 word"), router.score("q2 " + "word " * 55)
    assert 0.0 <= short < long <= 1.0


def test_calibrate_in_place_through_router_json(tmp_path, capsys):
    """`--router DIR/router.json` loads (load_router takes the file), so it also saves there,
    into DIR, instead of failing after embedding every prompt; a --cloud-fraction out of [0, 1]
    is refused before anything is loaded or embedded."""
    from hybridllm.router.router import load_router

    from .fakes import length_router

    length_router(0.5).save(tmp_path / "r")
    prompts = tmp_path / "traffic.txt"
    prompts.write_text("\n".join("hello " * (i % 50 + 1) for i in range(100)))
    assert main(["router", "calibrate", "--prompts", str(prompts), "--cloud-fraction", "0.2",
                 "--router", str(tmp_path / "r" / "router.json")]) == 0
    cal = json.loads(capsys.readouterr().out)
    assert cal["out"] == str(tmp_path / "r")
    assert load_router(tmp_path / "r").threshold == pytest.approx(cal["threshold"], abs=1e-6) != 0.5
    # a usage error, exit 2 as argparse's own (it exited 1 after parsing), naming the option
    with pytest.raises(SystemExit) as exc:
        main(["router", "calibrate", "--prompts", str(prompts), "--cloud-fraction", "30",
              "--router", str(tmp_path / "nowhere")])
    assert exc.value.code == 2
    assert "--cloud-fraction: expected a number from 0 to 1" in capsys.readouterr().err


def test_bad_column_and_out_options_are_refused_first(small_csv, tmp_path, capsys):
    """An --out that is a file is refused before training or embedding (it failed at the save,
    after all the work); one column named as both models is refused as such, not reported as data
    in which no prompt needs the strong model."""
    afile = tmp_path / "afile"
    afile.write_text("")
    missing = str(tmp_path / "missing.csv")
    assert main(["router", "train", "--data", missing, "--out", str(afile), "--no-embedding"]) == 1
    assert "--out" in capsys.readouterr().err
    assert main(["router", "calibrate", "--prompts", missing, "--cloud-fraction", "0.3",
                 "--router", str(tmp_path / "nowhere"), "--out", str(afile)]) == 1
    assert "--out" in capsys.readouterr().err
    assert main(["router", "train", "--data", str(small_csv), "--weak-col", "big", "--strong-col", "big",
                 "--out", str(tmp_path / "r"), "--no-embedding"]) == 1
    err = capsys.readouterr().err
    assert "both name 'big'" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("option", "value"), [("--limit", "0"), ("--edge-max-tokens", "0"), ("--timeout", "0")]
)
def test_label_options_out_of_range(tmp_path, capsys, option, value):
    """Refused before any model loads: `--limit 0` labelled nothing and exited 1 with a JSON
    n of 0, `--edge-max-tokens 0` silently used --max-tokens, `--timeout 0` failed every call."""
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question": "2 + 2?", "answer": "4"}\n')
    edge = tmp_path / "missing.gguf"  # never reached: loading it would be an EdgeError
    # a usage error, exit 2 as argparse's own (it exited 1 after parsing), naming the option
    with pytest.raises(SystemExit) as exc:
        main(["router", "label", "--data", str(questions), "--edge", str(edge), "--cloud",
              "http://127.0.0.1:1", "--out", str(tmp_path / "l.csv"), option, value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("hybridllm router label: error: ") and option in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("edge", "column"),
    [
        ("qwen2.5-coder-0.5b-instruct", "edge:qwen2.5-coder-0.5b-instruct"),  # was edge:qwen2.5-coder-0
        ("smollm2-135m-instruct", "edge:smollm2-135m-instruct"),
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "edge:SmolLM2-135M-Instruct.Q4_1"),
    ],
)
def test_label_names_the_edge_column_after_the_model(tmp_path, monkeypatch, capsys, edge, column):
    import hybridllm.models
    from hybridllm.router import label as label_mod

    monkeypatch.setattr(hybridllm.models, "pull", lambda model_id: tmp_path / "model.gguf")
    monkeypatch.setattr(label_mod, "llama_cpp_edge", lambda path, **kw: lambda p: ("The answer is 4", -0.1))
    monkeypatch.setattr(label_mod, "openai_cloud", lambda url, **kw: lambda p: ("The answer is 4", None))
    if edge.endswith(".gguf"):  # a GGUF path names a file that is there (a missing one is refused)
        monkeypatch.chdir(tmp_path)
        (tmp_path / edge).write_bytes(b"GGUF")
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question": "2 + 2?", "answer": "4"}\n')
    out = tmp_path / "l.csv"
    assert main(["router", "label", "--data", str(questions), "--edge", edge, "--cloud",
                 "http://127.0.0.1:1", "--cloud-model", "big-1.5b", "--out", str(out)]) == 0
    assert out.read_text().splitlines()[0].split(",")[1:3] == [column, "cloud:big-1.5b"]
    assert f"--weak-col '{column}'" in json.loads(capsys.readouterr().out)["train_with"]
