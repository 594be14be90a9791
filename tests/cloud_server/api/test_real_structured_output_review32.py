"""Structured output on the real server (SmolLM2, loopback) through the official client:
``response_format`` json_object and json_schema give JSON that parses and fits, greedy and sampled,
streamed and not, with prompt lookup configured on the server; ``beta.chat.completions.parse``
with a pydantic model where the installed client has it. Before, any type but "text" was a 400."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import served_smollm2

pytestmark = pytest.mark.real
openai = pytest.importorskip("openai")

MODEL = "smollm2-135m-instruct"
ASK = [{"role": "user", "content": "Describe a cat called Tom, aged 3, as JSON."}]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer"},
        "color": {"enum": ["black", "white", "orange"]},
        "likes": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "indoor": {"type": "boolean"},
    },
    "required": ["name", "age", "color", "likes", "indoor"],
    "additionalProperties": False,
}


def _fits(value: object) -> bool:
    return (isinstance(value, dict) and set(value) == set(SCHEMA["required"])
            and isinstance(value["name"], str) and len(value["name"]) <= 20
            and isinstance(value["age"], int) and not isinstance(value["age"], bool)
            and value["color"] in ("black", "white", "orange") and isinstance(value["indoor"], bool)
            and isinstance(value["likes"], list) and len(value["likes"]) <= 3
            and all(isinstance(x, str) and len(x) <= 12 for x in value["likes"]))


@pytest.fixture(scope="module")
def client(smollm2_path: Path) -> Iterator[object]:
    with served_smollm2(smollm2_path, MODEL, "--max-model-len", "1024", "--speculative-method",
                        "ngram") as base:
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=300)


def test_json_object(client) -> None:
    from hybridllm._structured import parse_response_format

    ended = 0
    for extra in ({"temperature": 0}, {"temperature": 0.8, "seed": 1}, {"temperature": 0.8, "seed": 2}):
        r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=300,
                                           response_format={"type": "json_object"}, **extra)
        text = r.choices[0].message.content
        if r.choices[0].finish_reason == "length":
            # a 135M model may list on past max_tokens (greedy on this prompt did, on an AVX2
            # machine: "habits_1" ... "habits_12"): what it wrote is still the start of an object
            grammar = parse_response_format({"type": "json_object"})
            assert grammar is not None and grammar.matcher().feed(text.encode()), text
            continue
        assert r.choices[0].finish_reason == "stop", text
        assert isinstance(json.loads(text), dict), text
        ended += 1
    assert ended, "no answer ended"


def test_json_schema_plain_and_streamed(client) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "cat", "schema": SCHEMA, "strict": True}}
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=300, temperature=0,
                                       response_format=fmt)
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop" and _fits(json.loads(text)), text
    # streamed, the same greedy text
    stream = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=300, temperature=0,
                                            response_format=fmt, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text
    # without prompt lookup for this request: the same text again
    r = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=300, temperature=0,
                                       response_format=fmt, extra_body={"speculative_method": "none"})
    assert r.choices[0].message.content == text
    sampled = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=300, temperature=1.0,
                                             seed=5, n=2, response_format=fmt)
    for choice in sampled.choices:
        assert _fits(json.loads(choice.message.content)), choice.message.content


def test_a_refused_schema_is_a_400_naming_it(client) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"age": {"type": "number", "minimum": 0.5}}}}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=10, response_format=fmt)
    assert err.value.body["param"].startswith("response_format.json_schema.schema.properties.age")


def test_the_clients_parse_helper(client) -> None:
    pydantic = pytest.importorskip("pydantic")
    beta = getattr(getattr(client, "beta", None), "chat", None)
    parse = getattr(getattr(beta, "completions", None), "parse", None) or getattr(
        getattr(client.chat, "completions", None), "parse", None)
    if parse is None:
        pytest.skip("this openai client has no chat.completions.parse")

    class Cat(pydantic.BaseModel):
        name: str
        age: int
        indoor: bool

    r = parse(model=MODEL, messages=ASK, max_tokens=200, temperature=0, response_format=Cat)
    cat = r.choices[0].message.parsed
    assert isinstance(cat, Cat), r.choices[0].message.content
