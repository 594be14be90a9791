"""A token id's own bytes (``token_bytes``), which the server's logprobs entries report: a token
that is only part of a UTF-8 character decodes alone to U+FFFD, but its bytes are the real ones.
Checked on llama.cpp's vocabulary of SmolLM2's GGUF, on a ``tokenizer.json`` exported from it (byte-level
BPE, read back through the byte alphabet), and on a SentencePiece-style vocabulary with ``<0xNN>``
byte tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.real

TEXT = "café naïve 日本語 😀 — ok"


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path, tmp_path_factory):
    from cloud_server.models.export_hf import write_tokenizer
    from cloud_server.models.tokenizer import GGUFTokenizer, HFTokenizer

    folder = write_tokenizer(smollm2_path, tmp_path_factory.mktemp("hf"))  # its tokenizer.json alone
    return GGUFTokenizer(smollm2_path), HFTokenizer(folder)


def test_bytes_of_a_text_split_mid_character_rebuild_it(smollm2) -> None:
    for tok in smollm2:
        ids = tok.encode(TEXT, add_special=False)
        assert any(tok.decode([i]) == "\ufffd" for i in ids), type(tok)  # some ids are part-characters
        assert b"".join(tok.token_bytes(i) for i in ids) == TEXT.encode("utf-8"), type(tok)


def test_both_smollm2_tokenizers_agree_on_every_part_character_token(smollm2) -> None:
    gguf, hf = smollm2
    part = [i for i in range(gguf.vocab_size) if "\ufffd" in gguf.decode([i])]
    assert len(part) > 200  # the byte-level vocabulary's lone bytes and other part-characters
    for i in part:
        assert hf.token_bytes(i) == gguf.token_bytes(i), i
    # all but the vocabulary's own U+FFFD tokens are bytes that are no whole character
    assert sum(gguf.token_bytes(i) != "\ufffd".encode() for i in part) > 200
    for i in range(0, gguf.vocab_size, 97):  # whole-character tokens: their text's bytes
        if i not in part:
            assert hf.token_bytes(i) == hf.decode([i]).encode("utf-8")


def test_sentencepiece_byte_tokens(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models

    from cloud_server.models.tokenizer import HFTokenizer

    vocab = {"<unk>": 0, "▁a": 1, **{f"<0x{b:02X}>": 2 + b for b in range(256)}}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<unk>"}))
    hf = HFTokenizer(tmp_path)
    ids = [2 + b for b in "日".encode()]
    assert hf.decode(ids) == "日" and hf.decode(ids[:1]) == "\ufffd"
    assert [hf.token_bytes(i) for i in ids] == [bytes([b]) for b in "日".encode()]
    assert hf.token_bytes(1) == b" a"


def test_tokens_longer_than_32_bytes_keep_their_text(smollm2) -> None:
    """Before: llama-cpp-python's detokenize reads a token into 32 bytes and dropped a longer one
    whole, so an answer lost its runs of spaces or dashes (SmolLM2: 47 tokens) on the GGUF."""
    gguf, hf = smollm2
    long = [i for i in range(hf.vocab_size) if len(hf.decode([i]).encode("utf-8")) > 32]
    assert len(long) >= 40
    for i in long:
        assert gguf.decode([i]) == hf.decode([i]) and gguf.token_bytes(i) == hf.token_bytes(i), i
    ids = [*gguf.encode("def f():", add_special=False), long[0], *gguf.encode("return 1", add_special=False)]
    assert gguf.decode(ids) == hf.decode(ids)
