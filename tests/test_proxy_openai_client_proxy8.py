"""`hybridllm serve` as the official openai client (and clients that send every field) use it.

Before: ``client.models.retrieve("hybridllm")`` was a 404 "Invalid URL" (the route did not exist,
though the cloud server has it), and ``"n": null`` or ``"stream": null`` (what the openai client sends
for an explicit ``n=None``, and what OpenAI's API documents as nullable) were 400 "Input should be a
valid integer". Fake backends first (fast), then the real SmolLM2 behind a real socket.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402
from hybridllm.wire import ChatCompletionRequest, CompletionRequest  # noqa: E402

MSGS = [{"role": "user", "content": "hi"}]


def _llm() -> tuple[HybridLLM, FakeBackend]:
    edge = FakeBackend(model="tiny-edge", reply=lambda m: "one two three")
    return HybridLLM(edge=edge, cache=False), edge


def test_null_n_and_stream_are_their_defaults():
    llm, edge = _llm()
    with TestClient(create_app(llm)) as http:
        plain = http.post("/v1/chat/completions", json={"model": "x", "messages": MSGS, "n": None,
                                                         "stream": None, "stream_options": None})
        # null stream is no stream: stream_options still need stream true
        mixed = http.post("/v1/chat/completions", json={"model": "x", "messages": MSGS, "stream": None,
                                                         "stream_options": {"include_usage": True}})
        two = http.post("/v1/chat/completions", json={"model": "x", "messages": MSGS, "n": 2})
    llm.close()
    assert plain.status_code == 200, plain.text
    assert plain.headers["content-type"] == "application/json"
    assert plain.json()["choices"][0]["message"]["content"] == "one two three"
    assert mixed.status_code == 400 and mixed.json()["error"]["param"] == "stream_options"
    assert two.status_code == 400 and two.json()["error"]["param"] == "n"
    assert len(edge.calls) == 1


@pytest.mark.parametrize("model", [ChatCompletionRequest, CompletionRequest])
def test_the_schema_says_n_and_stream_may_be_null(model):
    """API fuzzers and typed clients read the document: null must be allowed there too."""
    props = model.model_json_schema()["properties"]
    for name in ("n", "stream"):
        kinds = [alt.get("type") for alt in props[name].get("anyOf", [props[name]])]
        assert "null" in kinds, (name, props[name])
    assert {"type": "integer", "minimum": 1, "maximum": 1}.items() <= props["n"]["anyOf"][0].items()


def test_models_retrieve_each_listed_model_and_404_otherwise():
    llm, _ = _llm()
    with TestClient(create_app(llm)) as http:
        listed = [m["id"] for m in http.get("/v1/models").json()["data"]]
        cards = [http.get(f"/v1/models/{i}") for i in listed]
        unknown = http.get("/v1/models/gpt-4o")
    llm.close()
    assert listed == ["hybridllm", "tiny-edge"]
    for i, card in zip(listed, cards, strict=True):
        assert card.status_code == 200, card.text
        assert card.json() == {"id": i, "object": "model", "created": card.json()["created"],
                               "owned_by": "hybridllm"}
    assert unknown.status_code == 404
    error = unknown.json()["error"]
    assert (error["code"], error["param"], error["type"]) == ("model_not_found", "model",
                                                              "invalid_request_error")
    assert "gpt-4o" in error["message"] and "GET /v1/models" in error["message"]


def test_models_retrieve_needs_the_key_when_keys_are_set():
    llm, _ = _llm()
    with TestClient(create_app(llm, api_keys=["k1"])) as http:
        bare = http.get("/v1/models/hybridllm")
        keyed = http.get("/v1/models/hybridllm", headers={"Authorization": "Bearer k1"})
        doc = http.get("/openapi.json").json()
    llm.close()
    assert bare.status_code == 401 and bare.json()["error"]["code"] == "invalid_api_key"
    assert keyed.status_code == 200
    assert {"200", "401", "404"} <= set(doc["paths"]["/v1/models/{model_id}"]["get"]["responses"])


@pytest.mark.real
def test_the_openai_client_on_the_real_device_model(smollm2_path):
    """SmolLM2 on llama.cpp behind the proxy on a real socket, driven by the openai client."""
    openai = pytest.importorskip("openai")
    from hybridllm.backends.base import create_backend
    from tests.cloud_server.api.helpers import ThreadServer

    edge = create_backend("llama_cpp", model=str(smollm2_path), n_ctx=2048, n_threads=1)
    llm = HybridLLM(edge=edge, cache=False)
    server = ThreadServer(create_app(llm)).start()
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
        assert client.models.retrieve("hybridllm").id == "hybridllm"
        assert client.models.retrieve(edge.model).id == edge.model
        with pytest.raises(openai.NotFoundError) as missing:
            client.models.retrieve("gpt-4o")
        assert missing.value.code == "model_not_found"
        # an explicit None goes out as null: OpenAI's API takes it as the default
        raw = client.chat.completions.with_raw_response.create(
            model="hybridllm", messages=[{"role": "user", "content": "Say hi"}], max_tokens=4,
            temperature=0, n=None, stream=None)
        assert json.loads(raw.http_request.content)["n"] is None
        answer = raw.parse()
        assert answer.choices[0].message.content and answer.usage.completion_tokens <= 4
        assert answer.choices[0].finish_reason in ("stop", "length")
    finally:
        server.stop()
        llm.close()
