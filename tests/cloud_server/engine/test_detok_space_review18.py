"""An answer's text is what its tokens add after the prompt: a SentencePiece decoder (Llama 2's
``Strip``, the newer ``Metaspace``) strips the leading space of a text's start only, so the first
answer token "▁Paris" after "The capital of France is" is " Paris" (prompt + text is the decode of
prompt + answer, as vLLM and transformers' pipelines read it). Decoded alone it was "Paris", and
the logprobs' text offsets counted from that. Byte-level BPE (Qwen, SmolLM2) is unchanged.

The real engine code (scheduler, detokenizer, stops) around a scripted fake model, with tiny
tokenizers built here by ``tokenizers``; no model, no hub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from cloud_server.engine.logprobs import text_offset
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.models.tokenizer import HFTokenizer
from tests.cloud_server.models.test_token_bytes_review17 import _sentencepiece as sentencepiece_folder

from .test_fuzz_fake_batching8 import KVFakeRunner, make_engine

WORDS = ["The", "capital", "of", "France", "is", "Paris", "nice", "."]
PROMPT = "The capital of France is"


def _sentencepiece(path: Path, style: str) -> Path:
    """Llama 2 style (``strip``) or ``metaspace``; byte fallback (<0x00>.. are ids 3..258)."""
    return sentencepiece_folder(path, style, post=False, cfg={"add_bos_token": True}, words=WORDS)


def _byte_level(path: Path) -> Path:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges: list[tuple[str, str]] = []
    for w in WORDS:
        word = "Ġ" + w
        for i in range(2, len(word) + 1):
            vocab.setdefault(word[:i], len(vocab))
            merges.append((word[: i - 1], word[i - 1]))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return path


@pytest.fixture(params=["strip", "metaspace", "bytelevel"])
def tok(request, tmp_path) -> HFTokenizer:
    if request.param == "bytelevel":
        return HFTokenizer(_byte_level(tmp_path / "bl"))
    return HFTokenizer(_sentencepiece(tmp_path / "sp", request.param))


def _run(tok: HFTokenizer, prompt: list[int], answer: list[int], stop: list[str] | None = None):
    """The engine's deltas for a model that writes ``answer`` after ``prompt``."""
    eng = make_engine(16)
    eng.tokenizer = tok
    eng.model_config.vocab_size = tok.vocab_size
    eng.runner = KVFakeRunner(lambda: eng.block_manager, 16,
                              predict=lambda read: answer[len(read) - len(prompt)], check_shared=False)
    eng.add_request("r", prompt, SamplingParams(temperature=0, max_tokens=len(answer), stop=stop or [],
                                                 ignore_eos=True))
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    return outs


def _answer(tok: HFTokenizer, text: str) -> list[int]:
    """The ids of " " + ``text``: its first token starts with the space marker."""
    ids = tok._tok.encode(text if tok.add_bos else " " + text, add_special_tokens=False).ids
    assert tok._tok.id_to_token(ids[0])[0] in "▁Ġ"  # SentencePiece prepends it
    return ids


def test_the_first_answer_token_keeps_its_space(tok):
    prompt = tok.encode(PROMPT)
    answer = _answer(tok, "Paris is nice.")
    outs = _run(tok, prompt, answer)
    text = "".join(o.delta_text for o in outs)
    assert text == " Paris is nice."
    assert tok.decode(prompt) + text == tok.decode(prompt + answer)
    # every delta, the first included, is that text's; the offsets point into it
    assert outs[0].delta_text.startswith(" ")
    starts = [text_offset(tok.decode_continuation, answer, i) for i in range(len(answer))]
    assert [text[s:e] for s, e in zip(starts, [*starts[1:], len(text)], strict=True)] == [
        tok.token_bytes(t).decode() for t in answer]


def test_a_stop_string_at_the_answers_start_sees_the_space(tok):
    prompt = tok.encode(PROMPT)
    answer = _answer(tok, "Paris is nice.")
    outs = _run(tok, prompt, answer, stop=[" Paris is"])
    assert "".join(o.delta_text for o in outs) == "" and outs[-1].finish_reason == "stop"


def test_split_characters_after_the_prompt_stream_whole(tmp_path):
    tok = HFTokenizer(_sentencepiece(tmp_path / "sp", "strip"))
    prompt = tok.encode(PROMPT)
    answer = _answer(tok, "Paris 日😀.")  # 日 and 😀 are byte tokens
    outs = _run(tok, prompt, answer)
    assert [o.delta_text for o in outs if "\ufffd" in o.delta_text] == []
    assert "".join(o.delta_text for o in outs) == " Paris 日😀."
