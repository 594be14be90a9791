"""The semantic cache and structured output (review 32): an answer made under a response_format is
keyed by the format's grammar, so plain and structured answers (and two schemas) are never served for
each other; a cached structured answer that its grammar no longer accepts (cut short, written by
another tool) is not served, on an exact repeat nor a near one. Fast: a fake device model and the
fake embedder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridllm import GenerationParams, HybridLLM
from hybridllm._pipeline.cache_steps import cache_model_of
from hybridllm.backends.fake import FakeBackend
from hybridllm.cache import SemanticCache

from .fakes import FakeEmbedder

pytest.importorskip("hybridllm._structured")
Q = "Name a famous mathematician."
MSGS = [{"role": "user", "content": Q}]
OBJECT = {"type": "json_object"}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "person", "schema": {
    "type": "object", "properties": {"name": {"type": "string"}, "born": {"type": "integer"}},
    "required": ["name", "born"]}}}


class Formats(FakeBackend):
    """Answers as the request's format asks (one JSON token), so a served answer tells which it was."""

    def __init__(self) -> None:
        super().__init__(model="tiny-edge")

    def stream(self, messages, params):  # type: ignore[no-untyped-def]
        fmt = params.response_format
        answer = ("Emmy Noether" if fmt is None else
                  json.dumps({"kind": "object"}, separators=(",", ":")) if fmt["type"] == "json_object"
                  else json.dumps({"name": "Emmy", "born": 1882}, separators=(",", ":")))
        self.reply = lambda m: answer
        return super().stream(messages, params)


@pytest.fixture
def cache(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = SemanticCache(tmp_path / "c.sqlite3", verifier=None, min_similarity=0.9, embedder=FakeEmbedder())
    yield c
    c.close()


def test_plain_and_structured_answers_are_never_served_for_each_other(cache: SemanticCache) -> None:
    edge = Formats()
    with HybridLLM(edge=edge, cache=cache, cache_min_logprob=None) as llm:
        plain = llm.chat(Q, temperature=0)
        obj = llm.chat(Q, temperature=0, response_format=OBJECT)
        person = llm.chat(Q, temperature=0, response_format=SCHEMA)
        assert [c.route for c in (plain, obj, person)] == ["edge"] * 3
        assert (plain.text, json.loads(obj.text), json.loads(person.text)["born"]) == (
            "Emmy Noether", {"kind": "object"}, 1882)
        for kw, text in (({}, plain.text), ({"response_format": OBJECT}, obj.text),
                         ({"response_format": dict(SCHEMA)}, person.text),
                         ({"response_format": {"type": "text"}}, plain.text)):
            again = llm.chat(Q, temperature=0, **kw)
            assert again.route == "cache" and again.text == text, (kw, again)
    assert len(edge.calls) == 3


def test_a_cached_structured_answer_that_no_longer_validates_is_not_served(cache: SemanticCache) -> None:
    edge = Formats()
    with HybridLLM(edge=edge, cache=cache, cache_min_logprob=None) as llm:
        key = GenerationParams.from_kwargs(**{**llm._core.defaults, "temperature": 0,
                                              "response_format": SCHEMA}).cache_key()
        model = cache_model_of(edge, None)
        # an answer cut by max_tokens, and one missing a required key: JSON neither of them
        # the schema takes
        for stale in ('{"name": "Emmy", "bo', '{"name": "Emmy"}'):
            cache.put(MSGS, stale, model=model, params_key=key)
            assert cache.get_exact(MSGS, model=model, params_key=key) is None
            assert cache.get(MSGS, model=model, params_key=key) is None  # nor as a near question
            fresh = llm.chat(Q, temperature=0, response_format=SCHEMA)
            assert fresh.route == "edge" and json.loads(fresh.text) == {"name": "Emmy", "born": 1882}
        # a valid one is served
        cache.put(MSGS, '{"name": "Ada", "born": 1815}', model=model, params_key=key)
        hit = llm.chat(Q, temperature=0, response_format=SCHEMA)
        assert hit.route == "cache" and json.loads(hit.text)["name"] == "Ada"
    assert len(edge.calls) == 2


def test_a_plain_entry_written_before_formats_existed_still_hits(cache: SemanticCache) -> None:
    old_key = {"max_tokens": 256, "temperature": 0.0, "top_p": 0.95, "top_k": 40, "min_p": 0.0,
               "repeat_penalty": 1.0, "seed": None, "stop": []}
    edge = Formats()
    with HybridLLM(edge=edge, cache=cache, cache_min_logprob=None) as llm:
        cache.put(MSGS, "an old answer", model=cache_model_of(edge, None), params_key=old_key)
        assert llm.chat(Q, temperature=0).text == "an old answer"
        assert llm.chat(Q, temperature=0, response_format={"type": "text"}).text == "an old answer"
        structured = llm.chat(Q, temperature=0, response_format=OBJECT)
        assert structured.route == "edge" and json.loads(structured.text) == {"kind": "object"}
    assert len(edge.calls) == 1
