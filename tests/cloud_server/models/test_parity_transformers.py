"""Greedy parity with Hugging Face transformers (fp32) on the same GGUF file.

transformers reads the GGUF itself (its own dequantizer, its own Llama/Qwen2 code), from the local
file only. For 10 chat prompts the engine continues greedily for 32 tokens (EOS does not stop it;
all 10 in one batch). At least 9 of the 10 continuations must be transformers' greedy ones token
for token (fp32 summation order can flip a near tie).

transformers reads the engine's continuations teacher-forced: one forward pass of prompt +
continuation, its argmax at every continuation position. A continuation is transformers' greedy
one exactly when each of its tokens is that argmax, so one pass replaces 32 one-token steps per
prompt (Qwen 0.5B: 75 s -> 12 s). Measured on the 10 prompts: the pass picks the tokens the
step-by-step KV-cached greedy picked, 10/10 on both models (SmolLM2's logits differ by at most
7e-5); prompts of one length run as one batch, bitwise equal to one at a time.
"""

from __future__ import annotations

import contextlib

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


@contextlib.contextmanager
def _gguf_read_once():
    """While transformers loads a GGUF: its config step and its weights step each parse the whole
    file's metadata with gguf's reader (Qwen's 151k-entry vocabulary: about 16 s each), and it
    rebuilds gguf's tensor-name table once per module (300-400 times). Both are pure functions
    of their arguments, so each is computed once here; what transformers computes is unchanged."""
    import functools

    import gguf

    saved = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = functools.cache(saved[0])
    gguf.get_tensor_name_map = functools.cache(saved[1])
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = saved


def _hf_model(path):
    import os

    import torch

    os.environ["HF_HUB_OFFLINE"] = "1"  # the file is local; never ask a hub
    from transformers import AutoModelForCausalLM

    with _gguf_read_once():
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
    return model.eval()


def _hf_argmax(model, prompts: list[list[int]], conts: list[list[int]]) -> list[list[int]]:
    """transformers' argmax after prompt + each prefix of its continuation, teacher-forced: rows of
    one length in one batch (no padding, so no row sees another's)."""
    import torch

    by_len: dict[int, list[int]] = {}
    for i, ids in enumerate(prompts):
        by_len.setdefault(len(ids) + len(conts[i]), []).append(i)
    out: list[list[int]] = [[] for _ in prompts]
    with torch.inference_mode():
        for rows in by_len.values():
            batch = torch.tensor([prompts[i] + conts[i][:-1] for i in rows])
            logits = model(input_ids=batch).logits
            for row, i in enumerate(rows):
                out[i] = logits[row, len(prompts[i]) - 1 :].argmax(-1).tolist()
    return out


@pytest.mark.parametrize("model", ["smollm2", "qwen05"])
def test_greedy_output_equals_transformers(model, request):
    from cloud_server.engine.sampling_params import SamplingParams

    path = request.getfixturevalue(f"{model}_path")
    engine = request.getfixturevalue(f"{model}_fp32")
    chat = engine.tokenizer.apply_chat_template
    prompts = [engine.tokenizer.encode(chat([{"role": "user", "content": q}])) for q in QUESTIONS]
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW, ignore_eos=True)
    ours = [r.token_ids for r in engine.generate(prompts, params)]
    assert all(len(o) == NUM_NEW for o in ours)
    theirs = _hf_argmax(_hf_model(path), prompts, ours)
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    print(f"\n{model}: {same}/10 continuations identical to transformers fp32")
    assert same >= 9
