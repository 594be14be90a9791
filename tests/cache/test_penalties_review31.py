"""The semantic cache keeps answers drawn with presence/frequency penalties apart from those drawn
without (review 31), and an entry written before the penalties existed still answers a request
without them. Fast: a fake device model and the fake embedder."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridllm import HybridLLM
from hybridllm._pipeline.cache_steps import cache_model_of
from hybridllm.backends.fake import FakeBackend
from hybridllm.cache import SemanticCache

from .fakes import FakeEmbedder

Q = "Name a fruit."


class Counting(FakeBackend):
    """Answers with the settings it was asked with, so a served answer tells which they were."""

    def __init__(self) -> None:
        super().__init__(model="tiny-edge")

    def stream(self, messages, params):  # type: ignore[no-untyped-def]
        self.reply = lambda m: f"pres {params.presence_penalty} freq {params.frequency_penalty}"
        return super().stream(messages, params)


@pytest.fixture
def cache(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = SemanticCache(tmp_path / "c.sqlite3", verifier=None, min_similarity=0.9, embedder=FakeEmbedder())
    yield c
    c.close()


def test_penalised_and_plain_answers_are_never_served_for_each_other(cache: SemanticCache) -> None:
    edge = Counting()
    with HybridLLM(edge=edge, cache=cache, cache_min_logprob=None) as llm:
        first = llm.chat(Q, temperature=0, frequency_penalty=1.0)
        assert first.route == "edge" and first.text == "pres 0.0 freq 1.0"
        plain = llm.chat(Q, temperature=0)
        assert plain.route == "edge" and plain.text == "pres 0.0 freq 0.0"  # not the penalised one
        other = llm.chat(Q, temperature=0, presence_penalty=1.0)  # another penalty: its own bucket
        assert other.route == "edge" and other.text == "pres 1.0 freq 0.0"
        # each is served to its own settings again (1 and 1.0 are one setting)
        for kw, text in (({"frequency_penalty": 1}, first.text), ({}, plain.text),
                         ({"presence_penalty": 1.0, "frequency_penalty": 0}, other.text)):
            again = llm.chat(Q, temperature=0, **kw)
            assert again.route == "cache" and again.text == text, (kw, again)
    assert len(edge.calls) == 3


def test_an_entry_written_before_the_penalties_still_hits(cache: SemanticCache) -> None:
    # the key an older version wrote (its GenerationParams had no penalties), at the client's defaults
    old_key = {"max_tokens": 256, "temperature": 0.0, "top_p": 0.95, "top_k": 40, "min_p": 0.0,
               "repeat_penalty": 1.0, "seed": None, "stop": []}
    edge = Counting()
    with HybridLLM(edge=edge, cache=cache, cache_min_logprob=None) as llm:
        cache.put([{"role": "user", "content": Q}], "an old answer", model=cache_model_of(edge, None),
                  params_key=old_key)
        hit = llm.chat(Q, temperature=0)
        assert hit.route == "cache" and hit.text == "an old answer"
        assert llm.chat(Q, temperature=0, presence_penalty=0.0).text == "an old answer"  # 0 is off
        fresh = llm.chat(Q, temperature=0, frequency_penalty=0.5)
        assert fresh.route == "edge" and fresh.text == "pres 0.0 freq 0.5"
    assert len(edge.calls) == 1
