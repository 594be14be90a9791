"""The reranker's logit range is read off its graphs once, as its folder is prepared, and kept in
``logit_range.json`` beside them: using the cache then never loads ``onnx`` (before, the first
lookup with candidates loaded it to read the graph). A folder prepared before the file existed, or
with a damaged file, gets it on first use."""

from __future__ import annotations

import json
import shutil

import pytest

from hybridllm.cache.prepare import (
    FP32_NAME,
    INT8_NAME,
    LOGIT_RANGE_NAME,
    TOKENIZER_NAME,
    logit_ranges,
    prepare_reranker,
)
from hybridllm.cache.reranker_file import read_info

pytestmark = pytest.mark.real


def test_the_ranges_are_kept_beside_the_graphs_and_made_again_when_missing_or_damaged(tmp_path):
    info = read_info()
    folder = prepare_reranker(info.path, info.weights_digest)
    kept = json.loads((folder / LOGIT_RANGE_NAME).read_text())
    assert set(kept) == {FP32_NAME, INT8_NAME}
    lo, hi = kept[INT8_NAME]
    assert -20 < lo < 0 < hi < 20

    for name in (FP32_NAME, INT8_NAME, TOKENIZER_NAME):  # a folder prepared before: no range file
        shutil.copy(folder / name, tmp_path / name)
    ranges = logit_ranges(tmp_path)
    assert {k: list(v) for k, v in ranges.items()} == kept
    assert json.loads((tmp_path / LOGIT_RANGE_NAME).read_text()) == kept

    (tmp_path / LOGIT_RANGE_NAME).write_text("{damaged")
    assert logit_ranges(tmp_path) == ranges

    # once written, the file is what is used (the graphs are not read again)
    (tmp_path / LOGIT_RANGE_NAME).write_text(json.dumps({INT8_NAME: [-1, 1]}))
    assert logit_ranges(tmp_path) == {INT8_NAME: (-1.0, 1.0)}
