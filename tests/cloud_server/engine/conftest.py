"""One SmolLM2 engine shared by the real-model engine tests (loading takes seconds)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_path):
    from cloud_server.config import EngineConfig
    from cloud_server.engine.llm_engine import LLMEngine

    return LLMEngine(
        EngineConfig(str(smollm2_path), max_model_len=512, kv_cache_memory_bytes=128 << 20)
    )
