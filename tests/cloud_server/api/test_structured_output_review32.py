"""OpenAI structured output on the cloud server's HTTP API: ``response_format`` json_object and
json_schema on /v1/chat/completions and /v1/completions, streamed and not, with n > 1 and a seed,
served by the real engine on a tiny random model whose vocabulary is JSON pieces (in-process
uvicorn, no weights on disk). A schema the grammar core refuses is a 400 naming its field; the
OpenAPI document lists the three types. Before, any type but "text" was a 400.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch

from cloud_server.api.server import create_app
from cloud_server.config import EngineConfig
from cloud_server.engine.async_engine import AsyncLLMEngine

from ..engine.test_structured_output_review32 import JSON_OBJECT, JSON_SCHEMA, fits_schema, json_engine
from .helpers import ThreadServer, sse_payloads

MSGS = [{"role": "user", "content": "name and age"}]
BASE = {"model": "tiny-json", "max_tokens": 250}


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadServer]:
    def factory() -> AsyncLLMEngine:
        eng = json_engine(1.0)
        eng.model_name = "tiny-json"
        eng.device, eng.dtype, eng.quantization = torch.device("cpu"), torch.float32, "none"
        return AsyncLLMEngine(EngineConfig(model="stub", max_waiting=1000), engine=eng)

    srv = ThreadServer(create_app(factory)).start()
    yield srv
    srv.stop()


@pytest.fixture()
def client(server: ThreadServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def _chat(client: httpx.Client, **body: Any) -> httpx.Response:
    return client.post("/v1/chat/completions", json={**BASE, "messages": MSGS, **body})


def test_json_object_chat_answers_parse_to_dicts(client: httpx.Client) -> None:
    for body in ({"temperature": 0}, {"temperature": 1.0, "seed": 3}, {"temperature": 0.8, "top_p": 0.9}):
        r = _chat(client, response_format=JSON_OBJECT, **body)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop"
        assert isinstance(json.loads(choice["message"]["content"]), dict), choice


def test_json_schema_with_n_and_a_seed(client: httpx.Client) -> None:
    body = {"response_format": JSON_SCHEMA, "n": 3, "seed": 11, "temperature": 1.0}
    r = _chat(client, **body)
    assert r.status_code == 200, r.text
    texts = [c["message"]["content"] for c in r.json()["choices"]]
    assert len(texts) == 3
    for text in texts:
        assert fits_schema(json.loads(text)), text
    assert len(set(texts)) > 1  # each choice its own draw
    again = [c["message"]["content"] for c in _chat(client, **body).json()["choices"]]
    assert again == texts  # the seed repeats all three


def test_streamed_json_schema_joins_to_a_valid_value(client: httpx.Client) -> None:
    with client.stream("POST", "/v1/chat/completions", json={
            **BASE, "messages": MSGS, "stream": True, "n": 2, "temperature": 0.9, "seed": 4,
            "response_format": JSON_SCHEMA, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        events = sse_payloads(r.iter_lines())
    assert events[-1] == "[DONE]"
    texts = ["", ""]
    finish: dict[int, str] = {}
    for e in events[:-1]:
        for c in e.get("choices") or []:
            texts[c["index"]] += c["delta"].get("content") or ""
            if c.get("finish_reason"):
                finish[c["index"]] = c["finish_reason"]
    assert finish == {0: "stop", 1: "stop"}
    for text in texts:
        assert fits_schema(json.loads(text)), text


def test_completions_take_response_format_too(client: httpx.Client) -> None:
    r = client.post("/v1/completions", json={**BASE, "prompt": "a person:", "temperature": 0,
                                             "response_format": JSON_SCHEMA, "logprobs": 1})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert fits_schema(json.loads(choice["text"])) and choice["finish_reason"] == "stop"
    assert len(choice["logprobs"]["tokens"]) > 0  # logprobs are served beside it as before
    r = client.post("/v1/completions", json={**BASE, "prompt": "x", "stream": True,
                                             "response_format": JSON_OBJECT})
    text = "".join(e["choices"][0]["text"] for e in sse_payloads(r.iter_lines())[:-1] if e.get("choices"))
    assert isinstance(json.loads(text), dict)


def test_text_is_plain_output(client: httpx.Client) -> None:
    r = _chat(client, response_format={"type": "text"}, temperature=0, max_tokens=8)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize(("fmt", "param"), [
    ({"type": "json_schema", "json_schema": {"name": "p", "schema": {
        "type": "object", "properties": {"age": {"type": "number", "minimum": 0.5}}}}},
     "response_format.json_schema.schema.properties.age"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "text", "json_schema": {"name": "p", "schema": {}}}, "response_format.json_schema"),
    ({"type": "json_object", "json_schema": {"name": "p", "schema": {}}}, "response_format.json_schema"),
    ({"type": "yaml"}, "response_format.type"),
])
def test_a_format_that_cannot_be_served_is_a_400_naming_its_field(client: httpx.Client, path: str,
                                                                   fmt: dict, param: str) -> None:
    extra = {"messages": MSGS} if "chat" in path else {"prompt": "x"}
    r = client.post(path, json={**BASE, **extra, "response_format": fmt})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] is not None and err["param"].startswith(param), err
    assert "Traceback" not in err["message"]


def test_the_openapi_document_lists_the_three_types(client: httpx.Client) -> None:
    doc = client.get("/openapi.json").json()
    text = json.dumps(doc)
    assert '"enum": ["text", "json_object", "json_schema"]' in text
    assert '"enum": ["text"]' not in text
