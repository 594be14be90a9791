"""`hybridllm router train` / `eval` / `calibrate` as a user training on their own CSV files: a
malformed row is refused with its line and what to do, never read shifted or silently dropped."""

from __future__ import annotations

import pytest

from hybridllm._exceptions import DataError
from hybridllm.cli import main
from hybridllm.router.dataset import load_routellm_csv, read_prompts


def _rows(n):
    topic = ("history", "math")
    return [(f"Question {i} about {topic[i % 2]}", i % 3 == 0, i % 3 != 2) for i in range(n)]


def _write(path, rows, *, bad_line=None, at=None):
    lines = ["prompt,edge:m,cloud:m"] + [f"{p},{w},{s}" for p, w, s in rows]
    if bad_line is not None:
        lines.insert(at, bad_line)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_an_unclosed_quote_is_refused_not_swallowing_the_rows_after_it(tmp_path):
    """A quote never closed made the rest of the file one cell: 30 of 60 rows trained as one
    'skipped' row, and the run succeeded."""
    p = _write(tmp_path / "l.csv", _rows(60), bad_line='"Is 5 more than 3?,True,False', at=31)
    with pytest.raises(DataError, match=r"l\.csv lines 32-62: a double quote opened there is never closed"):
        load_routellm_csv(p)


def test_an_unquoted_comma_names_its_line_not_a_missing_model_column(tmp_path):
    """A prompt with an unquoted comma shifted its cells into the score columns; the error then
    said the file had one model column."""
    p = _write(tmp_path / "l.csv", _rows(60), bad_line="Add 2, then 3,True,True", at=11)
    with pytest.raises(DataError, match=r"line 12: a cell holds an unquoted ',', so its row has 4 cells"):
        load_routellm_csv(p)


def test_calibrate_prompts_with_an_unquoted_comma_are_refused_not_cut(tmp_path):
    """A prompts CSV for `router calibrate`: the prompt before the comma was used, the rest dropped."""
    p = tmp_path / "prompts.csv"
    p.write_text("prompt\nWhat is the capital of France?\nName two colors, then a fruit\n", encoding="utf-8")
    with pytest.raises(DataError, match="line 3: a cell holds an unquoted ','"):
        read_prompts(p)


def test_well_formed_rows_still_load(tmp_path):
    """Quoted commas, doubled quotes, line breaks in quotes, a blank line, a trailing delimiter and
    a short row (a blank score: left out and counted) read as before."""
    p = tmp_path / "l.csv"
    p.write_text(
        "prompt,edge:m,cloud:m\n"
        '"Add 2, then 3",False,True\n'
        '"Is 5"" more than 3?",True,True\n'
        '"two\nlines",False,True,\n'
        "\n"
        "short row,True\n"
        "plain,False,False\n",
        encoding="utf-8",
    )
    data = load_routellm_csv(p, weak_col="edge:m", strong_col="cloud:m")
    assert data.prompts == ["Add 2, then 3", 'Is 5" more than 3?', "two\nlines", "plain"]
    assert data.skipped == 1


def test_the_cli_says_it_on_one_line_and_writes_no_router(tmp_path, capsys):
    p = _write(tmp_path / "l.csv", _rows(60), bad_line='"unclosed,True,False', at=20)
    out = tmp_path / "router"
    rc = main(["router", "train", "--data", str(p), "--out", str(out), "--no-embedding"])
    err = capsys.readouterr().err
    assert rc == 1 and "lines 21-" in err and "Traceback" not in err
    assert not out.exists()
