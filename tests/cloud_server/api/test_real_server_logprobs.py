"""Token log-probabilities through the real server (SmolLM2, loopback) and the official client:
chat (``logprobs``/``top_logprobs``) and legacy completions (``logprobs: N``), streamed and not,
with speculative decoding, and bad values refused with a 400 that names the parameter."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import served_smollm2

pytestmark = pytest.mark.real
openai = pytest.importorskip("openai")

MODEL = "smollm2-135m-instruct"
MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]
GREEDY = {"temperature": 0, "max_tokens": 8}
NO_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def client(smollm2_path: Path) -> Iterator[object]:
    with served_smollm2(smollm2_path, MODEL, "--max-model-len", "1024") as base:
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=120)


def _check_chat_entries(content: list, text: str, top_n: int) -> None:
    assert "".join(e.token for e in content) == text
    for e in content:
        assert e.logprob <= 0 and math.isfinite(e.logprob)
        assert e.bytes == list(e.token.encode("utf-8"))
        assert len(e.top_logprobs) == top_n
        tops = [t.logprob for t in e.top_logprobs]
        assert tops == sorted(tops, reverse=True) and all(t <= 0 for t in tops)
        assert math.exp(tops[0]) + sum(math.exp(t) for t in tops[1:]) <= 1 + 1e-4
        assert abs(e.logprob - tops[0]) < 1e-6  # greedy: the emitted token is the most likely


def test_chat_logprobs_streamed_and_not(client) -> None:
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, logprobs=True, top_logprobs=3,
                                       extra_body=NO_EOS, **GREEDY)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 8
    _check_chat_entries(content, r.choices[0].message.content, 3)

    chunks = list(client.chat.completions.create(
        model=MODEL, messages=MESSAGES, logprobs=True, top_logprobs=3, stream=True,
        extra_body=NO_EOS, **GREEDY,
    ))
    streamed = []
    for c in chunks:
        if c.choices and c.choices[0].logprobs is not None:
            got = c.choices[0].logprobs.content
            # a chunk carries the entries of the tokens whose text it sends
            assert "".join(e.token for e in got) == (c.choices[0].delta.content or "")
            streamed += got
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-4)


def test_chat_without_logprobs_has_none(client) -> None:
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, **GREEDY)
    assert r.choices[0].logprobs is None
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, logprobs=True, **GREEDY)
    assert all(e.top_logprobs == [] for e in r.choices[0].logprobs.content)  # top_logprobs 0


def test_completion_logprobs_streamed_and_not(client) -> None:
    prompt = "The capital of France is"
    r = client.completions.create(model=MODEL, prompt=prompt, logprobs=2, extra_body=NO_EOS, **GREEDY)
    lp = r.choices[0].logprobs
    text = r.choices[0].text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8
    assert "".join(lp.tokens) == text
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    for tok, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert value <= 0 and 2 <= len(top) <= 3 and top[tok] == value
        assert max(top.values()) == pytest.approx(value, abs=1e-6)  # greedy
    streamed = []
    for c in client.completions.create(model=MODEL, prompt=prompt, logprobs=2, stream=True, extra_body=NO_EOS,
                                       **GREEDY):
        if c.choices and c.choices[0].logprobs is not None:
            streamed += c.choices[0].logprobs.token_logprobs
    assert streamed == pytest.approx(lp.token_logprobs, abs=1e-4)


def test_speculative_decoding_keeps_the_target_logprobs(client) -> None:
    messages = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
    plain = client.chat.completions.create(model=MODEL, messages=messages, logprobs=True, temperature=0,
                                           max_tokens=12, extra_body=NO_EOS)
    spec = client.chat.completions.create(model=MODEL, messages=messages, logprobs=True, temperature=0,
                                          max_tokens=12, extra_body={**NO_EOS, "speculative_method": "ngram"})
    assert spec.choices[0].message.content == plain.choices[0].message.content
    a, b = plain.choices[0].logprobs.content, spec.choices[0].logprobs.content
    assert [e.token for e in a] == [e.token for e in b]
    assert [e.logprob for e in b] == pytest.approx([e.logprob for e in a], abs=2e-3)


@pytest.mark.parametrize(("kind", "body", "param"), [
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat", {"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
    ("chat", {"logprobs": 1}, "logprobs"),
    ("completion", {"logprobs": 6}, "logprobs"),
    ("completion", {"logprobs": True}, "logprobs"),
])  # fmt: skip
def test_bad_logprobs_values_are_400s_naming_the_parameter(client, kind, body, param) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        if kind == "chat":
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2, extra_body=body)
        else:
            client.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body=body)
    assert info.value.body["param"] == param, info.value.body
