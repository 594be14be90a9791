"""The detokenizer decodes each step's new ids only (a few ids before them for context), not the
whole answer again: a 4,000-token answer spent 45 s of the engine thread re-decoding itself
(SmolLM2's tokenizer), growing with the square of its length. Counted here in ids handed to the
tokenizer, with the text checked against the one-shot decode (byte tokens, the tiny SentencePiece
and byte-level tokenizers of test_detok_space_review18, a decoder that reads the whole answer)."""

from __future__ import annotations

import random

import pytest

from cloud_server.engine.detokenizer import IncrementalDetokenizer
from cloud_server.engine.sampling_params import SamplingParams

from .test_detok_space_review18 import _byte_level, _sentencepiece
from .test_fuzz_fake_batching8 import EOS, make_engine


class Counting:
    """A decode that counts the ids it is given."""

    def __init__(self, decode) -> None:
        self.decode = decode
        self.ids = 0

    def __call__(self, ids: list[int]) -> str:
        self.ids += len(ids)
        return self.decode(ids)


def lossy(ids: list[int]) -> str:  # one byte a token, as ``tokenizers`` decodes byte tokens
    return bytes(ids).decode("utf-8", errors="replace")


def _stream(d: IncrementalDetokenizer, ids: list[int], rng: random.Random) -> str:
    """Feed ``ids`` 1-5 at a time, as steps with accepted drafts do; returns the joined deltas."""
    sent, n = "", 0
    while n < len(ids):
        n = min(len(ids), n + rng.randint(1, 5))
        sent += d.update(ids[:n], final=n == len(ids))
    return sent


def test_a_long_answer_decodes_each_id_a_few_times_not_once_per_step():
    text = ("Grüße, 数字 and 😀 emoji; plain words too. " * 80)[:3000]
    ids = list(text.encode())
    decode = Counting(lossy)
    d = IncrementalDetokenizer(decode, ["never here"])
    assert _stream(d, ids, random.Random(0)) == d.text == text
    assert decode.ids <= 16 * len(ids)  # the whole answer each step: ~n * n / 6 ids


@pytest.mark.parametrize("style", ["strip", "metaspace", "bytelevel"])
def test_the_streamed_text_is_the_one_shot_decode_for_real_tokenizers(style, tmp_path):
    from cloud_server.models.tokenizer import HFTokenizer

    folder = _byte_level(tmp_path / "bl") if style == "bytelevel" else _sentencepiece(tmp_path / "sp", style)
    tok = HFTokenizer(folder)
    rng = random.Random(style)
    for _ in range(30):
        # words, the byte tokens of characters split over ids, stray bytes and special ids
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 60))]
        full = tok.decode_continuation(ids)
        d = IncrementalDetokenizer(tok.decode_continuation, [])
        for n in range(1, len(ids) + 1):
            d.update(ids[:n])
            assert d.text.rstrip("\ufffd") == tok.decode_continuation(ids[:n]).rstrip("\ufffd")
        # (joined deltas may differ from it here: a byte-fallback group that turns invalid with
        # its next byte re-reads its earlier bytes, already sent, as U+FFFD; so it was before)
        d2 = IncrementalDetokenizer(tok.decode_continuation, [])
        _stream(d2, ids, rng)
        assert d2.text.rstrip("\ufffd") == full.rstrip("\ufffd")


@pytest.mark.parametrize("style", ["strip", "metaspace", "bytelevel"])
def test_characters_split_over_byte_ids_stream_as_the_one_shot_text(style, tmp_path):
    """CJK and emoji outside the tiny vocabularies are byte ids; a byte-fallback decoder reads a
    run of them as U+FFFD each while its last character is incomplete, the context's ids too."""
    from cloud_server.models.tokenizer import HFTokenizer

    folder = _byte_level(tmp_path / "bl") if style == "bytelevel" else _sentencepiece(tmp_path / "sp", style)
    tok = HFTokenizer(folder)
    text = " The capital 数字😀 of Überprüfung France. 字数字, Paris 😀😀 is nice." * 3
    ids = tok.encode(text)
    full = tok.decode_continuation(ids)
    for stop in ([], ["Par"], ["字,"]):
        d = IncrementalDetokenizer(tok.decode_continuation, stop)
        sent = _stream(d, ids, random.Random(len(stop)))
        want = full[: full.find(stop[0])] if stop else full
        assert sent == d.text == want and "\ufffd" not in sent


def test_a_decoder_that_reads_the_whole_answer_still_gets_its_one_shot_text():
    """Where the new ids' text does not begin with their context's (id 0 upper-cases the whole
    text here), the whole answer is decoded, as before."""

    def shouting(ids: list[int]) -> str:
        text = "".join(chr(ord("a") + i % 26) for i in ids)
        return text.upper() if 0 in ids else text

    ids = [5, 6, 7, 8, 9, 10, 11, 12, 13, 0, 14, 15]
    d = IncrementalDetokenizer(shouting, [])
    sent = "".join(d.update(ids[:n]) for n in range(1, len(ids) + 1))
    assert sent == "fghijklmn" + "AOP"  # the first nine went out before the 0 came
    assert d.text == shouting(ids)


def test_the_engine_decodes_a_long_answer_in_linear_time():
    eng = make_engine(400)
    eng.max_model_len = eng.spec.max_model_len = 1600
    decode = Counting(eng.tokenizer.decode)
    eng.tokenizer.decode = decode
    (res,) = eng.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True,
                                                     stop=["zzz"]))
    assert len(res.token_ids) == 1500 and res.finish_reason == "length"
    assert res.text == "".join(chr(ord("a") + i) for i in res.token_ids)
    assert EOS in res.token_ids  # ignored, as asked
    assert decode.ids <= 20 * 1500
