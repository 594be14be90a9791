"""Structured output end to end through the hybrid client on the real device model (review 32):
SmolLM2-135M on llama.cpp behind ``HybridLLM`` and ``hybridllm serve``. ``response_format`` (a dict
or a pydantic model class) reaches the device, which holds the answer to it: ``chat()``'s
``parsed`` is the object, a stream gives the same text, the cache serves it again only to the same
format, and the proxy answers JSON to an OpenAI-style request. Before: the format was unknown to the
client (an InvalidRequestError: "Unknown option(s) ['response_format']") and the proxy refused it
with a 400."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hybridllm import HybridLLM

pytest.importorskip("hybridllm._structured")
pytestmark = pytest.mark.real

OBJECT = {"type": "json_object"}
PROMPT = "Describe a city as JSON with its name and population."


@pytest.fixture
def edge(smollm2_path: Path) -> Iterator[Any]:
    from hybridllm.backends.llama_cpp import LlamaCppBackend

    backend = LlamaCppBackend(str(smollm2_path), n_ctx=1024)
    yield backend  # the client closes it
    backend.close()  # (again: a no-op once closed)


def _city() -> Any:
    pydantic = pytest.importorskip("pydantic")

    class City(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=24)
        population: int

    return City


def test_the_hybrid_client_answers_the_format_on_the_device(edge: Any, tmp_path: Path) -> None:
    from hybridllm._structured import parse_response_format
    from hybridllm.cache import SemanticCache
    from tests.cache.fakes import FakeEmbedder

    City = _city()
    cache = SemanticCache(tmp_path / "c.sqlite3", verifier=None, embedder=FakeEmbedder())
    llm = HybridLLM(edge=edge, cache=cache, cache_min_logprob=-100.0)  # forced tokens: low raw logprobs
    try:
        obj = llm.chat(PROMPT, temperature=0, max_tokens=96, response_format=OBJECT)
        assert obj.route == "edge" and obj.finish_reason == "stop", obj
        assert isinstance(obj.parsed, dict) and obj.parsed == json.loads(obj.text), obj.text
        city = llm.chat(PROMPT, temperature=0, max_tokens=96, response_format=City)
        assert city.finish_reason == "stop", city.text
        assert City.model_validate(city.parsed).population == city.parsed["population"]
        grammar = parse_response_format(
            {"type": "json_schema", "json_schema": {"name": "City", "schema": City.model_json_schema()}})
        assert grammar.validate(city.text), city.text
        # the same request streamed gives the same text (greedy), from the cache now
        with llm.stream(PROMPT, temperature=0, max_tokens=96, response_format=City) as stream:
            streamed = "".join(c.text for c in stream)
        assert streamed == city.text and stream.completion.route == "cache"
        # a plain request is not served a structured answer: the device writes prose
        plain = llm.chat(PROMPT, temperature=0, max_tokens=24)
        assert plain.route == "edge" and plain.text not in (obj.text, city.text)
        # sampled answers hold to the format too
        for seed in (1, 2, 3):
            drawn = llm.chat(PROMPT, temperature=1.0, seed=seed, max_tokens=96, response_format=City,
                             cache=False)
            assert drawn.finish_reason == "stop" and City.model_validate(drawn.parsed), drawn.text
    finally:
        llm.close()
        cache.close()


def test_serve_answers_json_to_an_openai_style_request(edge: Any) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hybridllm.proxy import create_app

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                               "population": {"type": "integer"}},
              "required": ["name", "population"], "additionalProperties": False}
    llm = HybridLLM(edge=edge, cache=False)
    try:
        with TestClient(create_app(llm)) as http:
            r = http.post("/v1/chat/completions", json={
                "model": "x", "messages": [{"role": "user", "content": PROMPT}], "temperature": 0,
                "max_tokens": 96, "response_format": {"type": "json_schema", "json_schema": {
                    "name": "city", "schema": schema, "strict": True}}})
        assert r.status_code == 200, r.text
        body = json.loads(r.json()["choices"][0]["message"]["content"])
        assert set(body) == {"name", "population"} and isinstance(body["population"], int), body
    finally:
        llm.close()
