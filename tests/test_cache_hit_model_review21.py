"""A cache hit's Completion (and chunks) name the model that wrote the answer it replays, as stored
with it, not the cache's key "edge-model|cloud:cloud-model" (fast, fakes)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from hybridllm import AsyncHybridLLM, Decision, HybridLLM
from hybridllm.backends.fake import FakeBackend


@dataclass
class Hit:
    text: str
    similarity: float = 1.0
    verifier_prob: float | None = None
    metadata: dict | None = None


class MemoryCache:
    """Exact repeats only, with the metadata the pipeline stores."""

    def __init__(self) -> None:
        self.entries: dict[str, Hit] = {}

    def get(self, msgs, **kw):
        return self.entries.get(str(msgs))

    def put(self, msgs, text, *, metadata=None, **kw):
        self.entries[str(msgs)] = Hit(text, metadata=metadata)
        return "id"


class ToCloud:
    def decide(self, msgs, *, force=None, prompt_tokens=None, embedding=None):
        return Decision("cloud", "score 0.9", 0.9, msgs)

    def should_escalate(self, lp):
        return False


def _parts(cache: MemoryCache) -> dict:
    return {"edge": FakeBackend(model="edge-m"), "cloud": FakeBackend(model="cloud-m"), "cache": cache,
            "policy": ToCloud(), "temperature": 0}


def test_a_hit_names_the_cloud_model_that_wrote_it():
    with HybridLLM(**_parts(MemoryCache())) as llm:
        first = llm.chat("hello there")
        with llm.stream("hello there") as stream:
            models = {chunk.model for chunk in stream}
    hit = stream.completion
    assert (first.route, first.model) == ("cloud", "cloud-m")
    # before: "edge-m|cloud:cloud-m"
    assert (hit.route, hit.model, hit.text) == ("cache", "cloud-m", first.text)
    assert models == {"cloud-m"}


def test_the_async_client_says_the_same():
    async def main() -> tuple[str, str]:
        async with AsyncHybridLLM(**_parts(MemoryCache())) as llm:
            await llm.chat("hello there")
            hit = await llm.chat("hello there")
            return hit.route, hit.model

    assert asyncio.run(main()) == ("cache", "cloud-m")


@pytest.mark.parametrize("metadata", [None, {}, {"model": ""}, {"model": 7}, {"model": "m" * 5000}])
def test_an_entry_without_a_usable_model_names_the_cache_key(metadata):
    cache = MemoryCache()
    with HybridLLM(**_parts(cache)) as llm:
        cache.entries[str([{"role": "user", "content": "hello there"}])] = Hit("cached", metadata=metadata)
        hit = llm.chat("hello there")
    assert (hit.route, hit.text, hit.model) == ("cache", "cached", llm._core.cache_model)
