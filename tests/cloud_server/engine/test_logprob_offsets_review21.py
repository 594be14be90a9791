"""The logprobs' text offsets are read token after token from a checkpoint (``TextOffsets``), not
by decoding the whole answer before each token: a request with ``logprobs`` cost the square of
its answer's length in the engine thread (a 4,000-token answer: tens of seconds of decoding).

Counted in ids handed to the tokenizer (not time); the offsets are checked against the one-shot
rule (``_one_shot`` below: the function the engine called before, unchanged) on thousands of
random id streams through byte decoders and the tiny SentencePiece and byte-level tokenizers."""

from __future__ import annotations

import random

import pytest
import torch

from cloud_server.engine.logprobs import TextOffsets
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.models.tokenizer import HFTokenizer

from .test_detok_linear_review21 import Counting
from .test_detok_offsets_review17 import lossy, per_byte
from .test_detok_space_review18 import _byte_level, _sentencepiece
from .test_fuzz_fake_batching8 import KVFakeRunner, make_engine


def _one_shot(decode, output_ids: list[int], index: int) -> int:
    """The offset as the engine computed it before, decoding the whole text before the token."""
    if not index:
        return 0
    before = decode(output_ids[:index])
    complete = len(before.rstrip("\ufffd"))
    if complete == len(before):
        return complete
    after = decode(output_ids[: index + 1])
    end = min(len(before), len(after.rstrip("\ufffd")))
    while complete < end and before[complete] == after[complete]:
        complete += 1
    return complete


TEXTS = ["数字", "😀", "Überprüfung", " Paris", " is", " nice", ".", " The capital", "é", "€", " ", "  "]


def _ids(rng: random.Random, encode, vocab: int, byte_ids: range, sep: list[int] | None = None) -> list[int]:
    """Words and split characters (encoded), stray byte ids and any id (special ones too);
    ``sep`` after each stray or any id (``_encoder``'s ``one_char_runs``)."""
    ids: list[int] = []
    for _ in range(rng.randint(1, 12)):
        kind = rng.random()
        if kind < 0.5:
            ids += encode("".join(rng.choice(TEXTS) for _ in range(rng.randint(1, 4))))
        elif kind < 0.7:
            ids += [rng.choice(byte_ids), *(sep or [])]
        else:
            ids += [rng.randrange(vocab), *(sep or [])]
    return ids


def _check_stream(decode, ids: list[int], rng: random.Random) -> None:
    """Offsets asked as the engine asks them: in order, each step seeing the ids up to its end."""
    offsets = TextOffsets(decode)
    index = 0
    while index < len(ids):
        step_end = min(len(ids), index + rng.randint(1, 5))
        seen = ids[:step_end]
        for i in range(index, step_end):
            assert offsets.offset(seen, i) == _one_shot(decode, ids, i), (ids, i)
        index = step_end


def _tokenizer(style: str, tmp_path) -> HFTokenizer:
    if style == "bytelevel":
        return HFTokenizer(_byte_level(tmp_path / "bl"))
    return HFTokenizer(_sentencepiece(tmp_path / "sp", style))


def _encoder(tok: HFTokenizer, one_char_runs: bool):
    """``one_char_runs``: a word token after each character, so no run of byte ids holds two."""
    word = tok._tok.token_to_id("▁of")

    def encode(text: str) -> list[int]:
        if not one_char_runs:
            return tok._tok.encode(text, add_special_tokens=False).ids
        return [i for c in text for i in [*tok._tok.encode(c, add_special_tokens=False).ids, word]]

    return encode


def test_offsets_are_the_one_shot_ones_for_a_byte_level_tokenizer(tmp_path):
    tok = _tokenizer("bytelevel", tmp_path)
    rng = random.Random(1)
    for _ in range(700):
        ids = _ids(rng, _encoder(tok, False), tok.vocab_size, range(256))
        _check_stream(tok.decode_continuation, ids, rng)


@pytest.mark.parametrize("style", ["strip", "metaspace"])
def test_offsets_are_the_one_shot_ones_for_sentencepiece(style, tmp_path):
    """Byte fallback: the one-shot rule read a run of byte ids that ends inside a character as
    U+FFFD each, whole characters included (below); here each run holds one character (or one
    stray byte) at most: a word token after each."""
    tok = _tokenizer(style, tmp_path)
    rng = random.Random(style)
    sep = [tok._tok.token_to_id("▁of")]
    for _ in range(350):
        ids = _ids(rng, _encoder(tok, True), tok.vocab_size, range(3, 259), sep)
        _check_stream(tok.decode_continuation, ids, rng)


@pytest.mark.parametrize("style", ["strip", "metaspace", "bytelevel"])
def test_each_byte_of_a_split_character_points_at_that_character(style, tmp_path):
    """SentencePiece's byte-fallback run "数字😀": the 2nd and 3rd byte of 字 and the last three of
    😀 pointed at 数 (offset 4, before 字's 5 and 😀's 6): the text before them, decoded in one
    piece, read the whole run as U+FFFD. Now they read as the byte-level tokenizer's do."""
    tok = _tokenizer(style, tmp_path)
    ids = tok._tok.encode(" ab 数字😀 c", add_special_tokens=False).ids
    offsets = TextOffsets(tok.decode_continuation)
    got = [offsets.offset(ids, i) for i in range(len(ids))]
    at = tok.decode_continuation(ids).index("数字😀 c")
    # the run's 10 byte ids, then "▁c"
    assert got[-11:] == [at + d for d in [0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 3]]


