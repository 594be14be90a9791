"""`hybridllm router label` resumed with another questions file (fake edge and cloud): refused
with a message, not appended to the first file's labels."""

from __future__ import annotations

import json

import pytest

from hybridllm import DataError
from hybridllm.cli import main
from hybridllm.router import label as label_mod


def _right(prompt):
    return f"The answer is {2 * int(prompt.split()[2])}", -0.5


def _fake_backends(monkeypatch):
    monkeypatch.setattr(label_mod, "llama_cpp_edge", lambda *a, **k: _right)
    monkeypatch.setattr(label_mod, "openai_cloud", lambda *a, **k: _right)


def _questions(path, start, n):
    path.write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"}) + "\n"
                            for i in range(start, start + n)), encoding="utf-8")
    return path


def test_another_dataset_into_the_same_out_is_refused_not_mixed(tmp_path, monkeypatch, capsys):
    """The default --out is labels.csv: labelling MMLU after GSM8K with the same models appended
    its rows to GSM8K's, one file of two sources; `router train` learns them apart, one --data each."""
    _fake_backends(monkeypatch)
    edge = tmp_path / "edge.gguf"
    edge.write_bytes(b"GGUF")
    out = tmp_path / "labels.csv"
    base = ["router", "label", "--edge", str(edge), "--cloud", "http://127.0.0.1:9", "--out", str(out)]
    first = _questions(tmp_path / "gsm8k.jsonl", 0, 3)
    assert main([*base, "--data", str(first)]) == 0
    capsys.readouterr()
    other = _questions(tmp_path / "mmlu.jsonl", 100, 2)
    assert main([*base, "--data", str(other)]) == 1
    err = capsys.readouterr().err
    assert "gsm8k.jsonl" in err and "mmlu.jsonl" in err and "Traceback" not in err
    assert out.read_text(encoding="utf-8").count("\n") == 4  # the header and the first 3 rows only
    # the same file resumes, grown by two questions
    _questions(first, 0, 5)
    assert main([*base, "--data", str(first)]) == 0
    assert json.loads(capsys.readouterr().out)["resumed_from"] == 3
    assert out.read_text(encoding="utf-8").count("\n") == 6


def test_an_out_that_is_not_a_label_csv_is_refused_as_such_and_kept(tmp_path):
    """--out naming the questions file (or any other file): refused as holding labels "for other
    models ( "answer": "#### 2"})", fragments of its first line read as model columns."""
    questions = _questions(tmp_path / "q.jsonl", 0, 2)
    before = questions.read_bytes()
    with pytest.raises(DataError, match=r"q\.jsonl is not a label CSV") as info:
        label_mod.label_to_csv(label_mod.read_questions(questions), _right, _right, questions,
                               edge_col="edge:x", cloud_col="cloud:default")
    assert "other models" not in str(info.value)
    assert questions.read_bytes() == before
