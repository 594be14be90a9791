"""Resuming `router label` past a last row cut off inside its last cell. Rows are written here
with their line end, so a last row without one is a write the run was killed in, even when it has
all its cells: `-0.53000` cut to `-0.5`, a token count 37 cut to 3. Before, such a row was kept
as a whole row (the spreadsheet tolerance) and its shortened number silently trained on; now it is
removed and labelled again, said on stderr. A row this run cannot label again is kept as written."""

from __future__ import annotations

import csv
import io

from hybridllm.router import label as label_mod
from hybridllm.router.label import Answer, Question

QS = [Question(f"What is {i} + {i}?", str(2 * i)) for i in range(4)]


def _edge(prompt):
    return "The answer is 0", -0.53


def _cloud(prompt):
    i = int(prompt.split()[2])
    return Answer(text=f"The answer is {2 * i}", num_tokens=37)


def _rows(path):
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.reader(fh))


def _label(out, questions=QS):
    said = io.StringIO()
    run = label_mod.label_to_csv(questions, _edge, _cloud, out, edge_col="e", cloud_col="c", progress=said)
    return run, said.getvalue()


def test_a_token_count_cut_short_is_labelled_again(tmp_path):
    out = tmp_path / "l.csv"
    _label(out)
    data = out.read_bytes()
    assert data.endswith(b",37\r\n")
    out.write_bytes(data[: -len(b"7\r\n")])  # killed inside the last cell: "37" reads "3"
    run, said = _label(out)
    assert (run.num_skipped, run.num_added, run.num_rows) == (3, 1, 4)
    assert "no line end" in said and "labelled again" in said
    rows = _rows(out)
    assert len(rows) == 5 and all(r[4] == "37" for r in rows[1:]), rows
    assert sorted(r[0] for r in rows[1:]) == sorted(q.prompt for q in QS)


def test_a_logprob_cut_short_in_a_file_without_cloud_tokens_is_labelled_again(tmp_path):
    """A RouteLLM-style file of four columns: the logprob is the last cell."""
    out = tmp_path / "l.csv"
    out.write_bytes(
        b"prompt,e,c,edge_mean_logprob\r\n"
        b"What is 0 + 0?,True,True,-0.53000\r\n"
        b"What is 1 + 1?,False,True,-0.5"
    )
    run, said = _label(out, QS[:2])
    assert (run.num_skipped, run.num_added, run.num_rows) == (1, 1, 2)
    assert "labelled again" in said
    rows = _rows(out)
    assert rows[0] == ["prompt", "e", "c", "edge_mean_logprob"]
    assert rows[1:] == [["What is 0 + 0?", "True", "True", "-0.53000"],
                        ["What is 1 + 1?", "False", "True", "-0.53000"]]


def test_a_last_row_this_run_cannot_label_again_is_kept(tmp_path):
    """Not among the questions (a spreadsheet-saved file, a shorter --limit): removing it lost it."""
    out = tmp_path / "l.csv"
    out.write_bytes(
        b"prompt,e,c,edge_mean_logprob,cloud_tokens\r\n"
        b"Another question,True,False,-0.10000,12"
    )
    run, said = _label(out, QS[:2])
    assert (run.num_skipped, run.num_added, run.num_rows) == (0, 2, 3)
    assert "kept as written" in said
    rows = _rows(out)
    assert rows[1] == ["Another question", "True", "False", "-0.10000", "12"]
    assert sorted(r[0] for r in rows[2:]) == [q.prompt for q in QS[:2]]


def test_a_whole_file_resumes_without_a_word(tmp_path):
    out = tmp_path / "l.csv"
    _label(out, QS[:2])
    before = out.read_bytes()
    run, said = _label(out, QS[:2])
    assert (run.num_skipped, run.num_added) == (2, 0) and said == "" and out.read_bytes() == before
