"""Engines shared by the model tests: fp32 references of SmolLM2 and Qwen2.5-Coder-0.5B."""

from __future__ import annotations

from pathlib import Path

import pytest


def fp32_engine(path: Path, **overrides):
    from cloud_server.config import EngineConfig
    from cloud_server.engine.llm_engine import LLMEngine

    cfg = dict(max_model_len=512, kv_cache_memory_bytes=64 << 20, quantization="none", dtype="float32")
    return LLMEngine(EngineConfig(str(path), **{**cfg, **overrides}))


@pytest.fixture(scope="session")
def qwen05_path() -> Path:
    from hybridllm.models import pull

    return pull("qwen2.5-coder-0.5b-instruct")


@pytest.fixture(scope="session")
def smollm2_fp32(smollm2_path):
    return fp32_engine(smollm2_path)


@pytest.fixture(scope="session")
def qwen05_fp32(qwen05_path):
    return fp32_engine(qwen05_path)
