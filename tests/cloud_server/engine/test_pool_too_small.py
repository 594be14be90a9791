"""A KV pool that cannot hold one sequence of max_model_len is refused when the engine is built,
with what to change: the scheduler itself never refuses a request larger than its pool (it would
wait for blocks that never come), so this check is what keeps such a request from hanging."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.real


def test_a_pool_smaller_than_one_sequence_is_refused_naming_both_settings(smollm2_path) -> None:
    from cloud_server.config import EngineConfig
    from cloud_server.engine.llm_engine import LLMEngine
    from cloud_server.exceptions import ConfigError

    # SmolLM2-135M: 30 layers x 3 KV heads x 64 x 2 (K and V) x 4 bytes = 92 KiB a token in fp32;
    # 16 MiB hold about 180 tokens, less than one 512-token sequence
    cfg = EngineConfig(str(smollm2_path), max_model_len=512, kv_cache_memory_bytes=16 << 20,
                       quantization="none", device="cpu")
    too_small = r"holds \d+ tokens, less than one max_model_len=512 sequence"
    with pytest.raises(ConfigError, match=too_small) as err:
        LLMEngine(cfg)
    assert "--kv-cache-memory-mb" in str(err.value) and "--max-model-len" in str(err.value)
