"""OpenAI's logprobs shapes of an engine answer (real engine code, a scripted fake model, tiny
SentencePiece and byte-level tokenizers): a character split over byte ids (数, 😀) and a stop
string cut inside a token. Chat: ``content[]`` of ``token, logprob, bytes, top_logprobs``, the
bytes joined are the answer's UTF-8. Legacy: parallel ``tokens, token_logprobs, top_logprobs,
text_offset``, a byte token named ``bytes:\\xNN``, each offset where its character starts."""

from __future__ import annotations

import pytest

from cloud_server.api.logprobs import chat_logprobs, text_logprobs
from cloud_server.engine.sampling_params import SamplingParams
from tests.cloud_server.engine.test_fuzz_fake_batching8 import KVFakeRunner, make_engine
from tests.cloud_server.engine.test_logprob_offsets_review21 import _tokenizer, _with_rows

ANSWER = " Paris 数😀 is nice."


def _run(tok, stop: list[str]):
    answer = tok._tok.encode(ANSWER, add_special_tokens=False).ids
    eng = make_engine(64)
    eng.tokenizer = tok
    eng.model_config.vocab_size = tok.vocab_size
    eng.runner = _with_rows(KVFakeRunner(lambda: eng.block_manager, 64,
                                         predict=lambda read: answer[len(read) - 1], check_shared=False), eng)
    (res,) = eng.generate([[1]], SamplingParams(temperature=0, max_tokens=len(answer), stop=stop,
                                                 ignore_eos=True, logprobs=2))
    return res


@pytest.mark.parametrize("style", ["metaspace", "bytelevel"])
def test_a_character_split_over_byte_tokens(style, tmp_path):
    tok = _tokenizer(style, tmp_path)
    res = _run(tok, [])
    assert res.text == ANSWER
    chat = chat_logprobs(res.logprobs, tok.decode, tok.token_bytes)["content"]
    assert bytes(b for e in chat for b in e["bytes"]) == ANSWER.encode()
    for e in chat:
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"}
        assert e["token"] == bytes(e["bytes"]).decode("utf-8", errors="replace")
        assert len(e["top_logprobs"]) == 2
        assert all(set(t) == {"token", "logprob", "bytes"} for t in e["top_logprobs"])
    legacy = text_logprobs(res.logprobs, tok.decode, tok.token_bytes)
    assert set(legacy) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len({len(v) for v in legacy.values()}) == 1
    at = ANSWER.index("数")
    pairs = list(zip(legacy["tokens"], legacy["text_offset"], strict=True))
    split = [(t, o) for t, o in pairs if t.startswith("bytes:")]
    # 数's three bytes start at 数, 😀's four at 😀 (SentencePiece's last three pointed at 数)
    assert split == [(f"bytes:\\x{b:02x}", at + (i >= 3)) for i, b in enumerate("数😀".encode())]
    offsets = legacy["text_offset"]
    assert offsets == sorted(offsets)
    whole = [(t, o) for t, o in zip(legacy["tokens"], offsets, strict=True) if not t.startswith("bytes:")]
    assert all(ANSWER[o:].startswith(t) for t, o in whole)


@pytest.mark.parametrize("style", ["metaspace", "bytelevel"])
@pytest.mark.parametrize("stop", ["ris 数", "数😀 i"])
def test_a_stop_string_cut_inside_a_token(style, stop, tmp_path):
    """The entries are those of the tokens whose text starts before the cut (the token it cuts
    included, whole); none after."""
    tok = _tokenizer(style, tmp_path)
    res = _run(tok, [stop])
    assert res.finish_reason == "stop" and res.text == ANSWER[: ANSWER.index(stop)]
    chat = chat_logprobs(res.logprobs, tok.decode, tok.token_bytes)["content"]
    sent = bytes(b for e in chat for b in e["bytes"]).decode()
    assert sent.startswith(res.text) and len(sent) < len(res.text) + len(stop)
    legacy = text_logprobs(res.logprobs, tok.decode, tok.token_bytes)
    assert "".join(legacy["tokens"]) == sent
    assert all(o < len(res.text) for o in legacy["text_offset"])
    assert legacy["text_offset"] == [len(sent) - len("".join(legacy["tokens"][i:])) for i in range(len(chat))]
