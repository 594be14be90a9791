"""The sampling controls on the real server (SmolLM2, loopback) through the official client:
``logit_bias``, ``presence_penalty`` and ``frequency_penalty`` as its own arguments, ``min_p`` and
``repetition_penalty`` in ``extra_body`` (vLLM's), each seen to act as its rule says; a biased id
outside the vocabulary is a 400 naming ``logit_bias``. Before, each was a 400."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ..kernels import engine_kernels
from .helpers import metric_value, served_smollm2

pytestmark = pytest.mark.real
openai = pytest.importorskip("openai")

MODEL = "smollm2-135m-instruct"
REPEAT = [{"role": "user", "content": "Write the word cat twenty times, separated by spaces."}]
CATS = "cat dog cat dog cat dog cat dog cat dog cat dog"
GREEDY = {"temperature": 0, "max_tokens": 24, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def client(smollm2_path: Path) -> Iterator[object]:
    with served_smollm2(smollm2_path, MODEL, "--max-model-len", "1024") as base:
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def vocab(smollm2_path: Path) -> object:
    from llama_cpp import Llama

    return Llama(model_path=str(smollm2_path), vocab_only=True, verbose=False)


def _tokens(r) -> list[str]:
    return [e.token for e in r.choices[0].logprobs.content]


def test_a_bias_of_100_forces_its_token_and_one_past_the_vocabulary_is_a_400(client, vocab) -> None:
    token = vocab.tokenize(b" banana", add_bos=False, special=False)[0]
    r = client.chat.completions.create(model=MODEL, messages=REPEAT, logit_bias={str(token): 100},
                                       **{**GREEDY, "max_tokens": 4})
    assert r.choices[0].message.content.count("banana") == 4, r.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=REPEAT, logit_bias={str(vocab.n_vocab()): 5},
                                       **GREEDY)
    assert err.value.body["param"] == "logit_bias"


def test_penalties_cut_the_repeats(client) -> None:
    """Legacy completions of a repeating text: greedy goes on repeating it; each penalty (counted
    over the output; repetition_penalty over the prompt too) cuts the repeated tokens by half or
    more."""

    def tokens(**kwargs: object) -> list[str]:
        r = client.completions.create(model=MODEL, prompt=CATS, temperature=0, max_tokens=24, logprobs=0,
                                      **kwargs)
        return r.choices[0].logprobs.tokens

    base = tokens(extra_body={"ignore_eos": True})
    assert len(base) == 24 and len(base) - len(set(base)) >= 12, base  # greedy repeats itself here
    for kwargs in ({"frequency_penalty": 2, "presence_penalty": 2},
                   {"extra_body": {"ignore_eos": True, "repetition_penalty": 3.0}}):
        kwargs.setdefault("extra_body", {"ignore_eos": True})
        got = tokens(**kwargs)
        assert len(got) == 24
        assert len(got) - len(set(got)) <= (len(base) - len(set(base))) / 2, (kwargs, got)


def test_min_p_keeps_only_tokens_near_the_top(client) -> None:
    """At temperature T, min_p m keeps t only where p_T(t) >= m * max p_T, that is where the raw
    log-probability lp_t >= lp_max + T * log(m) (logprobs report the raw distribution)."""
    t, m = 1.5, 0.5
    floor = t * math.log(m)

    def below(extra: dict) -> int:
        r = client.chat.completions.create(
            model=MODEL, messages=REPEAT, temperature=t, max_tokens=32, seed=7, logprobs=True,
            top_logprobs=1, extra_body={"ignore_eos": True, **extra})
        content = r.choices[0].logprobs.content
        assert len(content) == 32
        return sum(e.logprob < e.top_logprobs[0].logprob + floor - 1e-3 for e in content)

    assert below({"min_p": m}) == 0
    assert below({}) > 0  # without it, a seeded draw at T 1.5 does go below the floor


def test_speculation_keeps_the_penalised_greedy_output(client) -> None:
    """Prompt lookup on a repeating text drafts every step; the penalties of each verified position
    count the drafts before it, so the output is the one without speculation (to the token with
    the engine's kernels; with torch's, a verified run can round a near tie the other way, as in
    test_real_server_spec.py, so there the first half at least)."""
    url = str(client.base_url).rstrip("/").removesuffix("/v1")
    drafted = "hybridllm_spec_decode_num_draft_tokens_total"

    def tokens(method: str) -> list[str]:
        r = client.completions.create(
            model=MODEL, prompt=CATS, temperature=0, max_tokens=24, logprobs=0, frequency_penalty=0.3,
            extra_body={"ignore_eos": True, "repetition_penalty": 1.2, "speculative_method": method,
                        "num_speculative_tokens": 4})
        return r.choices[0].logprobs.tokens

    plain = tokens("none")
    before = metric_value(httpx.get(f"{url}/metrics", timeout=10).text, drafted, model=MODEL) or 0.0
    got = tokens("ngram")
    assert (metric_value(httpx.get(f"{url}/metrics", timeout=10).text, drafted, model=MODEL) or 0.0) > before
    if engine_kernels():
        assert got == plain
    else:
        assert got[: len(plain) // 2] == plain[: len(plain) // 2], (got, plain)
