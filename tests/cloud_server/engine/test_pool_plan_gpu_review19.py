"""The target's own KV pool on a GPU is checked against the free memory (review 19), no model.

``--kv-cache-memory-mb`` larger than what the weights leave free on the GPU was checked for the
draft model's pool (review 18) but not for the target's: the engine went on to allocate it and the
start-up ended in a CUDA out-of-memory traceback. It is a ConfigError now, before the allocation.
CPU only: the device is faked and ``torch.cuda.mem_get_info`` patched where it is looked up.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import cloud_server.engine.llm_engine as llm_engine
import cloud_server.engine.model_runner as model_runner
import cloud_server.models.loader as loader
from cloud_server.config import EngineConfig
from cloud_server.exceptions import ConfigError


class _Cfg:
    vocab_size = 64
    max_position_embeddings = 256

    def kv_bytes_per_token(self, dtype_bytes):
        return 2048


class _NoAlloc:
    def __init__(self, *args, **kwargs):
        raise AssertionError("the KV pool was allocated")


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(llm_engine, "_resolve_device",
                        lambda config: (torch.device("cuda"), torch.bfloat16, "none"))
    monkeypatch.setattr(loader, "load_model",
                        lambda name, **kw: SimpleNamespace(model=object(), config=_Cfg(),
                                                           tokenizer=object(), name=name))
    monkeypatch.setattr(model_runner, "ModelRunner", _NoAlloc)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (100 << 20, 80 << 30))


def test_a_target_pool_larger_than_the_free_gpu_memory_is_a_config_error(fake_gpu):
    cfg = EngineConfig(model="t", kv_cache_memory_bytes=4096 << 20)
    with pytest.raises(ConfigError, match=r"KV pool .*needs 4096 MiB.*100 MiB free.*--kv-cache-memory-mb"):
        llm_engine.LLMEngine(cfg)


def test_a_pool_that_fits_goes_on_to_the_allocation(fake_gpu):
    cfg = EngineConfig(model="t", kv_cache_memory_bytes=64 << 20)
    with pytest.raises(AssertionError, match="allocated"):
        llm_engine.LLMEngine(cfg)


def test_kv_budget_rules():
    from cloud_server.engine.pool_plan import _CPU_KV_BYTES, kv_budget

    assert kv_budget(EngineConfig(model="t", kv_cache_memory_bytes=8 << 30), torch.device("cpu")) == 8 << 30
    assert kv_budget(EngineConfig(model="t"), torch.device("cpu")) == _CPU_KV_BYTES
