"""The ONNX backend ends an answer on every token llama.cpp ends on, the fill-in-the-middle ones too.

llama.cpp's vocabulary loader marks the FIM pad, repo and file-separator tokens end-of-generation
(by their text): SmolLM2's <reponame>, Qwen2.5-Coder's <|fim_pad|>, <|repo_name|> and <|file_sep|>.
The ONNX backend knew only the end-of-turn names, and only for tokens marked special, while Qwen's
tokenizer.json marks its FIM tokens not special: a model that drew one stopped on llama.cpp and
wrote on (a new "file") on ONNX.
"""

from __future__ import annotations

import json

import pytest

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def _tokenizer(folder, added):
    folder.mkdir(exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps({"added_tokens": [
        {"id": i, "content": text, "special": special} for i, (text, special) in enumerate(added)]}))
    return folder


def test_fim_pad_repo_and_file_separator_end_the_answer_special_or_not(tmp_path):
    from hybridllm.backends.onnx_folder import _named_eog_ids

    qwen = _tokenizer(tmp_path / "qwen", [
        ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
        ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False),
        ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
        ("<tool_call>", False),
    ])
    assert _named_eog_ids(qwen) == {0, 2, 6, 7, 8}
    smollm2 = _tokenizer(tmp_path / "smollm2", [
        ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
        ("<repo_name>", True), ("<reponame>", True), ("<file_sep>", True), ("<filename>", True),
    ])
    assert _named_eog_ids(smollm2) == {0, 2, 4}


@pytest.mark.real
def test_onnx_ends_on_the_tokens_llama_cpp_ends_on(smollm2_path, monkeypatch):
    pytest.importorskip("onnxruntime_genai")
    from llama_cpp import llama_cpp as C

    from hybridllm import GenerationParams
    from hybridllm.backends import onnx
    from hybridllm.backends.llama_cpp import LlamaCppBackend
    from hybridllm.models.onnx_prepare import prepare_onnx

    prepare_onnx("smollm2-135m-instruct")
    ref = LlamaCppBackend(str(smollm2_path), n_ctx=256, n_threads=1)
    edge = onnx.OnnxBackend("smollm2-135m-instruct", n_ctx=256, n_threads=1)
    try:
        vocab = ref._llm._model.vocab
        # SmolLM2's special tokens are ids 0-16: llama.cpp ends on <|endoftext|>, <|im_end|>, <reponame>
        eog = {t for t in range(17) if C.llama_vocab_is_eog(vocab, t)}
        assert 4 in eog
        assert {t for t in range(17) if t in edge._eos_ids} == eog
        params = GenerationParams(max_tokens=24, temperature=0.0)
        first3 = edge.generate(FRANCE, GenerationParams(max_tokens=3, temperature=0.0))
        real_sample = onnx._sample
        monkeypatch.setattr(onnx, "_sample", lambda row, p, seed, step, recent: (
            4 if step == 3 else real_sample(row, p, seed, step, recent)))
        g = edge.generate(FRANCE, params)
        assert (g.text, g.finish_reason, g.usage.completion_tokens) == (first3.text, "stop", 3)
    finally:
        edge.close()
        ref.close()
