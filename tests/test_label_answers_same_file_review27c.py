"""`hybridllm router label --answers` naming the --out CSV, its settings file or the questions'
--data file: refused on one line before any model loads, nothing written. Before, the answers'
JSON lines were appended to that file, exit 0: into the labels CSV (which then held JSON between
its rows), or into the questions file, each answer line a new question (it has a prompt and a
reference), so the next run labelled the answers as questions."""

from __future__ import annotations

import os

import pytest

from hybridllm import DataError
from hybridllm.cli import main
from hybridllm.router.label import Answer, Question, label_to_csv


def _argv(tmp_path, answers):
    return ["router", "label", "--data", str(tmp_path / "q.jsonl"), "--edge",
            str(tmp_path / "missing-edge.gguf"), "--cloud", "http://127.0.0.1:1",
            "--out", str(tmp_path / "labels.csv"), "--answers", answers]


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "q.jsonl").write_text('{"question": "What is 2+2?", "answer": "4"}\n')
    (tmp_path / "labels.csv").write_text(
        "prompt,edge:e,cloud:default,edge_mean_logprob,cloud_tokens\nWhat is 1+1?,True,True,-0.1,3\n")
    return tmp_path


@pytest.mark.parametrize("answers, what", [
    ("q.jsonl", "the --data file"),
    ("labels.csv", "the --out file"),
    ("./sub/../labels.csv", "the --out file"),
    ("labels.csv.settings.json", "the settings file of --out"),
    ("link.csv", "the --out file"),
])
def test_answers_into_another_file_of_the_run_is_refused(answers, what, files, capsys):
    (files / "sub").mkdir()
    os.symlink(files / "labels.csv", files / "link.csv")
    before = {p.name: p.read_bytes() for p in files.iterdir() if p.is_file()}
    assert main(_argv(files, answers)) == 1
    err = capsys.readouterr().err
    assert f"--answers {answers} is {what};" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in files.iterdir() if p.is_file()} == before


def test_library_call_refuses_answers_into_the_labels(tmp_path):
    def gen(_prompt):
        return Answer("The answer is 4", num_tokens=5)

    out = tmp_path / "l.csv"
    with pytest.raises(DataError, match="is the --out file"):
        label_to_csv([Question("What is 2+2?", "4")], gen, gen, out, edge_col="e", cloud_col="c",
                     answers_out=out)
    assert not out.exists()
    label_to_csv([Question("What is 2+2?", "4")], gen, gen, out, edge_col="e", cloud_col="c",
                 answers_out=tmp_path / "a.jsonl")
    assert out.read_text().count("\n") == 2 and (tmp_path / "a.jsonl").read_text().count("\n") == 1


def test_a_separate_answers_file_still_works(files):
    from hybridllm.router._label_files import check_out_paths

    check_out_paths(files / "labels.csv", files / "answers.jsonl", data=files / "q.jsonl")
