"""`hybridllm serve`: an empty cache namespace is a 400 that names ``hybridllm.namespace``, and the
OpenAPI document says so.

Before: ``"hybridllm": {"namespace": ""}`` passed the proxy's request model and was refused later by
the client: a 400 with ``param`` null (the client could not tell which field), while the document
declared any string valid.
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402

MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture
def http():
    edge = FakeBackend()
    llm = HybridLLM(edge=edge, cache=False)
    with TestClient(create_app(llm)) as client:
        client.edge = edge
        yield client
    llm.close()


@pytest.mark.parametrize("stream", [False, True])
def test_an_empty_namespace_is_a_400_naming_the_field(http, stream):
    r = http.post("/v1/chat/completions", json={"model": "x", "messages": MSGS, "stream": stream,
                                                "hybridllm": {"namespace": ""}})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "hybridllm.namespace" and error["type"] == "invalid_request_error", error
    assert http.edge.calls == []  # refused before it reached the device


def test_a_namespace_is_still_taken_and_the_document_says_it_is_not_empty(http):
    r = http.post("/v1/chat/completions", json={"model": "x", "messages": MSGS,
                                                "hybridllm": {"namespace": "t1"}})
    assert r.status_code == 200, r.text
    schemas = http.get("/openapi.json").json()["components"]["schemas"]
    namespace = schemas["HybridOptions"]["properties"]["namespace"]
    assert {"type": "string", "minLength": 1} in namespace["anyOf"], namespace
