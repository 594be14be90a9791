"""The GGUF tokenizer's vocabulary-only llama.cpp load prints nothing misleading at start-up."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.real


def test_vocab_only_load_keeps_stderr_clean(smollm2_path, capfd):
    from cloud_server.models.tokenizer import GGUFTokenizer

    tok = GGUFTokenizer(smollm2_path)
    assert tok.decode(tok.encode("Paris", add_special=False)) == "Paris"
    err = capfd.readouterr().err
    assert "training context overflow" not in err, err
