"""Structured output on the real device backends (review 32): SmolLM2-135M on llama.cpp (its GGUF)
and on ONNX Runtime GenAI (the int4 folder prepared from it, as test_onnx_real.py builds it).

With ``response_format`` every answer, greedy or sampled, is the format (json.loads gives the
object; a schema's grammar validates it), ends once the value is complete, streams the same text,
and a continuation goes on from its prefix; without one, a greedy answer is what it was. Before:
the format was ignored and the answers were prose."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("hybridllm._structured")

from hybridllm import GenerationParams  # noqa: E402

pytestmark = pytest.mark.real
MODEL = "smollm2-135m-instruct"
OBJECT = {"type": "json_object"}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "pet", "strict": True, "schema": {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer"},
        "kind": {"enum": ["cat", "dog", "bird"]},
        "toys": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "nickname": {"type": "string", "maxLength": 12},  # optional
    },
    "required": ["name", "age", "kind", "toys"], "additionalProperties": False}}}
PERSON = [{"role": "user", "content": "Describe a person as JSON with a name and an age."}]
PET = [{"role": "user", "content": "Describe a pet as JSON."}]
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module", params=["llama_cpp", "onnx"])
def edge(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "llama_cpp":
        from hybridllm.backends.llama_cpp import LlamaCppBackend

        backend: Any = LlamaCppBackend(str(request.getfixturevalue("smollm2_path")), n_ctx=1024)
    else:
        pytest.importorskip("onnxruntime_genai")
        from hybridllm.backends.onnx import OnnxBackend
        from hybridllm.models.onnx_prepare import prepare_onnx

        prepare_onnx(MODEL)
        backend = OnnxBackend(MODEL, n_ctx=1024)
    yield backend
    backend.close()


def _params(fmt: Any, seed: int | None, max_tokens: int = 160) -> GenerationParams:
    # seed None: greedy; else a sampled draw at temperature 1 with the default top-k / top-p
    if seed is None:
        return GenerationParams(temperature=0.0, max_tokens=max_tokens, response_format=fmt)
    return GenerationParams(temperature=1.0, seed=seed, max_tokens=max_tokens, response_format=fmt)


@pytest.mark.parametrize("seed", [None, *SEEDS])
def test_json_object_answers_are_objects(edge: Any, seed: int | None) -> None:
    from hybridllm._types import grammar_of

    out = edge.generate(PERSON, _params(OBJECT, seed))
    if seed is not None and out.finish_reason == "length":
        # a sampled json_object may nest on past max_tokens (SmolLM2 on ONNX, seed 1, did): what
        # it wrote is still the start of an object the grammar takes
        assert grammar_of(OBJECT).matcher().feed(out.text.encode()), out.text
        return
    assert out.finish_reason == "stop", out.text
    assert isinstance(json.loads(out.text), dict), out.text


@pytest.mark.parametrize("seed", [None, *SEEDS])
def test_schema_answers_validate(edge: Any, seed: int | None) -> None:
    from hybridllm._types import grammar_of

    out = edge.generate(PET, _params(SCHEMA, seed))
    assert out.finish_reason == "stop", out.text
    assert grammar_of(SCHEMA).validate(out.text), out.text
    pet = json.loads(out.text)
    assert set(pet) - {"nickname"} == {"name", "age", "kind", "toys"}, out.text
    assert isinstance(pet["name"], str) and len(pet["name"]) <= 16
    assert isinstance(pet["age"], int) and not isinstance(pet["age"], bool)
    assert pet["kind"] in ("cat", "dog", "bird")
    assert isinstance(pet["toys"], list) and len(pet["toys"]) <= 3
    assert all(isinstance(t, str) and len(t) <= 12 for t in pet["toys"])
    assert isinstance(pet.get("nickname", ""), str)
    assert list(pet)[:4] == ["name", "age", "kind", "toys"]  # the schema's order


@pytest.mark.parametrize("seed", [None, 1])
def test_streaming_gives_the_same_text(edge: Any, seed: int | None) -> None:
    params = _params(SCHEMA, seed)
    deltas = list(edge.stream(PET, params))
    whole = edge.generate(PET, params)
    assert "".join(d.text for d in deltas) == whole.text
    assert deltas[-1].finish_reason == whole.finish_reason == "stop"
    assert deltas[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_a_continuation_goes_on_from_its_prefix(edge: Any) -> None:
    from hybridllm._types import grammar_of

    prefix = '{"name": "Rex", "age": '
    rest = "".join(d.text for d in edge.stream_continuation(PET, prefix, _params(SCHEMA, None)))
    assert grammar_of(SCHEMA).validate(prefix + rest), prefix + rest
    assert json.loads(prefix + rest)["name"] == "Rex"


EVENT = {"type": "json_schema", "json_schema": {"name": "event", "strict": True, "schema": {
    "type": "object",
    "properties": {
        "title": {"type": "string", "pattern": "^[A-Z][a-z]+( [a-z]+)*$", "maxLength": 30},
        "day": {"type": "string", "format": "date"},
        "starts": {"type": "string", "format": "date-time"},
        "room": {"type": "string", "pattern": "^[A-D]-\\d{3}$"},
        "people": {"type": "integer", "minimum": 2, "maximum": 40},
    },
    "required": ["title", "day", "starts", "room", "people"], "additionalProperties": False}}}


@pytest.mark.parametrize("seed", [None, 0])
def test_patterns_and_formats_hold_on_the_device(edge: Any, seed: int | None) -> None:
    # review 33: before, 'pattern', 'format' and integer 'minimum' / 'maximum' were refused
    import datetime
    import re

    ask = [{"role": "user", "content": "A team meeting next Monday morning, as JSON."}]
    out = edge.generate(ask, _params(EVENT, seed, max_tokens=200))
    assert out.finish_reason == "stop", out.text
    event = json.loads(out.text)
    assert re.fullmatch(r"[A-Z][a-z]+( [a-z]+)*", event["title"]) and len(event["title"]) <= 30, out.text
    assert len(event["day"]) == 10 and datetime.date.fromisoformat(event["day"]), out.text
    assert datetime.datetime.fromisoformat(event["starts"]).tzinfo is not None, out.text
    assert re.fullmatch(r"[A-D]-\d{3}", event["room"]), out.text
    assert isinstance(event["people"], int) and 2 <= event["people"] <= 40, out.text


def test_without_a_format_a_greedy_answer_is_unchanged(edge: Any) -> None:
    plain = GenerationParams(temperature=0.0, max_tokens=40)
    before = edge.generate(PERSON, plain)
    structured = edge.generate(PERSON, _params(OBJECT, None))
    after = edge.generate(PERSON, plain)
    text = edge.generate(PERSON, GenerationParams(temperature=0.0, max_tokens=40,
                                                  response_format={"type": "text"}))
    assert before.text == after.text == text.text  # bit for bit, the structured one in between
    assert structured.text != before.text  # (the model answers this prompt in prose)
    assert not before.text.lstrip().startswith("{")


def test_the_llama_vocabulary_is_the_bytes_the_answer_shows(smollm2_path: Any) -> None:
    from llama_cpp import llama_cpp as C

    from hybridllm.backends.llama_cpp import LlamaCppBackend
    from hybridllm.backends.structured import llama_vocabulary
    from hybridllm.prompts import llama_bytes

    backend = LlamaCppBackend(str(smollm2_path), n_ctx=256)
    try:
        llm = backend._llm
        token_bytes, eos = llama_vocabulary(llm)
        assert len(token_bytes) == llm.n_vocab()
        assert eos and all(token_bytes[t] is None for t in eos)
        assert llm.token_eos() in eos
        vocab = llm._model.vocab
        for tid, piece in enumerate(token_bytes):
            if piece is not None:  # what the backend's loop adds for the token
                assert piece == llama_bytes(llm, [tid])
            elif tid not in eos:  # a control token, or one that adds nothing
                attr = C.llama_vocab_get_attr(vocab, tid)
                assert attr & C.LLAMA_TOKEN_ATTR_CONTROL or not llama_bytes(llm, [tid])
        brace = llm.tokenize(b"{", add_bos=False, special=False)
        assert len(brace) == 1 and token_bytes[brace[0]] == b"{"
    finally:
        backend.close()
