"""Parity with llama.cpp on the same GGUF weights (SmolLM2-135M-Instruct and Gemma 3 270M).

For each of 20 varied prompts, llama.cpp greedily continues 32 tokens; the engine scores
prompt + continuation in one teacher-forced prefill. At the 32 continuation positions the
next-token argmax must agree with llama.cpp's at >= 95% of positions and the logits' cosine
similarity must average above 0.99 (measured: about 0.999). llama.cpp multiplies quantized
weights by 8-bit-quantized activations and keeps K/V in fp16, while the engine runs the
dequantized weights in fp32, so single positions dip lower (measured minimum about 0.975);
a layout or RoPE bug would drop every position far below these bars.
"""

from __future__ import annotations

import pytest

from .conftest import fp32_engine
from .llamacpp_reference import LlamaCppReference

pytestmark = pytest.mark.real

NUM_NEW = 32
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    ",
    "Q: What is 17 multiplied by 3?\nA:",
    "The three primary colors are",
    "Photosynthesis is the process by which",
    "import numpy as np\n\nx = np.arange(10)\n",
    "La tour Eiffel se trouve à",
    "1, 2, 3, 5, 8, 13,",
    "Dear hiring manager, I am writing to apply for",
    "The quick brown fox",
    "In 1969, Neil Armstrong",
    "SELECT name, age FROM users WHERE",
    "Water boils at a temperature of",
    "Here is a list of healthy breakfast ideas:\n1.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many in May.",
    "The mitochondria is",
    "To be, or not to be,",
    "<html>\n<head>\n<title>",
    "Machine learning models are trained by",
]


def _engine(path):
    return fp32_engine(path)  # the model code itself, in fp32 (no int8, no bf16)


def _measure(path, chat: bool) -> tuple[float, float, float]:
    import numpy as np
    import torch

    engine = _engine(path)
    ref = LlamaCppReference(path)
    agree, cosines = [], []
    try:
        for i, text in enumerate(PROMPTS):
            if chat and i % 2:  # half the prompts through the model's own chat template
                text = engine.tokenizer.apply_chat_template([{"role": "user", "content": text}])
            prompt_ids = engine.tokenizer.encode(text)
            cont_ids, ref_logits = ref.greedy(prompt_ids, NUM_NEW)
            logits = engine.score(prompt_ids + cont_ids[:-1])[len(prompt_ids) - 1 :]  # [32, V]
            ref_t = torch.from_numpy(ref_logits)
            agree.extend((logits.argmax(-1) == ref_t.argmax(-1)).tolist())
            cosines.extend(torch.nn.functional.cosine_similarity(logits, ref_t, dim=-1).tolist())
    finally:
        ref.close()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return float(np.mean(agree)), float(np.mean(cosines)), float(np.min(cosines))


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_parity_with_llamacpp(model, request):
    path = request.getfixturevalue(f"{model}_path")
    agreement, mean_cos, min_cos = _measure(path, chat=(model == "smollm2"))
    print(f"\n{model}: argmax agreement {agreement:.4f}, cosine mean {mean_cos:.5f} "
          f"min {min_cos:.5f} over {len(PROMPTS)} prompts x {NUM_NEW} tokens")
    assert agreement >= 0.95
    assert mean_cos > 0.99
    assert min_cos > 0.95
