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
    from cloud_server.engine.model_runner import ModelRunner
    from cloud_server.engine.sampling_params import SamplingParams
    from cloud_server.engine.scheduler import ScheduledSeq
    from cloud_server.engine.sequence import Sequence
    from cloud_server.models.config import ModelConfig
    from cloud_server.models.loader import assemble_model, convert_weights

    cfg = ModelConfig("llama", 64, 32, 40, 1, 4, 2, 8)
    g = torch.Generator().manual_seed(0)
    shapes = {"model.embed_tokens.weight": (64, 32), "lm_head.weight": (64, 32),
              "model.norm.weight": None, "model.layers.0.input_layernorm.weight": None,
              "model.layers.0.post_attention_layernorm.weight": None,
              "model.layers.0.self_attn.q_proj.weight": (32, 32),
              "model.layers.0.self_attn.k_proj.weight": (16, 32),
              "model.layers.0.self_attn.v_proj.weight": (16, 32),
              "model.layers.0.self_attn.o_proj.weight": (32, 32),
              "model.layers.0.mlp.gate_proj.weight": (40, 32),
              "model.layers.0.mlp.up_proj.weight": (40, 32),
              "model.layers.0.mlp.down_proj.weight": (32, 40)}
    tensors = {k: torch.ones(32) if s is None else torch.randn(*s, generator=g) * 0.3
               for k, s in shapes.items()}
    dev, dtype = torch.device("cpu"), torch.bfloat16

    def logits(quantization):
        weights = convert_weights(dict(tensors), device=dev, dtype=dtype, quantization=quantization)
        model = assemble_model(cfg, weights, device=dev, dtype=dtype, max_position=64)
        runner = ModelRunner(model, cfg, num_blocks=4, block_size=4, device=dev, dtype=dtype)
        seq = Sequence("r", [1, 5, 9, 13, 2, 7, 3, 11, 4], SamplingParams(temperature=0.0))
        seq.block_table = [2, 0, 3]
        return runner.prompt_logits(ScheduledSeq(seq, 9))

    ref, got = logits("none"), logits("int8")
    assert torch.isfinite(got).all()
    assert ((got - ref).norm() / ref.norm()) < 0.05