@pytest.mark.parametrize("style", ["strip", "metaspace"])
def test_sentencepiece_offsets_never_go_back_and_stay_in_the_text(style, tmp_path):
    tok = _tokenizer(style, tmp_path)
    rng = random.Random(style + "mixed")
    for _ in range(300):
        ids = _ids(rng, _encoder(tok, False), tok.vocab_size, range(3, 259))
        offsets = TextOffsets(tok.decode_continuation)
        got = [offsets.offset(ids, i) for i in range(len(ids))]
        assert got == sorted(got) and got[-1] <= len(tok.decode_continuation(ids)), ids


@pytest.mark.parametrize("decode", [lossy, per_byte])
def test_offsets_are_the_one_shot_ones_for_byte_tokens(decode):
    rng = random.Random(decode.__name__)
    for _ in range(700):
        _check_stream(decode, _ids(rng, lambda t: list(t.encode()), 256, range(128, 256)), rng)


def test_a_long_run_of_split_characters_is_decoded_a_few_times_per_id():
    """Four-byte emoji in a row, a byte id each: a six-id context starts inside one, so another
    length is tried; the checkpoint still follows the text."""
    ids = list(("😀" * 600 + "a b 数字" * 100).encode())
    for decode in (lossy, per_byte):
        counting = Counting(decode)
        offsets = TextOffsets(counting)
        got = [offsets.offset(ids, i) for i in range(len(ids))]
        assert got[:9] == [0, 0, 0, 0, 1, 1, 1, 1, 2]
        assert got[-1] == len(decode(ids[:-1]).rstrip("\ufffd"))  # the last 字's last byte
        assert counting.ids <= 60 * len(ids)


def _with_rows(runner: KVFakeRunner, eng) -> KVFakeRunner:
    """The fake model also returns raw log-probability rows for the sequences that ask."""
    execute = runner.execute

    def with_rows(scheduled, **kw):
        result = execute(scheduled, **kw)
        result.logprobs = {
            s.seq.seq_id: torch.zeros(len(out), eng.model_config.vocab_size).log_softmax(-1)
            for s in scheduled
            if s.seq.params.logprobs is not None and isinstance(out := result.tokens.get(s.seq.seq_id), list)
        }
        return result

    runner.execute = with_rows  # type: ignore[method-assign]
    return runner


def test_the_engine_computes_a_long_answers_offsets_in_linear_time():
    eng = make_engine(400)
    eng.max_model_len = eng.spec.max_model_len = 1600
    _with_rows(eng.runner, eng)
    decode = Counting(eng.tokenizer.decode)
    eng.tokenizer.decode = decode
    (res,) = eng.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True,
                                                     logprobs=2))
    assert len(res.token_ids) == len(res.logprobs) == 1500
    assert [e.text_offset for e in res.logprobs] == list(range(1500))  # one letter a token
    assert decode.ids <= 40 * 1500  # the text before each token, decoded again: 1,100,000 ids


@pytest.mark.parametrize("style", ["strip", "metaspace", "bytelevel"])
def test_the_engine_offsets_of_split_characters_and_a_cut_stop(style, tmp_path):
    """A SentencePiece or byte-level answer with characters split over byte ids, run through the
    engine (each step's logprob rows), with a stop string ending inside a token: the entries are
    those of the tokens whose text starts before the cut, at the one-shot offsets."""
    tok = _tokenizer(style, tmp_path)
    text = " The capital 数字😀 of Überprüfung France. 字数字, Paris 😀😀 is nice." * 8
    answer = tok._tok.encode(text, add_special_tokens=False).ids
    for stop in ([], ["ris 😀"]):
        eng = make_engine(200)
        eng.max_model_len = eng.spec.max_model_len = 800
        eng.tokenizer = tok
        eng.model_config.vocab_size = tok.vocab_size
        eng.runner = _with_rows(KVFakeRunner(lambda eng=eng: eng.block_manager, 200,
                                             predict=lambda read: answer[len(read) - 1], check_shared=False),
                                eng)
        (res,) = eng.generate([[1]], SamplingParams(temperature=0, max_tokens=len(answer), stop=stop,
                                                     ignore_eos=True, logprobs=1))
        full = tok.decode_continuation(answer)
        assert res.text == (full[: full.find(stop[0])] if stop else full)
        # byte-level: the one-shot offsets; SentencePiece's differ in its byte runs (above)
        alone = TextOffsets(tok.decode_continuation)
        want = [_one_shot(tok.decode_continuation, res.token_ids, i) if style == "bytelevel"
                else alone.offset(res.token_ids, i) for i in range(len(res.token_ids))]
        kept = [i for i, o in enumerate(want) if o < len(res.text)] if stop else list(range(len(want)))
        assert [e.text_offset for e in res.logprobs] == [want[i] for i in kept]
        assert [e.token_id for e in res.logprobs] == [res.token_ids[i] for i in kept]
