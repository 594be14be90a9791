"""Greedy parity with Hugging Face transformers (fp32) on the same GGUF file.

transformers reads the GGUF itself (its own dequantizer, its own Llama/Qwen2 code), from the local
file only. For 10 chat prompts both continue greedily for 32 tokens from the same prompt ids
(EOS does not stop either); the engine runs all 10 in one batch. At least 9 of the 10
continuations must be identical token for token (fp32 summation order can flip a near tie).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.real

NUM_NEW = 32
QUESTIONS = [
    "Give me three tips for keeping houseplants alive.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Why do cats purr?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "How many minutes are there in a week? Show your work.",
    "What is the difference between a list and a tuple in Python?",
    "Suggest a name for a bakery that sells only bread.",
    "Explain what a hash map is to a beginner.",
    "Translate 'Where is the train station?' into Spanish and German.",
    "Write a SQL query that counts orders per customer.",
]


def _hf_greedy(path, prompts: list[list[int]]) -> list[list[int]]:
    import inspect
    import os

    import torch

    os.environ["HF_HUB_OFFLINE"] = "1"  # the file is local; never ask a hub
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    # the KV cache's name in and out: ``cache`` from transformers 5.2x on (``past_key_values``, the
    # older name, is deprecated there and goes in 5.40), ``past_key_values`` before
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            step = model(input_ids=torch.tensor([ids]), use_cache=True)
            toks: list[int] = []
            for _ in range(NUM_NEW):
                nxt = int(step.logits[0, -1].argmax())
                toks.append(nxt)
                step = model(input_ids=torch.tensor([[nxt]]), use_cache=True, **{key: getattr(step, key)})
            outs.append(toks)
    return outs


@pytest.mark.parametrize("model", ["smollm2", "qwen05"])
def test_greedy_output_equals_transformers(model, request):
    from cloud_server.engine.sampling_params import SamplingParams

    path = request.getfixturevalue(f"{model}_path")
    engine = request.getfixturevalue(f"{model}_fp32")
    chat = engine.tokenizer.apply_chat_template
    prompts = [engine.tokenizer.encode(chat([{"role": "user", "content": q}])) for q in QUESTIONS]
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW, ignore_eos=True)
    ours = [r.token_ids for r in engine.generate(prompts, params)]
    theirs = _hf_greedy(path, prompts)
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    print(f"\n{model}: {same}/10 continuations identical to transformers fp32")
    assert all(len(o) == NUM_NEW for o in ours)
    assert same >= 9
