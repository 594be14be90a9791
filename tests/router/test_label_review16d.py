"""`router label` resuming and stopping: the settings file of a file that had none, the rows whose
answers were in flight at Ctrl-C, and one --answers line per question."""

from __future__ import annotations

import json
import threading

import pytest

from hybridllm import DataError
from hybridllm.router import label as label_mod
from hybridllm.router.dataset import load_routellm_csv
from hybridllm.router.label import Answer, Question


def _questions(n):
    return [Question(f"What is {i} + {i}?", str(2 * i)) for i in range(n)]


def _right(prompt):
    return Answer(f"The answer is {2 * int(prompt.split()[2])}", mean_logprob=-0.5, num_tokens=4)


def test_a_file_without_settings_gets_them_on_resume_and_later_resumes_are_checked(tmp_path):
    """A file with rows but no OUT.settings.json (an older version's, or the file deleted) was
    resumed unchecked, and no settings file was ever written: every later resume with other
    settings went unchecked too."""
    out = tmp_path / "l.csv"
    label_mod.label_to_csv(_questions(2), _right, _right, out, edge_col="e", cloud_col="c")
    side = label_mod.settings_path(out)
    assert not side.exists()
    first = {"cloud_model": "default", "max_tokens": 64}
    run = label_mod.label_to_csv(_questions(3), _right, _right, out, edge_col="e", cloud_col="c",
                                 settings=first)
    assert (run.num_skipped, run.num_added) == (2, 1)
    assert json.loads(side.read_text(encoding="utf-8")) == first
    with pytest.raises(DataError, match=r"max_tokens 64 then, 256 now"):
        label_mod.label_to_csv(_questions(5), _right, _right, out, edge_col="e", cloud_col="c",
                               settings={**first, "max_tokens": 256})
    assert out.read_text(encoding="utf-8").count("\n") == 4  # nothing appended
    with pytest.raises(DataError, match="other models"):  # the columns are still checked first
        label_mod.label_to_csv(_questions(5), _right, _right, tmp_path / "l.csv", edge_col="x",
                               cloud_col="c", settings=first)


class _Progress:
    """Raises Ctrl-C at the first progress line (a row just written), opens ``gate`` when the run
    says it is stopping, and keeps what it was told."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate, self.text, self.raised = gate, "", False

    def write(self, text: str) -> None:
        self.text += text
        if text.startswith("labelled") and not self.raised:
            self.raised = True
            raise KeyboardInterrupt
        if text.startswith("stopping"):
            self.gate.set()

    def flush(self) -> None:
        pass


def test_ctrl_c_keeps_the_rows_whose_answers_were_in_flight(tmp_path):
    """Question 0 is written, then Ctrl-C comes while both answers of question 1 are still being
    made: the run waited for them, then threw them away. Now its row is written (once; question 0
    is not written again), question 2, whose edge answer was never asked, is not."""
    gate, asking_1 = threading.Event(), threading.Event()

    def edge(prompt):
        if "1 + 1" in prompt:
            asking_1.set()
            assert gate.wait(5)
        return _right(prompt)

    def cloud(prompt):
        if "0 + 0" in prompt:  # question 0's row comes once question 1 is being answered
            assert asking_1.wait(5)
        else:
            assert gate.wait(5)
        return _right(prompt)

    out, answers = tmp_path / "l.csv", tmp_path / "a.jsonl"
    progress = _Progress(gate)
    with pytest.raises(KeyboardInterrupt):
        label_mod.label_to_csv(_questions(3), edge, cloud, out, edge_col="e", cloud_col="c",
                               concurrency=3, answers_out=answers, progress=progress)
    data = load_routellm_csv(out, weak_col="e", strong_col="c")
    assert data.prompts == ["What is 0 + 0?", "What is 1 + 1?"]
    assert data.weak.tolist() == [1.0, 1.0]
    assert "kept 1 more rows" in progress.text
    assert [json.loads(x)["prompt"] for x in answers.read_text().splitlines()] == data.prompts
    run = label_mod.label_to_csv(_questions(3), _right, _right, out, edge_col="e", cloud_col="c")
    assert (run.num_skipped, run.num_added, run.num_rows) == (2, 1, 3)


def test_a_row_labelled_again_keeps_one_answers_line_the_latest(tmp_path):
    """The CSV's last row cut off (a killed run) is labelled again: its --answers line was written
    a second time, so the file held two answers for one question."""
    out, answers = tmp_path / "l.csv", tmp_path / "a.jsonl"
    label_mod.label_to_csv(_questions(3), _right, _right, out, edge_col="e", cloud_col="c",
                           answers_out=answers)
    data = out.read_bytes()
    last = data.splitlines()[-1].split(b",")[0].decode()  # rows are written as they complete
    out.write_bytes(data[: data.rindex(last.encode()) + 9])  # the last row cut off mid-prompt

    def cloud(prompt):
        return Answer("The answer is 4, again", num_tokens=5)

    run = label_mod.label_to_csv(_questions(3), _right, cloud, out, edge_col="e", cloud_col="c",
                                 answers_out=answers)
    assert (run.num_skipped, run.num_added) == (2, 1)
    lines = [json.loads(x) for x in answers.read_text(encoding="utf-8").splitlines()]
    assert sorted(a["prompt"] for a in lines) == [q.prompt for q in _questions(3)]
    assert lines[-1]["prompt"] == last
    assert lines[-1]["cloud"] == "The answer is 4, again" and lines[-1]["cloud_tokens"] == 5


def test_duplicate_answers_lines_left_by_an_earlier_run_are_cleared(tmp_path):
    out, answers = tmp_path / "l.csv", tmp_path / "a.jsonl"
    label_mod.label_to_csv(_questions(2), _right, _right, out, edge_col="e", cloud_col="c",
                           answers_out=answers)
    old = answers.read_text(encoding="utf-8").splitlines()
    newer = json.dumps({**json.loads(old[0]), "cloud": "newer"})
    answers.write_text("\n".join([*old, "not json", newer]) + "\n", encoding="utf-8")
    label_mod.label_to_csv(_questions(3), _right, _right, out, edge_col="e", cloud_col="c",
                           answers_out=answers)
    lines = answers.read_text(encoding="utf-8").splitlines()
    assert lines[:3] == [old[1], "not json", newer]  # the latest kept, a line it cannot read too
    assert [json.loads(x)["prompt"] for x in lines[3:]] == ["What is 2 + 2?"]
