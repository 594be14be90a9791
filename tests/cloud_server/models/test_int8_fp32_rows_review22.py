"""int8 rows with fp32 activations on the CPU: the rows are widened and BLAS runs the matmul.

torch 2.13's ``_weight_int8pack_mm`` has no fast fp32 path on AVX2 (71 ms against 2 ms for 64 rows
of SmolLM2's 576 -> 1536 on an AMD EPYC), so ``Linear`` computes ``(x Q^T) * s`` itself for fp32
activations: exactly ``F.linear`` on the widened codes, scaled per output column.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cloud_server.layers.linear import Linear, quantize_rows


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_fp32_activations_are_blas_on_the_widened_rows(rows):
    torch.manual_seed(0)
    w = torch.randn(96, 80)  # 80 % 32 != 0: one scale per row, torch's int8 row format
    q, s = quantize_rows(w)
    layer = Linear(80, 96)
    layer.load(q, scale=s)
    x = torch.randn(rows, 80)
    want = F.linear(x, q.float()) * s
    assert torch.equal(layer(x), want)


def test_bf16_activations_with_whole_groups_of_16_still_match_the_rows(torchs_kernels):
    # torch's bf16 kernel: where the engine's own CPU kernels load (AVX-512 VNNI), this 64 x 96
    # matrix takes their format instead, whose int8 activations are tested in test_cpu_kernels
    torch.manual_seed(1)
    w = torch.randn(64, 96)
    q, s = quantize_rows(w)
    layer = Linear(96, 64)
    layer.load(q, scale=s)
    assert not layer.blocks  # the rows as torch's kernel takes them
    x = torch.randn(5, 96).to(torch.bfloat16)
    want = F.linear(x.float(), q.float()) * s
    torch.testing.assert_close(layer(x).float(), want, rtol=2e-2, atol=5e-2)
