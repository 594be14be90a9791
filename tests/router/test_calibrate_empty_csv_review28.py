"""Review 28: `router calibrate --prompts` on an empty CSV (nothing, blank lines, or only Excel's
byte-order mark) says the file is empty, as `train` and `eval` do; it said the file had "no
'prompt' column (columns: )"."""

from __future__ import annotations

import pytest

from hybridllm import DataError
from hybridllm.router.dataset import read_prompts


@pytest.mark.parametrize("content", [b"", b"\n\n", b"\xef\xbb\xbf"])
def test_empty_prompts_csv_is_said_to_be_empty(tmp_path, content):
    path = tmp_path / "traffic.csv"
    path.write_bytes(content)
    with pytest.raises(DataError, match=r"traffic\.csv is empty"):
        read_prompts(path)
