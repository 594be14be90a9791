"""Speculative decoding through the real server and the official client.

``hybridllm-cloud serve`` runs SmolLM2 with itself as the draft model (the same weights, a KV pool
of its own), so the drafts are nearly always accepted and a wrong draft KV (prefilled in the
target's prefill step, reused across prefix hits) would show as low acceptance, while the target's
verification keeps every answer the plain one. Requests choose their method in the body
(``speculative_method``), as the OpenAI client's ``extra_body`` sends it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ..kernels import engine_kernels
from .helpers import metric_value, served_smollm2

pytestmark = pytest.mark.real
openai = pytest.importorskip("openai")

MODEL = "smollm2-135m-instruct"
QUESTIONS = [
    "Rewrite in the past tense: The train leaves at eight and Anna reads a book by the window.",
    "Name three colours of the rainbow.",
    "Fix the typo and return the sentence: The comittee meets on Wendesday.",
    "What is 12 plus 30? Answer in one sentence.",
]


def _counter(url: str, name: str) -> float:
    value = metric_value(httpx.get(f"{url}/metrics", timeout=10).text, name, model=MODEL)
    return 0.0 if value is None else value


@pytest.fixture(scope="module")
def url(smollm2_path: Path) -> Iterator[str]:
    draft = ("--speculative-method", "draft", "--draft-model", str(smollm2_path),
             "--num-speculative-tokens", "3")
    with served_smollm2(smollm2_path, MODEL, *draft, "--max-model-len", "1024") as base:
        yield base


def _same_answer(got: str, plain: str, method: str) -> None:
    """Speculation answers the plain text: to the character with the engine's kernels (a step
    computes each row alike whatever the batch); with torch's (AVX2-only CPUs) a verified run can
    round a near tie the other way, so there the answers agree on their first half at least."""
    if engine_kernels():
        assert got == plain, method
    else:
        assert len(os.path.commonprefix([got, plain])) >= len(plain) // 2, (method, got, plain)


def test_every_method_answers_the_plain_text(url: str) -> None:
    exact = engine_kernels()
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    names = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")
    before = {n: _counter(url, f"hybridllm_{n}_total") for n in names}
    for q in QUESTIONS:
        messages = [{"role": "user", "content": q}]
        kw = dict(model=MODEL, messages=messages, max_tokens=40, temperature=0)
        plain = client.chat.completions.create(**kw, extra_body={"speculative_method": "none"})
        text = plain.choices[0].message.content
        assert text
        for method in ("draft", "ngram"):
            got = client.chat.completions.create(**kw, extra_body={"speculative_method": method})
            _same_answer(got.choices[0].message.content, text, method)
            if exact:
                assert got.usage.completion_tokens == plain.usage.completion_tokens
        with client.chat.completions.create(**kw, stream=True) as stream:  # the server's draft
            streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        _same_answer(streamed, text, "stream")
    after = {n: _counter(url, f"hybridllm_{n}_total") for n in names}
    drafts, proposed, accepted = (after[n] - before[n] for n in names)
    assert drafts > 0 and proposed >= drafts
    # the draft is the target itself: what it proposes is what the target would say (bf16 ties
    # aside), so this fails if its KV (prefilled with the target's prompt) were wrong; torch's
    # kernels (AVX2-only CPUs) round a verified run unlike a draft step: 148 of 193 measured there
    assert accepted >= (0.8 if exact else 0.6) * proposed


def test_drafting_streams_cut_mid_flight_leave_the_pool_free(url: str) -> None:
    """Twelve concurrent drafting streams, every third dropped after two chunks: the others get
    their whole answer, and both KV pools' blocks (the draft's follows the target's) are free."""

    async def one(http: httpx.AsyncClient, i: int) -> str:
        body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTIONS[i % 4]}],
                "max_tokens": 48, "ignore_eos": True, "stream": True}  # fmt: skip
        async with http.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            chunks = 0
            async for line in r.aiter_lines():
                chunks += line.startswith("data: ")
                if i % 3 == 0 and chunks >= 2:
                    return "aborted"
        return "done" if chunks > 2 else "short"

    async def run() -> list[str]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            return await asyncio.gather(*(one(http, i) for i in range(12)))

    outcomes = asyncio.run(run())
    assert outcomes.count("aborted") == 4 and outcomes.count("done") == 8
    deadline = time.monotonic() + 20
    while True:
        free = _counter(url, "hybridllm_kv_cache_blocks_free")
        total = _counter(url, "hybridllm_kv_cache_blocks_total")
        running = _counter(url, "hybridllm_num_requests_running")
        if (free == total and running == 0) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert running == 0 and free == total > 0
