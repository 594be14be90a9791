"""Review 28: a CSV header that names a column twice is refused naming both positions. Read by
name, the later column's cells stood for both: a file with two 'weak' columns trained on the second
one's scores without a word (pandas, which RouteLLM reads its data with, keeps them as 'weak' and
'weak.1')."""

from __future__ import annotations

import pytest

from hybridllm import DataError
from hybridllm.cli import main
from hybridllm.router.dataset import load_routellm_csv, read_prompts


def _repeated(path):
    # the first 'weak' column is the weak model's; the second, pasted from another file, is not
    rows = "".join(f"question {i},{i % 2 == 0},True,False\n" for i in range(8))
    path.write_text("prompt,weak,strong,weak\n" + rows, encoding="utf-8")
    return path


def test_a_column_named_twice_is_refused_naming_both(tmp_path):
    with pytest.raises(DataError, match=r"two columns named 'weak' \(columns 2 and 4"):
        load_routellm_csv(_repeated(tmp_path / "l.csv"), weak_col="weak", strong_col="strong")


def test_router_eval_says_it_on_one_line(tmp_path, capsys):
    assert main(["router", "eval", "--data", str(_repeated(tmp_path / "l.csv"))]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "two columns named 'weak'" in err and err.count("\n") == 1


def test_repeated_prompt_column_in_a_prompts_file_is_refused(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("prompt,prompt\nfirst,second\n", encoding="utf-8")
    with pytest.raises(DataError, match="two columns named 'prompt'"):
        read_prompts(path)


def test_blank_header_cells_may_repeat(tmp_path):
    path = tmp_path / "l.csv"  # trailing delimiters, as a spreadsheet saves empty columns
    path.write_text("prompt,weak,strong,,\n" + "".join(f"q{i},{i % 2 == 0},True,,\n" for i in range(8)))
    assert len(load_routellm_csv(path).prompts) == 8
