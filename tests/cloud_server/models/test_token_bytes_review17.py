"""A Hugging Face folder's token bytes and BOS, as transformers and OpenAI's logprobs read them.

Token bytes: SentencePiece decoders strip the text's leading space (Llama 2's ``Strip``, the newer
``Metaspace``), so "▁world" decoded alone was "world": the logprob entries' ``token``/``bytes``
joined lost every space. A token is now read as it reads after other text.

BOS: a ``tokenizer_config.json`` without ``add_bos_token`` gave no BOS; transformers (and llama.cpp's
GGUF conversion) take the tokenizer.json's post-processor (Llama 3 prepends <|begin_of_text|>), and
a Llama tokenizer class without one adds BOS (LlamaTokenizerFast's default).

Tiny tokenizers built here with ``tokenizers``; no model, no hub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from cloud_server.api.serving import chat_logprobs, text_logprobs
from cloud_server.engine.logprobs import TokenLogprob
from cloud_server.models.tokenizer import HFTokenizer

TEXT = "hello world, a 日😀 b  c"
WORDS = ["hello", "world", "a", "b", "c", ","]


def _sentencepiece(path: Path, style: str = "strip", post: bool = True, cfg: dict | None = None,
                   words: list[str] = WORDS) -> Path:
    """Llama 2 style (``strip``: Prepend normalizer, Strip decoder) or the newer ``metaspace`` one;
    byte fallback (ids 3..258 are <0x00>..<0xFF>), so 日 and 😀 are byte tokens; ``words`` merged."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    merges = []
    for w in words:  # "▁hello" and "hello" merged from their characters
        for word in ("▁" + w, w):
            for c in word:
                vocab.setdefault(c, len(vocab))
            for i in range(2, len(word) + 1):
                left, right = word[: i - 1], word[i - 1]
                vocab.setdefault(word[:i], len(vocab))
                if (left, right) not in merges:
                    merges.append((left, right))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True,
                               fuse_unk=True))
    if style == "strip":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(prepend_scheme="first",
                                                                                     split=False)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    if post:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", 1)])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    base = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
            "tokenizer_class": "LlamaTokenizerFast"}
    (path / "tokenizer_config.json").write_text(json.dumps({**base, **(cfg or {})}))
    return path


