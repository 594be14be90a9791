"""Review 28: `router label` resumes a file that holds only its header cut off mid-write (a run
stopped before any row): the header is written again whole. Before, the cut header was kept as the
file's columns, so every row lost its log-probability and token count (``...,edge_mean_lo``), or
the file was refused as labels of other models (``prompt,e,``)."""

from __future__ import annotations

import io

import pytest

from hybridllm import DataError
from hybridllm.router import label as label_mod
from hybridllm.router._label_files import check_resumable
from hybridllm.router.dataset import load_routellm_csv
from hybridllm.router.label import Answer, Question

QUESTIONS = [Question("What is 2 + 2?", "4"), Question("What is 3 + 3?", "6")]
HEADER = b"prompt,e,c,edge_mean_logprob,cloud_tokens\r\n"


def _right(prompt):
    return Answer(f"The answer is {2 * int(prompt.split()[2])}", mean_logprob=-0.25, num_tokens=4)


@pytest.mark.parametrize("cut", [9, 11, 24])  # mid-name, after a comma, mid-column
def test_a_header_cut_mid_write_is_written_again(tmp_path, cut):
    out = tmp_path / "l.csv"
    out.write_bytes(HEADER[:cut])
    check_resumable(out, edge_col="e", cloud_col="c")  # the CLI's check before the model loads
    progress = io.StringIO()
    run = label_mod.label_to_csv(QUESTIONS, _right, _right, out, edge_col="e", cloud_col="c",
                                 progress=progress)
    assert run.num_added == 2 and "header was cut off" in progress.getvalue()
    assert out.read_bytes().startswith(HEADER)
    data = load_routellm_csv(out)
    assert data.edge_logprob is not None and list(data.edge_logprob) == [-0.25, -0.25]


def test_a_whole_header_or_another_file_is_not_taken_for_a_cut_one(tmp_path):
    out = tmp_path / "l.csv"
    out.write_bytes(HEADER)  # whole, no rows yet: resumed as it is
    run = label_mod.label_to_csv(QUESTIONS[:1], _right, _right, out, edge_col="e", cloud_col="c")
    assert run.num_added == 1 and out.read_bytes().count(HEADER) == 1
    other = tmp_path / "other.csv"
    other.write_bytes(b"prompt,x,")  # not this run's header: refused as before
    with pytest.raises(DataError, match="other models"):
        check_resumable(other, edge_col="e", cloud_col="c")
