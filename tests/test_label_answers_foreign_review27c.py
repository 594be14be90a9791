"""`router label --answers FILE` where FILE is already there but is no answers file (a CSV, notes):
refused on one line before any model loads, the file left as it was. Before, the answers were
appended to it with exit 0, and its last line was first cut off when it did not end in a line end
(taken for the half-written answer of a killed run). An answers file a run wrote, whole or cut off
mid-line, still resumes."""

from __future__ import annotations

import json

import pytest

from hybridllm import DataError
from hybridllm.cli import main
from hybridllm.router.label import Answer, Question, label_to_csv


def _gen(prompt):
    return Answer("The answer is 4", num_tokens=5)


@pytest.mark.parametrize("content", [
    b"prompt,weak,strong\nWhat is 1+1?,True,True\n",
    b"my notes, no line end",
    b'["a", "list"]\n',
    b'{"question": "x", "answer": "4"}\n',
])
def test_foreign_file_is_refused_and_kept(content, tmp_path):
    answers = tmp_path / "answers.txt"
    answers.write_bytes(content)
    with pytest.raises(DataError, match="is not an answers file"):
        label_to_csv([Question("What is 2+2?", "4")], _gen, _gen, tmp_path / "l.csv", edge_col="e",
                     cloud_col="c", answers_out=answers)
    assert answers.read_bytes() == content
    assert not (tmp_path / "l.csv").exists()


def test_cli_refuses_before_the_edge_is_looked_for(tmp_path, capsys):
    (tmp_path / "q.jsonl").write_text('{"question": "What is 2+2?", "answer": "4"}\n')
    notes = tmp_path / "notes.csv"
    notes.write_bytes(b"a,b\n1,2")
    assert main(["router", "label", "--data", str(tmp_path / "q.jsonl"), "--edge",
                 str(tmp_path / "missing.gguf"), "--cloud", "http://127.0.0.1:1",
                 "--out", str(tmp_path / "l.csv"), "--answers", str(notes)]) == 1
    assert "is not an answers file" in capsys.readouterr().err
    assert notes.read_bytes() == b"a,b\n1,2"


@pytest.mark.parametrize("cut", [False, True])
def test_an_answers_file_of_a_run_resumes(cut, tmp_path):
    answers = tmp_path / "a.jsonl"
    out = tmp_path / "l.csv"
    label_to_csv([Question("What is 2+2?", "4")], _gen, _gen, out, edge_col="e", cloud_col="c",
                 answers_out=answers)
    if cut:  # a run killed while writing its next answer line
        answers.write_bytes(answers.read_bytes() + b'{"prompt": "What is 3+3?", "refe')
    label_to_csv([Question("What is 2+2?", "4"), Question("What is 3+3?", "6")], _gen, _gen, out,
                 edge_col="e", cloud_col="c", answers_out=answers)
    lines = [json.loads(line) for line in answers.read_text().splitlines()]
    assert [rec["prompt"] for rec in lines] == ["What is 2+2?", "What is 3+3?"]


def test_only_a_cut_first_line_resumes(tmp_path):
    answers = tmp_path / "a.jsonl"
    answers.write_bytes(b'{"prompt": "What is 2+2?", "refer')
    label_to_csv([Question("What is 2+2?", "4")], _gen, _gen, tmp_path / "l.csv", edge_col="e",
                 cloud_col="c", answers_out=answers)
    assert [json.loads(x)["prompt"] for x in answers.read_text().splitlines()] == ["What is 2+2?"]