def _byte_level(path: Path, post: str | None, cfg: dict) -> Path:
    """GPT-2 / Llama 3 / Qwen style: byte-level BPE over single bytes; ids 256.. are added tokens.
    ``post``: "bos" a Llama 3 TemplateProcessing, "bytelevel" Qwen's, None no post-processor."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<|begin_of_text|>", "<|eot_id|>")])
    if post == "bos":
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
            special_tokens=[("<|begin_of_text|>", 256)])
    elif post == "bytelevel":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", **cfg}))
    return path


@pytest.mark.parametrize("style", ["strip", "metaspace"])
def test_sentencepiece_token_bytes_keep_their_space(tmp_path, style):
    """Before: b"hello", b"world", ... joined to b"helloworld,a..." (each lone "▁x" lost its space)."""
    tok = HFTokenizer(_sentencepiece(tmp_path, style))
    ids = tok.encode(TEXT, add_special=False)
    pieces = [tok._tok.id_to_token(i) for i in ids]
    assert "▁world" in pieces and "<0xE6>" in pieces  # whole words and byte tokens both
    assert tok.decode(ids) == TEXT
    # the "▁" SentencePiece prepends to a text is its first token's space
    assert b"".join(tok.token_bytes(i) for i in ids) == b" " + TEXT.encode()
    assert tok.token_bytes(tok._tok.token_to_id("▁world")) == b" world"
    assert tok.token_bytes(tok._tok.token_to_id("world")) == b"world"
    assert tok.token_bytes(3 + 0x20) == b" "  # the byte token of a space (was b"": stripped)
    assert [tok.token_bytes(3 + b) for b in "日".encode()] == [bytes([b]) for b in "日".encode()]
    assert tok.token_bytes(1) == b""  # a special token is no text, as decode reads it


def test_sentencepiece_logprob_entries_join_to_the_text(tmp_path):
    """Before: chat ``token``s and ``bytes`` and the legacy ``tokens`` all joined without spaces."""
    tok = HFTokenizer(_sentencepiece(tmp_path))
    ids = tok.encode(TEXT, add_special=False)
    entries = [TokenLogprob(i, -0.5, [(i, -0.5), (tok._tok.token_to_id("▁c"), -2.0)]) for i in ids]
    chat = chat_logprobs(entries, tok.decode, tok.token_bytes)["content"]
    assert b"".join(bytes(e["bytes"]) for e in chat) == b" " + TEXT.encode()
    words = [e["token"] for e in chat if "\ufffd" not in e["token"]]
    assert words[:4] == [" hello", " world", ",", " a"]
    assert all(e["token"] == bytes(e["bytes"]).decode("utf-8", errors="replace") for e in chat)
    assert chat[0]["top_logprobs"][1]["token"] == " c" and chat[0]["top_logprobs"][1]["bytes"] == [32, 99]
    legacy = text_logprobs(entries, tok.decode, tok.token_bytes)
    assert legacy["tokens"][:4] == [" hello", " world", ",", " a"]
    assert "bytes:\\xe6" in legacy["tokens"]
    assert " c" in legacy["top_logprobs"][0]


def test_byte_level_token_bytes_join_to_the_text(tmp_path):
    """(Held before too.) GPT-2 style: every token is its bytes; a part-character is its raw byte."""
    tok = HFTokenizer(_byte_level(tmp_path, "bytelevel", {}))
    ids = tok.encode(TEXT, add_special=False)
    assert b"".join(tok.token_bytes(i) for i in ids) == TEXT.encode()
    chat = chat_logprobs([TokenLogprob(i, -1.0) for i in ids], tok.decode, tok.token_bytes)["content"]
    assert b"".join(bytes(e["bytes"]) for e in chat) == TEXT.encode()


@pytest.mark.parametrize(("post", "cfg", "bos"), [
    ("bos", {}, True),  # Llama 3: its post-processor adds <|begin_of_text|> (was: none)
    ("bos", {"tokenizer_class": "PreTrainedTokenizerFast"}, True),
    ("bytelevel", {}, False),  # Qwen: its post-processor adds nothing
    (None, {}, False),
    ("bos", {"add_bos_token": False}, False),  # the config's key where it names one
    (None, {"add_bos_token": True}, True),
])
def test_byte_level_bos_as_transformers_adds_it(tmp_path, post, cfg, bos):
    tok = HFTokenizer(_byte_level(tmp_path, post, cfg))
    plain = tok.encode("hi", add_special=False)
    assert tok.encode("hi") == ([256] if bos else []) + plain
    assert tok.encode("<|begin_of_text|>hi") == [256, *plain]  # never twice
    assert tok.add_bos is bos


@pytest.mark.parametrize(("post", "cfg", "bos"), [
    (True, {}, True),  # Llama 2 / Mistral files without add_bos_token (was: no BOS)
    (False, {}, True),  # LlamaTokenizerFast's default, no post-processor to ask
    (False, {"tokenizer_class": "PreTrainedTokenizerFast"}, False),
    (True, {"add_bos_token": False}, False),
    (True, {"add_bos_token": True}, True),
])
def test_sentencepiece_bos_as_transformers_adds_it(tmp_path, post, cfg, bos):
    tok = HFTokenizer(_sentencepiece(tmp_path, post=post, cfg=cfg))
    plain = tok.encode("hello", add_special=False)
    assert tok.encode("hello") == ([1] if bos else []) + plain
    if bos:
        assert tok.encode("<s>hello")[:2] != [1, 1]  # never twice


def test_chat_ids_get_one_bos_from_the_post_processor(tmp_path):
    """A Llama 3 chat template writes {{ bos_token }}: one BOS; a template that does not gets it
    prepended, as llama.cpp does with the same model's GGUF (its add_bos_token is true)."""
    for template, name in (("{{ bos_token }}{{ messages[0]['content'] }}", "a"),
                           ("{{ messages[0]['content'] }}", "b")):
        folder = _byte_level(tmp_path / name, "bos", {"chat_template": template})
        tok = HFTokenizer(folder)
        ids = tok.encode_chat([{"role": "user", "content": "hi"}])
        assert ids == [256, *tok.encode("hi", add_special=False)]


def test_wordpiece_token_bytes_keep_the_space_between_words(tmp_path):
    """No served model uses WordPiece, but its decoder joins words with a space alone too: a word
    reads " walk" after other text, a "##ing" piece "ing" (before: b"walk", spaces lost)."""
    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "##ing": 3, "walk": 4, ",": 5, "a": 6}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.save(str(tmp_path / "tokenizer.json"))
    hf = HFTokenizer(tmp_path)
    ids = hf.encode("hello walking, world")
    assert b"".join(hf.token_bytes(i) for i in ids) == b" hello walking, world"
