"""The Hugging Face folder path, on a folder written from the SmolLM2 GGUF (no hub access)."""

from __future__ import annotations

import shutil

import pytest

from ..kernels import engine_kernels

pytestmark = pytest.mark.real

TEXTS = [
    "Hello world! How are you today?",
    "The year 2024 has 366 days; 3.14159 is pi.",
    "def f(x):\n    return x ** 2  # square",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "Ünïcödé and emoji 🙂 work too.",
]


@pytest.fixture(scope="module")
def engines(smollm2_path, tmp_path_factory):
    from cloud_server.config import EngineConfig
    from cloud_server.engine.llm_engine import LLMEngine
    from cloud_server.models.export_hf import gguf_to_hf_folder

    folder = gguf_to_hf_folder(smollm2_path, tmp_path_factory.mktemp("smollm2-hf"))
    # fp32 on both sides: the folder holds the GGUF's weights widened to fp32; quantized, the GGUF
    # keeps its own blocks while the folder's floats are rounded, so they would differ by design
    cfg = dict(max_model_len=256, kv_cache_memory_bytes=16 << 20, quantization="none", dtype="float32")
    yield LLMEngine(EngineConfig(str(smollm2_path), **cfg)), LLMEngine(
        EngineConfig(str(folder), **cfg)), folder
    shutil.rmtree(folder, ignore_errors=True)  # the fp32 weights, half a GB


def test_folder_tokenizer_matches_llamacpp(engines):
    gguf_engine, hf_engine, _ = engines
    for text in TEXTS:
        ids = gguf_engine.tokenizer.encode(text)
        assert hf_engine.tokenizer.encode(text) == ids, text
        assert hf_engine.tokenizer.decode(ids) == gguf_engine.tokenizer.decode(ids)
    msgs = [{"role": "user", "content": "Hi"}]
    assert hf_engine.tokenizer.apply_chat_template(msgs) == gguf_engine.tokenizer.apply_chat_template(
        msgs)
    assert hf_engine.tokenizer.eos_token_ids == gguf_engine.tokenizer.eos_token_ids


def test_folder_model_matches_gguf_model(engines):
    import torch

    from cloud_server.engine.sampling_params import SamplingParams

    gguf_engine, hf_engine, _ = engines
    ids = gguf_engine.tokenizer.encode(TEXTS[3])
    torch.testing.assert_close(hf_engine.score(ids), gguf_engine.score(ids), rtol=1e-4, atol=1e-4)
    params = SamplingParams(temperature=0.0, max_tokens=12)
    assert hf_engine.generate([TEXTS[3]], params)[0].token_ids == gguf_engine.generate(
        [TEXTS[3]], params)[0].token_ids


def test_folder_model_in_int8_rounds_its_floats_to_groups(engines):
    """A folder's float weights are rounded to int8 groups (no GGUF blocks to keep): every matrix
    quantized, logits within cosine 0.99 of the same model in fp32."""
    import torch

    from cloud_server.config import EngineConfig
    from cloud_server.engine.llm_engine import LLMEngine
    from cloud_server.layers.linear import Linear

    _, hf_fp32, folder = engines
    q = LLMEngine(EngineConfig(str(folder), max_model_len=256, kv_cache_memory_bytes=16 << 20,
                               quantization="int8"))
    mats = [m for m in q.runner.model.modules() if isinstance(m, Linear)]
    # int8 with scales (in the engine kernel's format, where it is used, the codes are bytes q + 128)
    assert mats and all(not m.int4 and not m.weight.dtype.is_floating_point and m.scale is not None
                        for m in mats)
    ids = hf_fp32.tokenizer.encode(TEXTS[0])
    cos = torch.nn.functional.cosine_similarity(q.score(ids).float(), hf_fp32.score(ids), dim=-1)
    # torch's per-row int8 (no engine kernels: the groups rounded again to one scale a row) is
    # coarser: 0.967 measured on an AVX2-only CPU
    assert cos.min() > (0.99 if engine_kernels() else 0.95), cos
