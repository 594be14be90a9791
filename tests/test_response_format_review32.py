"""Structured output in the library (review 32): ``response_format`` (OpenAI's json_object and
json_schema, or a pydantic model class) is checked by the request's settings through the core
(hybridllm._structured), kept normalized in GenerationParams, keys the cache apart from plain text
and reaches the backend. Before: unknown to GenerationParams. Fast: fakes, no model."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hybridllm import GenerationParams, HybridLLM, InvalidRequestError
from hybridllm.backends.fake import FakeBackend

pytest.importorskip("hybridllm._structured")

OBJECT = {"type": "json_object"}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "person", "schema": {
    "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"]}}}


def test_params_keep_the_normalized_format_and_text_is_none() -> None:
    assert GenerationParams().response_format is None
    assert GenerationParams(response_format={"type": "text"}).response_format is None
    assert GenerationParams(response_format=OBJECT).response_format["type"] == "json_object"
    kept = GenerationParams(response_format=SCHEMA).response_format
    assert kept["type"] == "json_schema"
    assert list(kept["json_schema"]["schema"]["properties"]) == ["name", "age"]  # order kept
    assert GenerationParams.from_kwargs(response_format=OBJECT).response_format["type"] == "json_object"
    # equal and not hashed (a dict): the settings stay usable as they were
    assert GenerationParams(response_format=OBJECT) == GenerationParams(response_format=dict(OBJECT))


@pytest.mark.parametrize(("bad", "says"), [
    ("json", "must be a dict"),
    ({"type": "xml"}, "response_format"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": "^(a)\\1"}}}}},
     "response_format.json_schema.schema"),
    ({"type": "json_object", "extra": float("nan")}, "JSON"),
])
def test_a_bad_format_is_the_request_error_naming_the_field(bad: Any, says: str) -> None:
    with pytest.raises(InvalidRequestError, match=says):
        GenerationParams(response_format=bad)


def test_a_pydantic_model_class_is_its_json_schema() -> None:
    pydantic = pytest.importorskip("pydantic")

    class City(pydantic.BaseModel):
        name: str
        population: int

    fmt = GenerationParams(response_format=City).response_format
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "City"
    assert list(fmt["json_schema"]["schema"]["properties"]) == ["name", "population"]
    with pytest.raises(InvalidRequestError, match="pydantic model class"):
        GenerationParams(response_format=City(name="a", population=1))  # an instance is no format


def test_the_format_keys_the_cache_apart_and_text_keys_as_before() -> None:
    plain = GenerationParams(temperature=0.0).cache_key()
    assert "response_format" not in plain  # old cache files keep hitting
    assert GenerationParams(temperature=0.0, response_format={"type": "text"}).cache_key() == plain
    obj = GenerationParams(temperature=0.0, response_format=OBJECT).cache_key()
    schema = GenerationParams(temperature=0.0, response_format=SCHEMA).cache_key()
    assert obj != plain and schema != plain and obj != schema
    assert GenerationParams(temperature=0.0, response_format=dict(SCHEMA)).cache_key() == schema
    json.dumps(schema)  # the key stays JSON (the cache hashes it)


class Recording(FakeBackend):
    """A fake device model that records the settings of each request."""

    def __init__(self) -> None:
        super().__init__(model="tiny-edge", reply=lambda m: '{"name": "Ada", "age": 36}')
        self.params: list[GenerationParams] = []

    def stream(self, messages, params):  # type: ignore[no-untyped-def]
        self.params.append(params)
        return super().stream(messages, params)


def test_the_library_passes_the_format_to_the_device() -> None:
    edge = Recording()
    with HybridLLM(edge=edge, cache=False) as llm:
        llm.chat("who?", response_format=SCHEMA)
        assert edge.params[-1].response_format["json_schema"]["name"] == "person"
        "".join(c.text for c in llm.stream("who?", response_format=OBJECT))
        assert edge.params[-1].response_format == {"type": "json_object"}
        llm.chat("who?")
        assert edge.params[-1].response_format is None
        with pytest.raises(InvalidRequestError, match="response_format"):
            llm.chat("who?", response_format={"type": "yaml"})
