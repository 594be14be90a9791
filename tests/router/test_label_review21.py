"""`router label`: a bad --out, --answers or --edge is said on one line before the edge model is
pulled or loaded, and the printed `train_with` command survives a shell."""

from __future__ import annotations

import json
import shlex

import pytest

from hybridllm.cli import main


@pytest.fixture
def fake_models(tmp_path, monkeypatch):
    """Fake edge and cloud; ``loaded`` counts the edge models loaded (none, when a check refuses)."""
    import hybridllm.models
    from hybridllm.router import label as label_mod

    loaded: list[str] = []

    def edge(path, **kw):
        loaded.append(str(path))
        return lambda p: ("The answer is 4", -0.1)

    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setattr(hybridllm.models, "pull", lambda model_id: model)
    monkeypatch.setattr(label_mod, "llama_cpp_edge", edge)
    monkeypatch.setattr(label_mod, "openai_cloud", lambda url, **kw: lambda p: ("The answer is 4", None))
    return model, loaded


def _label(tmp_path, *extra, edge=None):
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question": "2 + 2?", "answer": "4"}\n{"question": "3 + 1?", "answer": "4"}\n')
    return main(["router", "label", "--data", str(questions), "--edge", edge or str(tmp_path / "model.gguf"),
                 "--cloud", "http://127.0.0.1:1", *extra])


def test_answers_folder_is_one_line_error_before_loading(tmp_path, fake_models, capsys):
    _, loaded = fake_models
    (tmp_path / "answers").mkdir()
    assert _label(tmp_path, "--out", str(tmp_path / "l.csv"), "--answers", str(tmp_path / "answers")) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "is a folder" in err and "--answers" in err
    assert "internal error" not in err and err.count("\n") == 1
    assert loaded == [] and not (tmp_path / "l.csv").exists()


@pytest.mark.parametrize("flag", ["--out", "--answers"])
def test_path_under_a_file_is_one_line_error_before_loading(tmp_path, fake_models, capsys, flag):
    _, loaded = fake_models
    (tmp_path / "notes").write_text("x")
    paths = {"--out": str(tmp_path / "l.csv"), "--answers": str(tmp_path / "a.jsonl")}
    paths[flag] = str(tmp_path / "notes" / "f")
    assert _label(tmp_path, "--out", paths["--out"], "--answers", paths["--answers"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag} ") and "is a file, not a folder" in err
    assert "internal error" not in err and loaded == []


def test_out_of_other_models_refused_before_loading(tmp_path, fake_models, capsys):
    _, loaded = fake_models
    out = tmp_path / "l.csv"
    out.write_text("prompt,edge:other,cloud:default,edge_mean_logprob,cloud_tokens\nq,True,True,,\n")
    assert _label(tmp_path, "--out", str(out)) == 1
    assert "labels for other models" in capsys.readouterr().err and loaded == []


def test_out_with_other_settings_refused_before_loading(tmp_path, fake_models, capsys):
    _, loaded = fake_models
    out = tmp_path / "l.csv"
    assert _label(tmp_path, "--out", str(out), "--limit", "1") == 0
    capsys.readouterr()
    assert loaded == [str(tmp_path / "model.gguf")]
    assert _label(tmp_path, "--out", str(out), "--max-tokens", "64") == 1
    assert "other settings" in capsys.readouterr().err
    assert len(loaded) == 1  # not loaded again for a run that is refused


def test_missing_gguf_path_is_said_missing(tmp_path, fake_models, capsys):
    _, loaded = fake_models
    missing = tmp_path / "models" / "smollm.gguf"
    assert _label(tmp_path, "--out", str(tmp_path / "l.csv"), edge=str(missing)) == 1
    err = capsys.readouterr().err
    assert f"--edge {missing} does not exist" in err and "Unknown model" not in err and loaded == []


def test_train_with_survives_a_shell(tmp_path, fake_models, capsys):
    out = tmp_path / "my labels" / "it's.csv"
    assert _label(tmp_path, "--out", str(out), "--cloud-model", "o'brien") == 0
    cmd = shlex.split(json.loads(capsys.readouterr().out)["train_with"])
    assert cmd[cmd.index("--data") + 1] == str(out)
    assert cmd[cmd.index("--weak-col") + 1] == "edge:model"
    assert cmd[cmd.index("--strong-col") + 1] == "cloud:o'brien"


def test_library_refuses_answers_folder(tmp_path):
    from hybridllm._exceptions import DataError
    from hybridllm.router.label import Question, label_to_csv

    (tmp_path / "a").mkdir()
    with pytest.raises(DataError, match="is a folder"):
        label_to_csv([Question("2 + 2?", "4")], lambda p: ("4", None), lambda p: ("4", None),
                     tmp_path / "l.csv", edge_col="e", cloud_col="c", answers_out=tmp_path / "a")
