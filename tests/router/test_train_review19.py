"""`hybridllm router train` given one --data file twice: refused before any training, not trained
as two sources of the same rows."""

from __future__ import annotations

import pytest

from hybridllm import DataError
from hybridllm.router.train import train_from_csv


def test_one_file_given_twice_is_refused(tmp_path):
    """Each row counted twice, and the two sources' metrics and columns kept under one name."""
    data = tmp_path / "labels.csv"
    data.write_text("prompt,weak,strong\n" + "".join(
        f"question {i},{i % 3 == 0},{i % 4 != 0}\n" for i in range(40)), encoding="utf-8")
    other_spelling = tmp_path / "sub" / ".." / "labels.csv"
    (tmp_path / "sub").mkdir()
    with pytest.raises(DataError, match=r"labels\.csv is given twice"):
        train_from_csv([data, other_spelling], tmp_path / "out", use_embedding=False)
    assert not (tmp_path / "out").exists()
