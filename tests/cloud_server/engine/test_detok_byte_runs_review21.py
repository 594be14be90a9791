"""A SentencePiece byte-fallback answer (CJK, emoji: byte ids) is detokenized in linear time: each
step between two whole characters decoded the whole run of byte ids again (the short decode read
U+FFFD, so the whole answer was decoded: 158 ids a token at 445 tokens, 598 at 1,765). Such a step
sends nothing and completes no stop string, so it is not decoded now; what is sent is unchanged,
checked against a detokenizer that decodes the whole answer every step on random id streams
(bytes that turn a run invalid, stop strings held back, one with U+FFFD, special ids)."""

from __future__ import annotations

import random

import pytest

from cloud_server.engine.detokenizer import IncrementalDetokenizer
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.models.tokenizer import HFTokenizer

from .test_detok_linear_review21 import Counting
from .test_detok_offsets_review17 import lossy
from .test_detok_space_review18 import _byte_level, _sentencepiece
from .test_fuzz_fake_batching8 import KVFakeRunner, make_engine


class WholeDecode(IncrementalDetokenizer):
    """The reference: the whole answer decoded at every step (no checkpoint)."""

    def _decode_all(self, output_ids: list[int], **_: object) -> str:
        return self._decode(list(output_ids))


def _tok(style: str, tmp_path) -> HFTokenizer:
    if style == "bytelevel":
        return HFTokenizer(_byte_level(tmp_path / "bl"))
    return HFTokenizer(_sentencepiece(tmp_path / "sp", style))


def _enc(tok: HFTokenizer, text: str) -> list[int]:
    """The ids of ``text`` as an answer reads them (SentencePiece prepends a lone "▁": dropped)."""
    ids = tok._tok.encode(text, add_special_tokens=False).ids
    return ids[1:] if tok._tok.id_to_token(ids[0]) == "▁" else ids


def _ids(rng: random.Random, tok: HFTokenizer) -> list[int]:
    """Runs of split characters, stray bytes and special ids among them, words; cut anywhere."""
    pool = ["数", "字", "😀", "é", "€", "日", " of", " Paris", ".", " "]
    byte_ids = range(3, 259) if "<0x00>" in tok._tok.get_vocab() else range(256)
    ids: list[int] = []
    for _ in range(rng.randint(1, 6)):
        kind = rng.random()
        if kind < 0.6:
            chars = pool[:6] if rng.random() < 0.7 else pool  # mostly split characters
            text = "".join(rng.choice(chars) for _ in range(rng.randint(1, 30)))
            ids += tok._tok.encode(text, add_special_tokens=False).ids
        elif kind < 0.8:
            ids += [rng.choice(byte_ids) for _ in range(rng.randint(1, 3))]
        else:
            ids += [rng.randrange(tok.vocab_size)]
    return ids[: rng.randint(1, len(ids))] if rng.random() < 0.5 else ids


def _stops(rng: random.Random, text: str) -> list[str]:
    i = rng.randrange(len(text) + 1)
    return rng.choice([[], ["zzzz"], ["\ufffd", "zz"], [text[i : i + rng.randint(1, 4)] or "q", "qqqqq"]])


def _trace(d: IncrementalDetokenizer, ids: list[int], plan: list[tuple[str, int]]) -> list[tuple]:
    """What the engine sees: deltas, stops, characters sent, looks ahead; and the text."""
    seen: list[tuple] = []
    for kind, n in plan:
        if kind == "look":
            seen.append(("look", d.finds_stop(ids[:n])))
            continue
        delta = d.update(ids[:n], final=kind == "final")
        seen.append((delta, d.text, d.stopped, d.num_sent_chars))
        if d.stopped:
            break
    return seen


def _plan(rng: random.Random, size: int) -> list[tuple[str, int]]:
    """Steps of 1-5 ids (accepted drafts), a look at a step's stop first, a last step that sends
    the same ids again (a stop token's text is not sent)."""
    plan: list[tuple[str, int]] = []
    n = 0
    while n < size:
        m = min(size, n + rng.randint(1, 5))
        if m - n > 1 and rng.random() < 0.3:
            plan.append(("look", m))
        if m == size and rng.random() < 0.3:
            plan.append(("update", m))
        plan.append(("final" if m == size else "update", m))
        n = m
    return plan


