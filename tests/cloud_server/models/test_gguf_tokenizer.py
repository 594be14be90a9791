"""The GGUF tokenizer's vocabulary-only llama.cpp load prints nothing misleading at start-up."""

from __future__ import annotations

import sys

import pytest

pytestmark = pytest.mark.real


def test_vocab_only_load_keeps_stderr_clean(smollm2_path, capfd):
    from cloud_server.models.tokenizer import GGUFTokenizer

    tok = GGUFTokenizer(smollm2_path)
    assert tok.decode(tok.encode("Paris", add_special=False)) == "Paris"
    err = capfd.readouterr().err
    assert "training context overflow" not in err, err


def test_other_lines_still_reach_stderr(capfd):
    from cloud_server.models.tokenizer import _without_vocab_only_warning

    with _without_vocab_only_warning():
        print("llama_context: n_ctx_seq (512) > n_ctx_train (0) -- possible training context overflow",
              file=sys.stderr)
        print("llama_model_load: error loading model", file=sys.stderr)
    err = capfd.readouterr().err
    assert err == "llama_model_load: error loading model\n"
