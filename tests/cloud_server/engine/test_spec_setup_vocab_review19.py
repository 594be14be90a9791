"""The draft/target tokenizer check reads the tokenizers, not the padded embeddings (review 19).

Qwen-style checkpoints pad the embedding matrix past the tokenizer's ids (151,936 rows for 151,665
ids), differently by model size (152,064). A draft of the same tokenizer padded otherwise was
refused as "a vocabulary of 152064 tokens, the target's has 151936". The tokenizers' ids and
pieces are compared now; a real mismatch is still refused with a one-line ConfigError, and a draft
padded wider than the target proposes only ids the target's embedding has. No model, no torch
tensors: fake configs and tokenizers.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import cloud_server.engine.model_runner as model_runner
import cloud_server.models.loader as loader
from cloud_server.config import EngineConfig
from cloud_server.engine.spec_setup import SpecSetupMixin, _check_same_tokenizer
from cloud_server.exceptions import ConfigError

N_IDS = 151_665  # Qwen2.5's tokenizer, added tokens included


class _Tok:
    def __init__(self, vocab_size=N_IDS, shift=0, eos=(151_643,)):
        self.vocab_size = vocab_size
        self.shift = shift
        self.eos_token_ids = list(eos)

    def encode(self, text, add_special=True):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(f"<{i + (self.shift if i > 1000 else 0)}>" for i in ids)


def _cfg(rows):
    return SimpleNamespace(vocab_size=rows, max_position_embeddings=4096,
                           kv_bytes_per_token=lambda dtype_bytes: 1024)


class _Engine(SpecSetupMixin):
    def __init__(self, **config):
        self.config = EngineConfig(model="t", speculative_method="draft", draft_model="d",
                                   block_size=16, **config)
        self.tokenizer = _Tok()
        self.model_config = _cfg(151_936)
        self.max_model_len = 256
        self.device = torch.device("cpu")
        self.dtype = torch.bfloat16
        self.quantization = "none"


def _draft(rows, tok):
    return SimpleNamespace(model=object(), config=_cfg(rows), tokenizer=tok, name="d")


def test_a_draft_padded_differently_with_the_same_tokenizer_is_accepted():
    _check_same_tokenizer(_Engine(), _draft(152_064, _Tok()))  # no error
    _check_same_tokenizer(_Engine(), _draft(151_665, _Tok()))  # unpadded: no error either


@pytest.mark.parametrize(("tok", "what"), [
    (_Tok(vocab_size=N_IDS + 3), "vocabulary of 151668 tokens, the target's has 151665"),
    (_Tok(shift=1), "a different tokenizer"),  # same size, other pieces
    (_Tok(eos=(2,)), "a different tokenizer"),
])
def test_a_real_mismatch_is_still_refused(tok, what):
    with pytest.raises(ConfigError, match=f"draft model 'd' has {what}; speculative decoding"):
        _check_same_tokenizer(_Engine(), _draft(151_936, tok))


class _Stop(Exception):
    pass


@pytest.mark.parametrize(("setting", "expected"), [(0, 151_936), (None, 32_768), (200_000, 151_936)])
def test_a_wider_draft_proposes_only_ids_the_target_has(monkeypatch, setting, expected):
    seen = {}

    def runner(*args, **kwargs):
        seen.update(kwargs)
        raise _Stop

    monkeypatch.setattr(loader, "load_model", lambda name, **kw: _draft(152_064, _Tok()))
    monkeypatch.setattr(model_runner, "ModelRunner", runner)
    with pytest.raises(_Stop):
        _Engine(draft_vocab_size=setting)._make_spec_decoder(10)
    assert seen["vocab_limit"] == expected
