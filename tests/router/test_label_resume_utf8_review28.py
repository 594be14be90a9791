"""Review 28: `router label` resumes a file whose last row was cut off inside a multi-byte character
(a run killed or the disk full mid-write): that row is labelled again, none lost or doubled. Read
strictly, the cut character made the file "not a UTF-8 CSV file" and the run refused to resume."""

from __future__ import annotations

import pytest

from hybridllm import DataError
from hybridllm.router import label as label_mod
from hybridllm.router.dataset import load_routellm_csv
from hybridllm.router.label import Answer, Question

QUESTIONS = [Question("Combien font 2 + 2 ?", "4"), Question("Que vaut 3 + 1, café compris ?", "4"),
             Question("2 + 2 等于几？", "4")]


def _right(prompt):
    return Answer("The answer is 4", mean_logprob=-0.5, num_tokens=4)


@pytest.mark.parametrize("char", ["é", "等"])
def test_a_last_row_cut_inside_a_character_is_labelled_again(tmp_path, char):
    out = tmp_path / "l.csv"
    label_mod.label_to_csv(QUESTIONS, _right, _right, out, edge_col="e", cloud_col="c", concurrency=1)
    data = out.read_bytes()
    row = next(q.prompt for q in QUESTIONS if char in q.prompt)
    start = data.index(row.encode())
    cut = data.index(char.encode(), start) + 1  # the character's first byte, not its others
    kept = data[:start]  # the rows before the cut one
    rows_before = kept.count(b"\r\n") - 1
    out.write_bytes(data[:cut])

    run = label_mod.label_to_csv(QUESTIONS, _right, _right, out, edge_col="e", cloud_col="c")
    assert (run.num_skipped, run.num_added) == (rows_before, len(QUESTIONS) - rows_before)
    assert out.read_bytes().startswith(kept)
    assert sorted(load_routellm_csv(out).prompts) == sorted(q.prompt for q in QUESTIONS)


def test_invalid_utf8_before_the_last_row_is_still_refused(tmp_path):
    out = tmp_path / "l.csv"
    label_mod.label_to_csv(QUESTIONS, _right, _right, out, edge_col="e", cloud_col="c", concurrency=1)
    data = out.read_bytes()
    first_row = data.index(b"\r\n") + 2
    out.write_bytes(data[:first_row] + b"\xff" + data[first_row:])  # damage, not a cut-off end
    with pytest.raises(DataError, match="not a UTF-8 CSV file"):
        label_mod.label_to_csv(QUESTIONS, _right, _right, out, edge_col="e", cloud_col="c")
