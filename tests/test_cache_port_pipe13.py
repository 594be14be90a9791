"""A cache= object needs get() and put() (what the client checks at construction): the
pipeline's other calls on it (embed_query, get_exact, close) are optional, and a custom cache's
own error in embed_query costs no answer."""

from __future__ import annotations

import logging

from tests.test_pipeline import FakeCache, make


class GetPutOnly:
    def __init__(self):
        self.entries: dict = {}

    def get(self, msgs, *, model, params_key, namespace=None, embedding=None):
        text = self.entries.get(repr(msgs))
        return None if text is None else type("Hit", (), {"text": text, "similarity": 1.0,
                                                          "verifier_prob": None})()

    def put(self, msgs, text, **kw):
        self.entries[repr(msgs)] = text


def test_a_cache_with_get_and_put_alone_answers_and_is_used(caplog):
    llm, edge, cloud = make(cache=GetPutOnly())
    first = llm.chat("easy question")
    again = llm.chat("easy question")
    assert (first.route, again.route, again.text) == ("edge", "cache", "edge answer")
    with caplog.at_level(logging.WARNING, logger="hybridllm"):
        llm.close()
    assert not [r for r in caplog.records if "closing the cache" in r.message]


def test_a_custom_cache_whose_embedder_raises_costs_no_answer(caplog):
    class BrokenEmbedder(FakeCache):
        def embed_query(self, msgs):
            raise RuntimeError("the embedding service is down")

    llm, *_ = make(cache=BrokenEmbedder())
    with caplog.at_level(logging.WARNING, logger="hybridllm"):
        answers = [llm.chat(f"easy question {i}").text for i in range(3)]
    assert answers == ["edge answer"] * 3
    assert sum("embedding failed" in r.message for r in caplog.records) == 1
    llm.close()
