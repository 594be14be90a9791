"""Labelled files: a tab-separated file named .csv, and the edge_mean_logprob column (decimal
commas in a ';' file, a cell that is not a log-probability) read or refused, never dropped."""

from __future__ import annotations

import numpy as np
import pytest

from hybridllm._exceptions import DataError
from hybridllm.router.dataset import file_columns, load_routellm_csv, read_prompts


def test_a_tab_separated_csv_is_read(tmp_path) -> None:
    # was: "has no 'prompt' column (columns: prompt\tweak\tstrong)"
    p = tmp_path / "labels.csv"
    p.write_text("prompt\tweak\tstrong\r\nWhat is 2+2, really?\t0\t1\r\nHi\t1\t1\r\n", encoding="utf-8")
    d = load_routellm_csv(p)
    assert d.prompts == ["What is 2+2, really?", "Hi"]
    assert list(d.weak) == [0.0, 1.0] and list(d.strong) == [1.0, 1.0]
    assert file_columns(p) == ["prompt", "weak", "strong"]
    assert read_prompts(p) == ["What is 2+2, really?", "Hi"]


def test_decimal_comma_log_probabilities_of_a_semicolon_file_are_read(tmp_path) -> None:
    # the column was dropped (edge_logprob None): the cascade kept the default floor silently
    p = tmp_path / "excel.csv"
    p.write_text("prompt;weak;strong;edge_mean_logprob\nq1;0,5;1;-0,31\nq2;1;1;-1,2\nq3;1;1;\n",
                 encoding="utf-8")
    d = load_routellm_csv(p)
    assert d.edge_logprob is not None
    np.testing.assert_array_equal(d.edge_logprob[:2], [-0.31, -1.2])
    assert np.isnan(d.edge_logprob[2])


@pytest.mark.parametrize("cell", ["oops", "0.5", "inf"])
def test_a_cell_that_is_not_a_log_probability_is_refused_with_its_row(tmp_path, cell) -> None:
    # "oops" dropped the whole column without a word; 0.5 (a probability) was kept, and the floor
    # calibrated on probabilities escalated every answer
    p = tmp_path / "l.csv"
    p.write_text(f"prompt,weak,strong,edge_mean_logprob\nq1,0,1,-0.31\nq2,1,1,{cell}\nq3,1,1,-0.2\n")
    with pytest.raises(DataError, match=f"row 2: edge_mean_logprob is '{cell}'"):
        load_routellm_csv(p)


def test_blank_nan_and_minus_inf_log_probabilities_still_load(tmp_path) -> None:
    p = tmp_path / "l.csv"
    p.write_text("prompt,weak,strong,edge_mean_logprob\nq1,0,1,-0.31\nq2,1,1,\nq3,1,1,NaN\n"
                 "q4,1,1,-inf\nq5,0,1,0\n")
    d = load_routellm_csv(p)
    assert d.edge_logprob is not None and d.edge_logprob[0] == -0.31 and d.edge_logprob[4] == 0.0
    assert np.isnan(d.edge_logprob[1:3]).all() and d.edge_logprob[3] == -np.inf
