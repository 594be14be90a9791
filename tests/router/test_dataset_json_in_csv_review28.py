"""Review 28: a labelled or prompts file named .csv that holds JSON (JSON Lines saved as .csv) is
refused with the name to rename it to. Read as CSV, its first record was taken for the header and
the error said it had no 'prompt' column while listing '{"prompt": ...' among its columns."""

from __future__ import annotations

import json

import pytest

from hybridllm import DataError
from hybridllm.cli import main
from hybridllm.router.dataset import load_routellm_csv, read_prompts

ROWS = [{"prompt": f"question {i}, with a comma", "weak": i % 2 == 0, "strong": True} for i in range(6)]


def _jsonl(path, compact=False):
    sep = (",", ":") if compact else None
    path.write_text("".join(json.dumps(r, separators=sep) + "\n" for r in ROWS), encoding="utf-8")
    return path


@pytest.mark.parametrize("compact", [False, True])
def test_json_lines_named_csv_is_refused_with_the_name_to_use(tmp_path, compact):
    path = _jsonl(tmp_path / "labels.csv", compact)
    with pytest.raises(DataError, match=r"holds JSON, not CSV.*rename it to labels\.jsonl"):
        load_routellm_csv(path)
    with pytest.raises(DataError, match="holds JSON, not CSV"):
        read_prompts(path)


def test_json_array_named_csv_is_refused_with_the_name_to_use(tmp_path):
    path = tmp_path / "labels.csv"
    path.write_text(json.dumps(ROWS, indent=1), encoding="utf-8")
    with pytest.raises(DataError, match=r"holds JSON, not CSV.*rename it to labels\.json\b"):
        load_routellm_csv(path)


def test_the_same_rows_load_as_jsonl_and_a_csv_header_starting_with_a_brace_still_reads(tmp_path):
    assert len(load_routellm_csv(_jsonl(tmp_path / "labels.jsonl")).prompts) == 6
    path = tmp_path / "braced.csv"  # a header that is not JSON: read as the CSV it is
    path.write_text("{prompt},weak,strong\n" + "".join(f"q{i},{i % 2 == 0},True\n" for i in range(6)))
    assert len(load_routellm_csv(path, prompt_col="{prompt}").prompts) == 6


def test_router_train_says_it_on_one_line(tmp_path, capsys):
    path = _jsonl(tmp_path / "labels.csv")
    assert main(["router", "train", "--data", str(path), "--no-embedding", "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "holds JSON, not CSV" in err and err.count("\n") == 1
