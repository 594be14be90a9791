"""A KV pool that cannot hold one sequence of max_model_len is refused when the engine is built,
with what to change: the scheduler itself never refuses a request larger than its pool (it would
wait for blocks that never come), so this check is what keeps such a request from hanging. It
runs before the weights are read (it was after the whole load: a minute for a 1.5B model on a
CPU before the operator learned the pool was too small)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.real


def test_a_pool_smaller_than_one_sequence_is_refused_before_the_weights(smollm2_path, monkeypatch) -> None:
    from cloud_server.config import EngineConfig
    from cloud_server.engine.llm_engine import LLMEngine
    from cloud_server.exceptions import ConfigError

    # SmolLM2-135M: 30 layers x 3 KV heads x 64 x 2 (K and V) x 2 bytes = 23 KiB a token in bf16
    # (the CPU default); 8 MiB hold about 350 tokens, less than one 512-token sequence
    cfg = EngineConfig(str(smollm2_path), max_model_len=512, kv_cache_memory_bytes=8 << 20)
    too_small = r"holds \d+ tokens, less than one max_model_len=512 sequence"
    import cloud_server.models.loader as loader

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights were read before the settings were checked")

    monkeypatch.setattr(loader, "iter_gguf_tensors", no_weights, raising=False)
    monkeypatch.setattr("cloud_server.models.loader_gguf.iter_gguf_tensors", no_weights)
    monkeypatch.setattr("cloud_server.models.weight_cache.WeightCache.for_model",
                        classmethod(lambda cls, *a, **k: None))
    with pytest.raises(ConfigError, match=too_small) as err:
        LLMEngine(cfg)
    assert "--kv-cache-memory-mb" in str(err.value) and "--max-model-len" in str(err.value)