@pytest.mark.parametrize("style", ["strip", "metaspace", "bytelevel"])
def test_streams_are_those_of_the_whole_decode(style, tmp_path):
    tok = _tok(style, tmp_path)
    decode = tok.decode_continuation
    rng = random.Random(style)
    for _ in range(250):
        ids = _ids(rng, tok)
        stop, plan = _stops(rng, decode(ids)), _plan(rng, len(ids))
        want = _trace(WholeDecode(decode, stop), ids, plan)
        assert _trace(IncrementalDetokenizer(decode, stop), ids, plan) == want, (ids, stop, plan)


@pytest.mark.parametrize("style", ["strip", "metaspace"])
def test_a_run_that_turns_invalid_sends_what_it_did(style, tmp_path):
    """数 went out; the byte after it breaks the run: the decoder reads it all as U+FFFD, sent
    with the next word. A stop string holds 数 back: cut at the end inside the run, it is gone."""
    tok = _tok(style, tmp_path)
    word, han, first = _enc(tok, " of"), _enc(tok, " Paris数"), [3 + 0xE5]
    for stop, ids in (([], han + first + [3 + 0x80] + word), (["zzz"], han + first)):
        steps = [(["update"] * (len(ids) - 1) + ["final"])[n - 1] for n in range(1, len(ids) + 1)]
        plan = list(zip(steps, range(1, len(ids) + 1), strict=True))
        got = _trace(IncrementalDetokenizer(tok.decode_continuation, stop), ids, plan)
        assert got == _trace(WholeDecode(tok.decode_continuation, stop), ids, plan)
        sent = "".join(t[0] for t in got)
        # 数 sent, then its 3 bytes and the next one as U+FFFD (the first stands for 数, sent)
        assert sent == (" Paris" if stop else " Paris数" + "\ufffd" * 4 + " of")


@pytest.mark.parametrize("style", ["strip", "metaspace"])
def test_a_long_cjk_answer_decodes_each_id_a_few_times(style, tmp_path):
    tok = _tok(style, tmp_path)
    for text in ("数字日本" * 37, "😀😀é数" * 40):
        ids = _enc(tok, text)
        assert len(ids) > 400 and tok.decode_continuation(ids) == text  # byte ids only
        for stop in ([], ["zzz"]):
            decode = Counting(tok.decode_continuation)
            d = IncrementalDetokenizer(decode, stop)
            sent = "".join(d.update(ids[:n], final=n == len(ids)) for n in range(1, len(ids) + 1))
            assert sent == text
            assert decode.ids <= 20 * len(ids)  # the whole run at each step: 158 ids a token


def test_the_text_asked_between_two_whole_characters_is_the_whole_decodes():
    ids = list("a数字".encode())
    d, ref = IncrementalDetokenizer(lossy, ["zz"]), WholeDecode(lossy, ["zz"])
    for n in range(1, len(ids) + 1):
        assert d.update(ids[:n]) == ref.update(ids[:n]) and d.text == ref.text


def test_the_engine_streams_a_long_cjk_answer_in_linear_time(tmp_path):
    tok = _tok("strip", tmp_path)
    text = "数字日本" * 50
    answer = _enc(tok, text)
    eng = make_engine(200)
    eng.max_model_len = eng.spec.max_model_len = 800
    eng.tokenizer = tok
    eng.model_config.vocab_size = tok.vocab_size
    eng.runner = KVFakeRunner(lambda: eng.block_manager, 200, predict=lambda read: answer[len(read) - 1],
                              check_shared=False)
    decode = Counting(tok.decode_continuation)
    tok.decode_continuation = decode  # type: ignore[method-assign]
    (res,) = eng.generate([[1]], SamplingParams(temperature=0, max_tokens=len(answer), ignore_eos=True,
                                                 stop=["zzz"]))
    assert res.text == text and res.finish_reason == "length"
    assert decode.ids <= 20 * len(answer)  # the whole run at each step: 210 ids a token
