"""Resuming a label CSV: one saved by a spreadsheet, one damaged up the file, and the progress line."""

from __future__ import annotations

import io

import pytest

from hybridllm import DataError
from hybridllm.router import label as label_mod
from hybridllm.router.label import Answer, Question, label_to_csv

HEADER = "prompt,edge:a,cloud:b,edge_mean_logprob,cloud_tokens\r\n"


def _questions(n: int) -> list[Question]:
    return [Question(f"What is {i} + {i}?", str(2 * i)) for i in range(n)]


def _right(prompt: str) -> Answer:
    return Answer(text=f"The answer is {2 * int(prompt.split()[2])}", num_tokens=5)


def _label(out, n):
    return label_to_csv(_questions(n), _right, _right, out, edge_col="edge:a", cloud_col="cloud:b")


@pytest.mark.parametrize(("bom", "true", "false"), [("\ufeff", "TRUE", "FALSE"), ("", "TRUE", "FALSE"),
                                                    ("", "1", "0"), ("\ufeff", "True", "False")])
def test_a_file_saved_by_a_spreadsheet_resumes_with_its_counts(tmp_path, bom, true, false):
    """Excel's "CSV UTF-8" starts with a byte-order mark and writes TRUE/FALSE. The mark made the
    header "\\ufeffprompt": refused as labels "for other models (edge:a, cloud:b)", the very ones;
    without it, the TRUE rows were counted wrong, and the run reported an edge accuracy of 1/3."""
    out = tmp_path / "labels.csv"
    rows = [f"What is 0 + 0?,{true},{true},-0.5,3", f"What is 1 + 1?,{true},{false},,"]
    out.write_bytes((bom + HEADER + "\r\n".join(rows) + "\r\n").encode("utf-8"))
    run = _label(out, 3)
    assert (run.num_skipped, run.num_added, run.num_rows) == (2, 1, 3)
    assert (run.edge_correct, run.cloud_correct) == (3, 2)
    text = out.read_bytes().decode("utf-8")
    assert text.startswith(bom + HEADER) and text.endswith("\r\nWhat is 2 + 2?,True,True,,5\r\n")
    assert text.count("What is") == 3  # nothing labelled twice


def test_a_quote_never_closed_up_the_file_is_refused_not_cut_off(tmp_path):
    """A stray double quote on line 3 (a hand edit) made the rest of the file one unclosed cell:
    read as a row cut off by a killed run, the file was truncated there, and the three rows after
    it were lost without a word. Now the line is named and the file is left as it was."""
    out = tmp_path / "labels.csv"
    body = (HEADER + "What is 0 + 0?,True,True,,\r\n" + '"What is 1 + 1?,True,False,,\r\n'
            + "What is 2 + 2?,True,True,,\r\nWhat is 3 + 3?,False,True,,\r\n")
    out.write_bytes(body.encode())
    with pytest.raises(DataError, match="line 3: a double quote opened there is never closed"):
        _label(out, 5)
    assert out.read_bytes() == body.encode()


def test_a_last_row_cut_off_inside_its_prompt_is_still_labelled_again(tmp_path):
    """The case the truncation is for: a killed run left the last row's multi-line prompt open."""
    out = tmp_path / "labels.csv"
    out.write_bytes((HEADER + "What is 0 + 0?,True,True,,\r\n" + '"What is\r\n1 + 1, step').encode())
    run = _label(out, 2)
    assert (run.num_skipped, run.num_added) == (1, 1)
    rows = "What is 0 + 0?,True,True,,\r\nWhat is 1 + 1?,True,True,,5\r\n"
    assert out.read_bytes().decode() == HEADER + rows


def test_the_progress_line_survives_a_clock_that_did_not_tick(tmp_path, monkeypatch):
    """The rate divided by the elapsed time: on Windows' 15.6 ms monotonic clock a fast (cached)
    pair of answers saw 0 and the run stopped with ZeroDivisionError after writing its first row."""
    monkeypatch.setattr(label_mod.time, "monotonic", lambda: 100.0)
    progress = io.StringIO()
    run = label_to_csv(_questions(3), _right, _right, tmp_path / "l.csv", edge_col="e", cloud_col="c",
                       progress=progress)
    assert run.num_added == 3
    assert progress.getvalue().count("labelled ") == 3 and "ETA 0m00s" in progress.getvalue()
