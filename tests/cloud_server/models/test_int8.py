"""Weight-only int8 and int4 against the fp32 engine on the same GGUF, teacher-forced.

For 20 prompts (half through the chat template), fp32 continues greedily for 32 tokens; both
engines then score prompt + continuation in one prefill. At the 32 continuation positions the
quantized engine's argmax must match fp32's at >= 97% of positions, and the logits' mean cosine
must exceed 0.99. int8 keeps a GGUF's blocks of 32 as its groups (SmolLM2's Q4_1 and Q8_0
exactly), so what differs from fp32 is the bf16 activations: measured 2026-11-26 on SmolLM2-135M
(many near ties) 97.34% with bf16 activations and 99.38% with fp32 ones (cosine 0.99989 / 0.99996),
Qwen2.5-Coder-0.5B 99.53%; int4 (4-bit groups with bf16 scales) SmolLM2 97.3%, Qwen 99.53%.
Per-row int8 scales (before 2026-11-26) gave SmolLM2 95.5%.
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
    ("model", "quantization", "dtype", "min_agreement"),
    [("qwen05", "int8", "bfloat16", 0.97), ("smollm2", "int8", "bfloat16", 0.97),
     ("smollm2", "int8", "float32", 0.99), ("smollm2", "int4", "bfloat16", 0.97)],
)
def test_int8_agrees_with_fp32(model, quantization, dtype, min_agreement, request):
    ref = request.getfixturevalue(f"{model}_fp32")
    q = fp32_engine(request.getfixturevalue(f"{model}_path"), quantization=quantization, dtype=dtype)
    gate_up = q.runner.model.model.layers[0].mlp.gate_up_proj
    # int4 groups stay packed on CPU, the one device with an int4 kernel here; elsewhere they are
    # widened once to the activation dtype (int8 rows stay int8 everywhere)
    packed = quantization == "int8" or q.device.type == "cpu"
    assert gate_up.weight.dtype.is_floating_point is not packed
    assert gate_up.int4 == (quantization == "int4" and packed)
    agreement, cosine = _compare(ref, q)
    print(f"\n{model} {quantization} {dtype}: argmax agreement {agreement:.4f}, mean cosine {cosine:.5f}")
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
