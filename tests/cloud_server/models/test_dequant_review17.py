"""A GGUF block tensor whose rows are not whole blocks: a ValueError naming the type (the GGUF
loader turns it into a ModelLoadError naming the tensor), never blocks read across rows."""

from __future__ import annotations

import numpy as np
import pytest

from cloud_server.models.dequant import dequantize_fast_torch, int4_groups, int8_groups


@pytest.mark.parametrize("type_name, block", [("Q8_0", 34), ("Q4_0", 18), ("Q4_K", 144), ("Q6_K", 210)])
def test_rows_that_are_not_whole_blocks_are_refused(type_name, block):
    # two rows of 1.5 blocks: 3 blocks in all, which were read as 1.5 blocks' weights per row
    data = np.zeros((2, block + block // 2), np.uint8)
    with pytest.raises(ValueError, match=f"{type_name} row of {block + block // 2} bytes"):
        dequantize_fast_torch(data, type_name)


def test_a_flat_tensor_cut_short_is_a_value_error():
    with pytest.raises(ValueError, match="Q8_0 row of 35 bytes is not whole 34-byte blocks"):
        dequantize_fast_torch(np.zeros(35, np.uint8), "Q8_0")


@pytest.mark.parametrize("read", [int4_groups, int8_groups])
def test_the_grouped_readers_check_too(read):
    with pytest.raises(ValueError, match="Q4_0 row of 27 bytes"):
        read(np.zeros((2, 27), np.uint8), "Q4_0")


def test_whole_blocks_still_read():
    assert tuple(dequantize_fast_torch(np.zeros((2, 68), np.uint8), "Q8_0").shape) == (2, 64)
