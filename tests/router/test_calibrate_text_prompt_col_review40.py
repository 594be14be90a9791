"""`router calibrate --prompts FILE.txt --prompt-col COL`: a text file is read one prompt a line,
and the flag was ignored without a word, so a header line such as ``prompt`` was calibrated on as
one of the prompts."""

import pytest

from hybridllm._exceptions import DataError
from hybridllm.router.dataset import read_prompts


def test_text_file_header_named_by_prompt_col_is_not_a_prompt(tmp_path):
    p = tmp_path / "traffic.txt"
    p.write_text("prompt\nWhat is 2+2?\nName a prime, please.\n", encoding="utf-8")
    assert read_prompts(p, "prompt") == ["What is 2+2?", "Name a prime, please."]


def test_text_file_that_is_a_tab_table_reads_the_column_named(tmp_path):
    p = tmp_path / "traffic.txt"
    p.write_text("id\tquestion\n1\tWhat is 2+2?\n2\tName a prime.\n", encoding="utf-8")
    assert read_prompts(p, "question") == ["What is 2+2?", "Name a prime."]


def test_text_file_without_the_header_named_is_refused(tmp_path):
    p = tmp_path / "traffic.txt"
    p.write_text("What is 2+2?\nName a prime.\n", encoding="utf-8")
    with pytest.raises(DataError, match="--prompt-col"):
        read_prompts(p, "prompt")
    # without the flag, one prompt a line as before
    assert read_prompts(p) == ["What is 2+2?", "Name a prime."]
