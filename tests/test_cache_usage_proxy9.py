"""A cache hit through `hybridllm serve` reports OpenAI usage: its prompt and answer tokens.

Before: a hit's ``usage`` was ``{"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}``
(the library's Completion: nothing ran), so a client that counts tokens as OpenAI defines them (a
quota, a context tracker, LiteLLM's spend log) saw an answer of no tokens. Now usage counts the
prompt and the answer in the device model's tokens, and ``hybridllm.tokens_from_cache`` (with
``route`` "cache" and ``cost_usd`` 0) says that none of them was computed or paid for.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402

MSGS = [{"role": "user", "content": "what is two plus two"}]


class SeededCache:
    """A cache port that answers ``text`` for the messages it was seeded with (any sampling)."""

    def __init__(self) -> None:
        self.entries: dict[str, str] = {}

    def seed(self, messages: list[dict], text: str) -> None:
        self.entries[repr(messages)] = text

    def embed_query(self, msgs):
        return None

    def get(self, msgs, *, model, params_key, namespace=None, embedding=None):
        text = self.entries.get(repr(msgs))
        return None if text is None else type("Hit", (), {"text": text, "similarity": 1.0,
                                                          "verifier_prob": None, "metadata": None})()

    def put(self, msgs, text, **kw):
        return None

    def close(self):
        pass


def _sse_events(text: str) -> list[dict]:
    return [json.loads(ln[6:]) for ln in text.splitlines() if ln.startswith("data: {")]


def test_a_cache_hit_counts_its_prompt_and_answer_tokens():
    cache = SeededCache()
    cache.seed(MSGS, "four, as two and two make four")
    edge = FakeBackend(reply=lambda m: "device answer")
    llm = HybridLLM(edge=edge, cache=cache)
    with TestClient(create_app(llm)) as http:
        hit = http.post("/v1/chat/completions", json={"model": "x", "messages": MSGS})
        streamed = http.post("/v1/chat/completions", json={
            "model": "x", "messages": MSGS, "stream": True, "stream_options": {"include_usage": True}})
        miss = http.post("/v1/chat/completions", json={
            "model": "x", "messages": [{"role": "user", "content": "something else"}]})
    llm.close()
    assert edge.calls == [[{"role": "user", "content": "something else"}]]  # the hits ran nothing
    body = hit.json()
    assert hit.headers["x-hybridllm-route"] == "cache" and body["hybridllm"]["route"] == "cache"
    # the fake device counts a word a token plus 4 for the template: 5 + 4; the answer ~4 chars a token
    expected = {"prompt_tokens": 9, "completion_tokens": 8, "total_tokens": 17}
    assert body["usage"] == expected
    assert body["hybridllm"]["cost_usd"] == 0 and body["hybridllm"]["tokens_from_cache"] == 17
    events = _sse_events(streamed.text)
    assert events[-1]["usage"] == expected
    finish = [e for e in events if "hybridllm" in e][-1]
    assert finish["hybridllm"]["route"] == "cache" and finish["hybridllm"]["tokens_from_cache"] == 17
    # an answer the device computed: its own usage, nothing from the cache
    assert miss.json()["usage"]["completion_tokens"] == 2
    assert miss.json()["hybridllm"]["tokens_from_cache"] is None


@pytest.mark.real
def test_a_cache_hit_reports_what_the_real_device_reported_for_the_same_answer(smollm2_path):
    """SmolLM2 on llama.cpp behind a real socket, read by the openai client: the device answers
    once (cache off), that answer is then a cache hit, and the hit's usage is the device's own
    count (the answer's tokens retokenized: within one token of the generated ones)."""
    openai = pytest.importorskip("openai")
    from hybridllm.backends.base import create_backend
    from tests.cloud_server.api.helpers import ThreadServer

    edge = create_backend("llama_cpp", model=str(smollm2_path), n_ctx=1024, n_threads=1)
    cache = SeededCache()
    llm = HybridLLM(edge=edge, cache=cache)
    server = ThreadServer(create_app(llm)).start()
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
        device = client.chat.completions.create(
            model="hybridllm", messages=MSGS, max_tokens=12, temperature=0,
            extra_body={"hybridllm": {"cache": False}})
        assert device.model_extra["hybridllm"]["route"] == "edge"
        text = device.choices[0].message.content
        cache.seed(MSGS, text)
        hit = client.chat.completions.create(model="hybridllm", messages=MSGS, max_tokens=12,
                                             temperature=0)
    finally:
        server.stop()
        llm.close()
    assert hit.model_extra["hybridllm"]["route"] == "cache" and hit.choices[0].message.content == text
    assert hit.usage.prompt_tokens == device.usage.prompt_tokens > 5
    assert abs(hit.usage.completion_tokens - device.usage.completion_tokens) <= 1
    assert hit.usage.completion_tokens > 0
    assert hit.model_extra["hybridllm"]["tokens_from_cache"] == hit.usage.total_tokens
