"""Labelled CSV files as Excel writes them in a locale whose decimal separator is a comma."""

from __future__ import annotations

import numpy as np
import pytest

from hybridllm._exceptions import DataError
from hybridllm.router.dataset import load_routellm_csv

ROWS = [("what is 3,5 plus 1?", "0,5", "1"), ("name a cat", "0", "0,75"), ("why; and how", "1", "1")]


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_decimal_commas_in_a_semicolon_file_are_scores_and_the_prompt_is_kept(tmp_path):
    lines = ["prompt;weak;strong"] + [f'"{p}";{w};{s}' for p, w, s in ROWS]
    data = load_routellm_csv(_write(tmp_path / "x.csv", "\n".join(lines) + "\n"))
    assert np.allclose(data.weak, [0.5, 0.0, 1.0]) and np.allclose(data.strong, [1.0, 0.75, 1.0])
    assert data.prompts == [p for p, _, _ in ROWS]  # "3,5" in a prompt stays as written


def test_excels_localized_true_false(tmp_path):
    text = "prompt;weak;strong\nq1;FALSCH;WAHR\nq2;WAHR;WAHR\nq3;FAUX;VRAI\n"
    data = load_routellm_csv(_write(tmp_path / "x.csv", text))
    assert data.weak.tolist() == [0, 1, 0] and data.strong.tolist() == [1, 1, 1]


def test_excels_sep_line_names_the_separator(tmp_path):
    # a column name with a comma in it: without the sep= line, the header reads as comma-separated
    text = "sep=;\r\nprompt;model a, v1;model b, v2\r\nq1;0;1\r\nq2;1;1\r\nq3;0,5;1\r\n"
    data = load_routellm_csv(_write(tmp_path / "x.csv", text), weak_col="model a, v1",
                             strong_col="model b, v2")
    assert data.prompts == ["q1", "q2", "q3"] and np.allclose(data.weak, [0, 1, 0.5])


def test_a_bad_row_after_a_sep_line_is_named_by_its_own_line(tmp_path):
    text = "sep=;\nprompt;weak;strong\nq1;0;1\nq2;1;1;9\n"
    with pytest.raises(DataError, match="line 4"):
        load_routellm_csv(_write(tmp_path / "x.csv", text))


def test_a_semicolon_header_read_as_comma_separated_says_how_to_fix_it(tmp_path):
    text = "prompt;model a, v1;model b, v2\nq1;0;1\n"
    with pytest.raises(DataError, match="separated by ','.*sep=;.*CSV UTF-8"):
        load_routellm_csv(_write(tmp_path / "x.csv", text))


def test_a_column_blank_in_every_row_is_named(tmp_path):
    text = "prompt,weak,strong\nq1,NaN,True\nq2,nan,False\n"
    with pytest.raises(DataError, match=r"weak is blank in every row"):
        load_routellm_csv(_write(tmp_path / "x.csv", text))


def test_a_comma_file_keeps_refusing_a_quoted_decimal_comma(tmp_path):
    # in a comma-separated file "1,5" may be a thousands separator: not read as 1.5
    text = 'prompt,weak,strong\nq1,"1,5",1\nq2,0,1\n'
    with pytest.raises(DataError):
        load_routellm_csv(_write(tmp_path / "x.csv", text), weak_col="weak", strong_col="strong")
