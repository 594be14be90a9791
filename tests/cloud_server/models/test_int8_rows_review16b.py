"""Per-row int8 weights (a matrix whose rows are not whole groups of 32) with bf16 activations on
CPU: torch's ``_weight_int8pack_mm`` reads bf16 inputs 16 columns at a time, and at in % 16 != 0
it gave NaN, inf or garbage (in = 33 crashed the process). Fast: random weights, no model."""

from __future__ import annotations

import pytest
import torch

from cloud_server.layers.linear import Linear, quantize_rows


@pytest.mark.parametrize("out_features,in_features", [(20, 40), (16, 24), (4, 8), (20, 56), (16, 48)])
@pytest.mark.parametrize("rows", [1, 3, 9])
def test_int8_rows_bf16_matches_float(out_features, in_features, rows):
    g = torch.Generator().manual_seed(out_features * 100 + in_features)
    w = torch.randn(out_features, in_features, generator=g)
    q, s = quantize_rows(w)
    layer = Linear(in_features, out_features)
    layer.load(q, scale=s.to(torch.bfloat16))  # the loader hands per-row scales in the activation dtype
    assert not layer.blocks and not layer.int4  # torch's int8 kernel, not the engine's
    x = torch.randn(rows, in_features, generator=g).to(torch.bfloat16)
    y = layer(x)
    assert y.dtype == torch.bfloat16 and y.shape == (rows, out_features)
    ref = x.float() @ (q.float() * s.to(torch.bfloat16).float().unsqueeze(1)).T
    assert torch.isfinite(y).all()
    err = (y.float() - ref).norm() / ref.norm()
    assert err < 0.02, err


def test_a_model_whose_mlp_rows_are_not_whole_groups_runs_in_int8_bf16():
    """End to end: intermediate_size 40 makes down_proj a per-row int8 matrix of 40 columns."""
    from cloud_server.engine.sampling_params import SamplingParams
    from cloud_server.engine.scheduler import ScheduledSeq
    from cloud_server.engine.sequence import Sequence
    from tests.cloud_server.engine._tiny_model import tiny_config, tiny_model, tiny_runner, tiny_weights

    cfg = tiny_config(intermediate_size=40)
    tensors = tiny_weights(cfg, scale=0.3)

    def logits(quantization):
        model = tiny_model(cfg, tensors, dtype=torch.bfloat16, quantization=quantization)
        runner = tiny_runner(model, cfg, num_blocks=4, block_size=4, dtype=torch.bfloat16)
        seq = Sequence("r", [1, 5, 9, 13, 2, 7, 3, 11, 4], SamplingParams(temperature=0.0))
        seq.block_table = [2, 0, 3]
        return runner.prompt_logits(ScheduledSeq(seq, 9))

    ref, got = logits("none"), logits("int8")
    assert torch.isfinite(got).all()
    assert ((got - ref).norm() / ref.norm()) < 0.05
