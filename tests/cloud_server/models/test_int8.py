"""Weight-only int8 (bf16 activations) against the fp32 engine on the same GGUF, teacher-forced.

For 20 prompts (half through the chat template), fp32 continues greedily for 32 tokens; both
engines then score prompt + continuation in one prefill. At the 32 continuation positions the int8
engine's argmax must match fp32's at >= 97% of positions on Qwen2.5-Coder-0.5B (measured 98.6%),
and the logits' mean cosine must exceed 0.99 (measured 0.9998). SmolLM2-135M has many near ties
(measured 95% agreement, bf16 alone 97.5%, cosine 0.9985): its bar is the cosine plus 93%.
int4 (``quantization="int4"``: SmolLM2's Q4_1 matrices as their own 4-bit groups, the Q8_0
embedding as int8 rows) must reach 97% there too (measured 97.3%, cosine 0.9998).
"""

from __future__ import annotations

import pytest

from .conftest import fp32_engine
from .test_parity_llamacpp import PROMPTS

pytestmark = pytest.mark.real

NUM_NEW = 32


def _compare(ref, q) -> tuple[float, float]:
    import torch

    from cloud_server.engine.sampling_params import SamplingParams

    agree, cosines = [], []
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW, ignore_eos=True)
    for i, text in enumerate(PROMPTS):
        if i % 2:
            text = ref.tokenizer.apply_chat_template([{"role": "user", "content": text}])
        ids = ref.tokenizer.encode(text)
        cont = ref.generate([ids], params)[0].token_ids
        a = ref.score(ids + cont[:-1])[len(ids) - 1 :]  # [32, V]
        b = q.score(ids + cont[:-1])[len(ids) - 1 :]
        agree += (a.argmax(-1) == b.argmax(-1)).tolist()
        cosines += torch.nn.functional.cosine_similarity(a, b, dim=-1).tolist()
    return sum(agree) / len(agree), sum(cosines) / len(cosines)


@pytest.mark.parametrize(
    ("model", "quantization", "min_agreement"),
    [("qwen05", "int8", 0.97), ("smollm2", "int8", 0.93), ("smollm2", "int4", 0.97)],
)
def test_int8_agrees_with_fp32(model, quantization, min_agreement, request):
    ref = request.getfixturevalue(f"{model}_fp32")
    q = fp32_engine(request.getfixturevalue(f"{model}_path"), quantization=quantization, dtype="bfloat16")
    gate_up = q.runner.model.model.layers[0].mlp.gate_up_proj
    # int4 groups stay packed on CPU, the one device with an int4 kernel here; elsewhere they are
    # widened once to the activation dtype (int8 rows stay int8 everywhere)
    packed = quantization == "int8" or q.device.type == "cpu"
    assert gate_up.weight.dtype.is_floating_point is not packed
    assert gate_up.int4 == (quantization == "int4" and packed)
    agreement, cosine = _compare(ref, q)
    print(f"\n{model} {quantization}: argmax agreement {agreement:.4f}, mean cosine {cosine:.5f}")
    assert agreement >= min_agreement
    assert cosine > 0.99


def test_cpu_default_is_int4_with_bf16_activations(smollm2_path):
    import torch

    from cloud_server.config import EngineConfig
    from cloud_server.engine.llm_engine import _resolve_device

    device, dtype, quantization = _resolve_device(EngineConfig(str(smollm2_path), device="cpu"))
    assert (device.type, dtype, quantization) == ("cpu", torch.bfloat16, "int4")
    _, dtype, quantization = _resolve_device(
        EngineConfig(str(smollm2_path), device="cpu", quantization="none")
    )
    assert (dtype, quantization) == (torch.float32, "none")
