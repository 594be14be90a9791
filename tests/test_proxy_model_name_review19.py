"""The request's ``model`` name is bounded (1024 characters): the answer repeats it in every chunk.

Before: any length was taken, and a 3 MB name made a 300-token stream 774 MB long (6 s of the event
loop's time, while ``/health`` waited): one request amplified 250-fold. Fakes, fast."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402

MSGS = [{"role": "user", "content": "hi"}]
MAX_MODEL_CHARS = 1024  # hybridllm.wire.requests.MAX_MODEL_CHARS


@pytest.mark.parametrize("stream", [False, True])
def test_a_model_name_past_the_bound_is_a_400_naming_model(stream):
    edge = FakeBackend(reply=lambda m: "one two three")
    llm = HybridLLM(edge=edge, cache=False)
    try:
        with TestClient(create_app(llm)) as http:
            long = http.post("/v1/chat/completions",
                             json={"model": "m" * 1_000_000, "messages": MSGS, "stream": stream})
            longest = http.post("/v1/chat/completions",
                                json={"model": "m" * MAX_MODEL_CHARS, "messages": MSGS, "stream": stream})
            doc = http.get("/openapi.json").json()
    finally:
        llm.close()
    assert long.status_code == 400, long.text[:200]
    assert long.json()["error"]["param"] == "model"
    assert len(long.content) < 1000  # the name is not quoted back
    assert len(edge.calls) == 1  # the refused request reached no backend
    assert longest.status_code == 200 and ("m" * MAX_MODEL_CHARS) in longest.text
    body = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    if "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    assert schema["properties"]["model"]["maxLength"] == MAX_MODEL_CHARS
