"""The cloud server serves vLLM's and OpenAI's sampling controls (fake engine, in-process uvicorn):
``presence_penalty``, ``frequency_penalty``, ``logit_bias``, ``min_p`` and ``repetition_penalty``
reach the engine's SamplingParams, and bad values are a 400 naming the parameter (a biased token
id outside the vocabulary too, before the request runs).

Before: min_p and repetition_penalty were a 400 "not supported" (so the hybridllm client dropped
them for good, and the user's setting was silently ignored on our own cloud), and the penalties
and logit_bias a 400 "only 0 is supported".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cloud_server.api.server import create_app
from hybridllm import GenerationParams
from hybridllm.backends.cloud import CloudBackend

from .fake_engine import FakeEngine
from .helpers import ThreadServer

MSGS = [{"role": "user", "content": "Hi"}]
PATHS = ["/v1/chat/completions", "/v1/completions"]
VOCAB = 1000  # the fake tokenizer's ids are characters' code points


class Recording(FakeEngine):
    """Keeps the SamplingParams of every request it is given."""

    def __init__(self) -> None:
        super().__init__(max_model_len=512)
        self.tokenizer.vocab_size = VOCAB  # type: ignore[attr-defined]
        self.seen: list[Any] = []

    def generate(self, request_id, prompt, params, on_scheduled=None):  # type: ignore[no-untyped-def]
        self.seen.append(params)
        return super().generate(request_id, prompt, params, on_scheduled)


@pytest.fixture(scope="module")
def engine() -> Recording:
    return Recording()


@pytest.fixture(scope="module")
def server(engine: Recording) -> Iterator[ThreadServer]:
    srv = ThreadServer(create_app(lambda: engine)).start()
    yield srv
    srv.stop()


@pytest.fixture()
def client(server: ThreadServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


def _post(client: httpx.Client, path: str, **body: object) -> httpx.Response:
    extra = {"messages": MSGS} if path.endswith("chat/completions") else {"prompt": "Hi"}
    return client.post(path, json={"model": "fake-model", **extra, "max_tokens": 4, **body})


@pytest.mark.parametrize("path", PATHS)
def test_every_control_reaches_the_engine(client: httpx.Client, engine: Recording, path: str) -> None:
    r = _post(client, path, presence_penalty=0.5, frequency_penalty=-1.25, logit_bias={"72": 100, "7": -5.5},
              min_p=0.1, repetition_penalty=1.3)
    assert r.status_code == 200, r.text
    p = engine.seen[-1]
    assert (p.presence_penalty, p.frequency_penalty, p.min_p, p.repetition_penalty) == (0.5, -1.25, 0.1, 1.3)
    assert p.logit_bias == {72: 100.0, 7: -5.5}
    # streamed too
    assert _post(client, path, stream=True, frequency_penalty=2).status_code == 200
    assert engine.seen[-1].frequency_penalty == 2.0
    # left out or zero: off, and no bias map for the sampler to build
    assert _post(client, path, logit_bias={"5": 0}, presence_penalty=0).status_code == 200
    p = engine.seen[-1]
    assert p.logit_bias is None and not p.has_penalties and p.min_p == 0.0


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("fields", "param"), [
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -2.01}, "frequency_penalty"),
    ({"frequency_penalty": "1"}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"min_p": 1.5}, "min_p"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"-1": 1}}, "logit_bias"),
    ({"logit_bias": {"1.5": 1}}, "logit_bias"),
    ({"logit_bias": {str(VOCAB): 1}}, "logit_bias"),  # past the vocabulary: refused before it runs
    ({"logit_bias": {"99999999999999999999": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"5": "1"}}, "logit_bias"),
    ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
    ({"logit_bias": [1]}, "logit_bias"),
])
def test_bad_values_are_a_400_naming_the_parameter(
    client: httpx.Client, engine: Recording, path: str, fields: dict[str, object], param: str
) -> None:
    before = len(engine.seen)
    r = _post(client, path, **fields)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert (err["param"] or "").split(".")[0] == param, err
    assert len(engine.seen) == before  # never reached the engine


def test_the_largest_vocabulary_id_and_300_biases_are_accepted(
    client: httpx.Client, engine: Recording
) -> None:
    r = _post(client, PATHS[0], logit_bias={str(i): -1 for i in range(VOCAB - 300, VOCAB)})
    assert r.status_code == 200, r.text
    assert len(engine.seen[-1].logit_bias) == 300 and max(engine.seen[-1].logit_bias) == VOCAB - 1


def test_the_hybridllm_client_keeps_min_p_and_repetition_penalty_on_our_server(
    server: ThreadServer, engine: Recording
) -> None:
    """The client sends min_p and repetition_penalty (vLLM's names) when the user sets them: our
    server now takes them (no 400), so the client keeps sending them, request after request."""
    cloud = CloudBackend(base_url=server.url, max_retries=0)
    try:
        for _ in range(2):
            params = GenerationParams(max_tokens=4, min_p=0.2, repeat_penalty=1.15, top_k=9)
            assert cloud.generate(MSGS, params).text
            p = engine.seen[-1]
            assert (p.min_p, p.repetition_penalty, p.top_k) == (0.2, 1.15, 9)
        assert not any(cloud._refused.values())  # nothing learnt as refused
        assert cloud.endpoints[0].breaker.state == "closed"
    finally:
        cloud.close()


def test_the_schema_documents_the_controls_as_served(client: httpx.Client) -> None:
    """The OpenAPI schema of the cloud's requests no longer pins the penalties and biases to 0."""
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    for name, schema in schemas.items():
        props = schema.get("properties", {})
        if "presence_penalty" not in props:
            continue
        text = str({k: props[k] for k in ("presence_penalty", "frequency_penalty", "logit_bias", "min_p",
                                            "repetition_penalty")})
        assert "'maximum': 0" not in text and "'enum': [0" not in text, (name, text)
        # the keys' rule and the bound, for generated clients and fuzzers
        bias = next(alt for alt in props["logit_bias"]["anyOf"] if alt.get("type") == "object")
        bias = {**props["logit_bias"], **bias}
        assert bias["maxProperties"] == 300 and bias["propertyNames"] == {"pattern": "^[0-9]+$"}, bias
