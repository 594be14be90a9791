"""The draft model's KV pool on a GPU is checked against the free memory (review 18), no model.

With ``--speculative-method draft`` the draft keeps a KV pool of its own beside the target's (as
many blocks, at its own bytes a token), beyond ``--kv-cache-memory-mb`` (README). On a CPU the
command line compares both pools with the machine's memory; on a GPU nothing did, so a pool the
device could not hold ended the start-up in a CUDA out-of-memory traceback. It is refused now with
a ConfigError (one line at the server's start) before the draft's pool is allocated.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import cloud_server.models.loader as loader
from cloud_server.config import EngineConfig
from cloud_server.engine.spec_setup import SpecSetupMixin
from cloud_server.exceptions import ConfigError


class _Tok:
    eos_token_ids = [2]

    def encode(self, text):
        return [ord(c) % 64 for c in text]

    def decode(self, ids):
        return "".join(chr(65 + i % 26) for i in ids)


class _Cfg:
    vocab_size = 64
    num_layers, num_kv_heads, head_dim = 4, 2, 64  # 2 KiB a token in bf16

    def kv_bytes_per_token(self, dtype_bytes):
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


class _Engine(SpecSetupMixin):
    def __init__(self):
        self.config = EngineConfig(model="t", speculative_method="draft", draft_model="d",
                                   block_size=16)
        self.tokenizer = _Tok()
        self.model_config = _Cfg()
        self.max_model_len = 256
        self.device = torch.device("cuda")  # never touched: the check comes before any tensor
        self.dtype = torch.bfloat16
        self.quantization = "none"


def _fake_load(name, **kwargs):
    return SimpleNamespace(model=object(), config=_Cfg(), tokenizer=_Tok(), name=name)


def test_a_draft_pool_larger_than_the_free_gpu_memory_is_a_config_error(monkeypatch):
    monkeypatch.setattr(loader, "load_model", _fake_load)
    # 1000 blocks x 16 tokens x 2 KiB = 31 MiB of draft pool; 8 MiB free
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (8 << 20, 80 << 30))
    with pytest.raises(ConfigError, match="draft model's KV pool needs 31 MiB.*8 MiB free"):
        _Engine()._make_spec_decoder(1000)


def test_the_check_passes_a_pool_that_fits(monkeypatch):
    from cloud_server.engine import spec_setup

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (64 << 20, 80 << 30))
    eng = _Engine()
    spec_setup._check_draft_pool(eng.config, eng.device, eng.dtype, 1000, _Cfg())  # no error
    spec_setup._check_draft_pool(eng.config, torch.device("cpu"), eng.dtype, 10**9, _Cfg())
