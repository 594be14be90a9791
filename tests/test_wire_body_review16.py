"""The body decoder takes a UTF-8 byte order mark as no part of the JSON (RFC 8259 lets a parser
ignore it; Windows PowerShell 5 and Notepad write one), on the proxy as in the decoder."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402
from hybridllm.wire import WireError, decode_json_object  # noqa: E402

BOM = b"\xef\xbb\xbf"
BODY = b'{"model": "x", "messages": [{"role": "user", "content": "hi"}]}'


def test_a_leading_bom_is_ignored():
    assert decode_json_object(BOM + BODY)["model"] == "x"


def test_a_bom_elsewhere_is_still_invalid_json():
    for bad in (BOM + BOM + BODY, BODY[:1] + BOM + BODY[1:]):
        with pytest.raises(WireError):
            decode_json_object(bad)


def test_the_proxy_answers_a_body_with_a_bom():
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "device answer"), cache=False)
    with TestClient(create_app(llm)) as http:
        r = http.post("/v1/chat/completions", content=BOM + BODY,
                      headers={"content-type": "application/json"})
    llm.close()
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "device answer"
