"""A labelled file with a score cell that is not a score ("maybe", "abc", "inf"): the error names
the file, the column and the row to fix, not only "not all scores" or "one model column"."""

from __future__ import annotations

import pytest

from hybridllm import DataError
from hybridllm.router.dataset import load_routellm_csv


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_a_named_column_with_a_non_score_cell_names_its_row(tmp_path):
    p = _write(tmp_path, "l.csv", "prompt,a,b\nq1,True,False\nq2,maybe,True\nq3,False,False\n")
    with pytest.raises(DataError, match=r"l\.csv is not all scores \(row 2 holds 'maybe'\)"):
        load_routellm_csv(p, weak_col="a", strong_col="b")
    blank = _write(tmp_path, "b.csv", "prompt,a,b\nq1,,False\nq2,,True\n")
    with pytest.raises(DataError, match=r"blank in every row"):
        load_routellm_csv(blank, weak_col="a", strong_col="b")


@pytest.mark.parametrize(("name", "text", "cell"), [
    ("g.csv", "prompt,a,b\nq1,0.5,0.9\nq2,abc,0.3\nq3,0.1,0.2\n", "row 2 holds 'abc'"),
    ("i.csv", "prompt,a,b\nq1,inf,0.5\nq2,0.2,0.7\nq3,0.1,0.9\n", "row 1 holds 'inf'"),
    ("j.jsonl", '{"prompt": "q1", "a": true, "b": false}\n{"prompt": "q2", "a": "x", "b": true}\n'
     '{"prompt": "q3", "a": false, "b": true}\n', "row 2 holds 'x'"),
])
def test_a_detected_column_left_out_for_one_cell_is_named_with_its_row(tmp_path, name, text, cell):
    """Found without --weak-col/--strong-col, the column was dropped without a word and the file
    refused as having "one model column (b)"; the user had no row to look at."""
    want = rf"one \w+ model column \(b\) \(column 'a' is not read as scores: {cell}"
    with pytest.raises(DataError, match=want):
        load_routellm_csv(_write(tmp_path, name, text))


def test_a_text_column_beside_one_model_column_is_not_called_a_score_column(tmp_path):
    p = _write(tmp_path, "t.csv", "prompt,topic,b\nq1,math,True\nq2,law,False\nq3,,True\n")
    with pytest.raises(DataError, match=r"one score model column \(b\);") as info:
        load_routellm_csv(p)
    assert "topic" not in str(info.value)
