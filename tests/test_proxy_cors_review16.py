"""CORS preflights as browsers send them: the openai JS client's own headers, and Chrome's Private
Network Access question, for the pages the proxy lets in (and still not for others)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402

PAGE = "https://chat.example"
# what openai-node (dangerouslyAllowBrowser) asks to send
SDK_HEADERS = ("authorization,content-type,x-stainless-arch,x-stainless-lang,x-stainless-os,"
               "x-stainless-package-version,x-stainless-retry-count,x-stainless-runtime")


@pytest.fixture
def http():
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "device answer"), cache=False)
    with TestClient(create_app(llm, allow_origins=[PAGE], api_keys=["k1"])) as client:
        yield client
    llm.close()


def _preflight(http, origin, **extra):
    return http.options("/v1/chat/completions", headers={
        "origin": origin, "access-control-request-method": "POST", **extra})


@pytest.mark.parametrize("origin", [PAGE, "http://localhost:3000"])
def test_a_preflight_naming_the_openai_js_headers_passes(http, origin):
    r = _preflight(http, origin, **{"access-control-request-headers": SDK_HEADERS})
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == origin
    allowed = r.headers["access-control-allow-headers"].lower()
    assert "x-stainless-os" in allowed and "authorization" in allowed


def test_a_private_network_preflight_from_an_allowed_page_passes(http):
    r = _preflight(http, PAGE, **{"access-control-request-private-network": "true",
                                  "access-control-request-headers": "authorization,content-type"})
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-private-network"] == "true"


def test_other_pages_stay_refused_and_the_key_is_still_needed(http):
    r = _preflight(http, "https://evil.example", **{"access-control-request-private-network": "true",
                                                   "access-control-request-headers": SDK_HEADERS})
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
    keyless = http.post("/v1/chat/completions", json=body,
                        headers={"origin": PAGE, "x-stainless-os": "Linux"})
    assert keyless.status_code == 401
