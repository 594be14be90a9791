"""A compressed request body is refused by name at both servers, not called "invalid JSON".

Before: a client that gzips its body (``Content-Encoding: gzip``, as some HTTP clients and
gateways do) got 400 "We could not parse the JSON body of your request. Send valid JSON ...",
though it had sent valid JSON, and a ``br`` header on a plain body was silently ignored. Now any
``Content-Encoding`` but ``identity`` is a 400 ``unsupported_content_encoding`` that names the
header, and the body is not read (no decompression, so no zip bomb either).
"""

from __future__ import annotations

import gzip
import json

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402

BODY = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.fixture(params=["proxy", "cloud"])
def http(request):
    if request.param == "proxy":
        llm = HybridLLM(edge=FakeBackend(), cache=False)
        with TestClient(create_app(llm)) as client:
            yield client
        llm.close()
    else:
        pytest.importorskip("torch")
        from cloud_server.api.server import create_app as cloud_app
        from tests.cloud_server.api.fake_engine import FakeEngine

        with TestClient(cloud_app(lambda: FakeEngine())) as client:
            yield client


GZIPPED = gzip.compress(BODY, mtime=0)  # no timestamp: the same test ids in every process


@pytest.mark.parametrize(("encoding", "content"), [
    ("gzip", GZIPPED), ("GZIP", GZIPPED), ("br", BODY), ("deflate, gzip", BODY)])
def test_a_compressed_body_is_refused_naming_the_header(http, encoding, content):
    r = http.post("/v1/chat/completions", content=content,
                  headers={"content-type": "application/json", "content-encoding": encoding})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "unsupported_content_encoding", error
    assert "Content-Encoding" in error["message"] and encoding in error["message"]
    assert "could not parse" not in error["message"]


@pytest.mark.parametrize("encoding", ["identity", "Identity", ""])
def test_identity_is_no_encoding(http, encoding):
    r = http.post("/v1/chat/completions", content=BODY,
                  headers={"content-type": "application/json", "content-encoding": encoding})
    assert r.status_code == 200, r.text
