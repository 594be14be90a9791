"""The ONNX builds against a reference: fp32 against transformers fp32 on the same exported weights
(greedy, token for token), and the int4 build against fp32 (teacher-forced argmax).

Each build is prepared from the catalog's GGUF into the session's empty HYBRIDLLM_HOME, once per
session (a second ``prepare_onnx`` finds the folder); transformers reads the Hugging Face folder the
fp32 build exported on its way.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime_genai")
pytest.importorskip("transformers")

pytestmark = pytest.mark.real
MODEL = "smollm2-135m-instruct"
QUESTIONS = [
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue.",
    "Give me three tips for writing clean Python code.",
    "Write a short poem about autumn leaves.",
    "What are the main differences between a list and a tuple in Python?",
    "Summarize the plot of Romeo and Juliet.",
    "How do I boil an egg?",
    "Name five animals that live in the ocean.",
    "What is photosynthesis?",
    "Translate 'good morning' into Spanish.",
    "Write a haiku about the sea.",
    "What is 12 times 7?",
    "Describe a cat in one sentence.",
    "Why do we need sleep?",
    "List three uses of a paperclip.",
    "What is the boiling point of water?",
    "Who wrote Hamlet?",
    "Give me a fun fact about space.",
    "How does a rainbow form?",
    "Write a Python function that reverses a string.",
]
NEW_TOKENS = 32


def _backend(precision):
    from hybridllm.backends.onnx import OnnxBackend
    from hybridllm.models.onnx_prepare import prepare_onnx

    prepare_onnx(MODEL, precision=precision)
    return OnnxBackend(MODEL, precision=precision, n_ctx=1024)


def _greedy(backend, ids, n=NEW_TOKENS):
    seq, out = list(ids), []
    for _ in range(n):
        token = int(backend._logits(seq).argmax())
        out.append(token)
        if token in backend._eos_ids:
            break
        seq.append(token)
    return out


def _teacher_forced_argmax(backend, ids, continuation):
    return [int(backend._logits(list(ids) + continuation[:i]).argmax()) for i in range(len(continuation))]


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system
        shutil.copy2(src, dst)


def _prepare_keeping_hf(precision: str, keep: Path) -> Path | None:
    """``prepare_onnx``, keeping the Hugging Face folder it exports from the GGUF on its way (linked
    out before the build's work folder is removed): transformers reads that same folder. Exporting
    it again still takes 7.7 s (7.2 s CPU: 4.5 s dequantizing, 2.2 s writing 540 MB of fp32; 16 s
    when the tokenizer was read with GGUFReader), so the kept one is worth this. None when the
    build was already there (nothing exported)."""
    from cloud_server.models import export_hf
    from hybridllm.models.onnx_prepare import prepare_onnx

    export, kept = export_hf.gguf_to_hf_folder, []

    def export_and_keep(*args, **kwargs):
        hf = export(*args, **kwargs)
        shutil.copytree(hf, keep, copy_function=_link_or_copy)
        kept.append(keep)
        return hf

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(export_hf, "gguf_to_hf_folder", export_and_keep)
        prepare_onnx(MODEL, precision=precision)
    return kept[0] if kept else None


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    from hybridllm.backends.onnx import OnnxBackend

    work = tmp_path_factory.mktemp("onnx-parity")
    hf = _prepare_keeping_hf("fp32", work / "hf")
    backend = OnnxBackend(MODEL, precision="fp32", n_ctx=1024)
    prompts = [backend.tokenize([{"role": "user", "content": q}]) for q in QUESTIONS]
    refs = [_greedy(backend, ids) for ids in prompts]
    yield backend, prompts, refs, hf
    backend.close()
    shutil.rmtree(work, ignore_errors=True)  # the fp32 export, half a GB


def test_fp32_greedy_matches_transformers_fp32(fp32, tmp_path):
    # transformers reads the ONNX greedy answer in one forward pass; the answers are identical
    # exactly when its argmax at every answer position is the token ONNX chose there
    import torch
    from transformers import AutoModelForCausalLM

    from cloud_server.models.export_hf import gguf_to_hf_folder
    from hybridllm.models import pull

    _, prompts, refs, hf = fp32
    hf = hf or gguf_to_hf_folder(pull(MODEL), tmp_path / "hf")  # the same export, when none was kept
    model = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32).eval()
    same = 0
    for ids, ref in zip(prompts[:10], refs[:10], strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([ids + ref[:-1]])).logits[0]  # [len, vocab]
        same += logits[len(ids) - 1 :].argmax(-1).tolist() == ref
    assert same >= 9, f"only {same}/10 greedy answers identical"


def test_int4_agrees_with_fp32_teacher_forced(fp32):
    # int4 computes with the GGUF's own blocks (onnx_gguf): measured 0.971 on these 20 prompts;
    # the builder's own int4 (a second rounding of 4-bit weights) gave 0.64-0.69 here
    _, prompts, refs, _ = fp32
    precision, floor = "int4", 0.95
    quant = _backend(precision)
    try:
        agree = total = 0
        for ids, ref in zip(prompts, refs, strict=True):
            pred = _teacher_forced_argmax(quant, ids, ref)
            agree += sum(a == b for a, b in zip(pred, ref, strict=True))
            total += len(ref)
    finally:
        quant.close()
    assert total >= 20 * 8
    assert agree / total >= floor, f"{precision}: {agree}/{total} = {agree / total:.3f}"
