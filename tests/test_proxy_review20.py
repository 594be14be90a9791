"""`hybridllm serve` review 20 (fakes only, fast).

- The answer said which route served it but not which model wrote it: the body's ``model`` repeats
  the request's name (clients match on it), so a client of a proxy (LiteLLM's proxy returns the
  model that answered) could not tell the device's model from the cloud's. Now ``hybridllm.model``
  names it, in the JSON answer and in the stream's last chunk (null for a cache hit: no model ran).
- A CORS preflight the proxy refused was Starlette's bare ``text/plain`` "Disallowed CORS origin",
  the one error of the proxy not in OpenAI's JSON shape; now it is, with the advice the refused
  POST itself gives (``--allow-origin``).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402

CHAT = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi there"}]


def _events(text: str) -> list:
    lines = [ln[6:] for ln in text.splitlines() if ln.startswith("data: ")]
    return [x if x == "[DONE]" else json.loads(x) for x in lines]


@pytest.fixture
def http():
    llm = HybridLLM(edge=FakeBackend(model="device-m", reply=lambda m: "device answer"),
                    cloud=FakeBackend(model="cloud-m", reply=lambda m: "cloud answer"), cache=True)
    with TestClient(create_app(llm)) as client:
        yield client
    llm.close()


@pytest.mark.parametrize(("route", "model"), [("edge", "device-m"), ("cloud", "cloud-m")])
def test_the_answer_names_the_model_that_wrote_it(http, route, model):
    body = {"model": "hybridllm", "messages": MSGS, "hybridllm": {"route": route, "cache": False}}
    r = http.post(CHAT, json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["model"] == "hybridllm"  # the OpenAI field still repeats the request's name
    assert answer["hybridllm"]["route"] == route and answer["hybridllm"]["model"] == model

    s = http.post(CHAT, json={**body, "stream": True, "stream_options": {"include_usage": True}})
    chunks = _events(s.text)[:-1]
    assert all(c["model"] == "hybridllm" for c in chunks)
    last = next(c for c in chunks if c.get("hybridllm"))
    assert last["hybridllm"]["model"] == model


def test_a_cache_hit_names_no_model(http):
    body = {"model": "hybridllm", "messages": MSGS}  # routed (a forced route skips the cache)
    assert http.post(CHAT, json=body).json()["hybridllm"]["model"] in ("device-m", "cloud-m")
    hit = http.post(CHAT, json=body).json()["hybridllm"]
    assert hit["route"] == "cache" and hit["model"] is None


def _preflight(http, origin, method="POST"):
    return http.options(CHAT, headers={"origin": origin, "access-control-request-method": method,
                                       "access-control-request-headers": "authorization,content-type"})


def test_a_refused_preflight_is_an_openai_error_with_the_advice(http):
    r = _preflight(http, "https://evil.example")
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error["code"] == "origin_not_allowed" and error["type"] == "invalid_request_error"
    assert "--allow-origin https://evil.example" in error["message"]


def test_a_preflight_for_another_method_is_an_openai_error(http):
    r = _preflight(http, "http://localhost:3000", method="DELETE")
    assert r.status_code == 400 and r.headers["content-type"] == "application/json"
    assert "DELETE" in r.json()["error"]["message"]
    # the page itself is let in: its CORS headers stay, so it can read why
    assert r.headers["access-control-allow-origin"] == "http://localhost:3000"


def test_an_allowed_preflight_is_unchanged(http):
    r = _preflight(http, "http://localhost:3000")
    assert r.status_code == 200 and r.text == "OK"
    assert r.headers["access-control-allow-origin"] == "http://localhost:3000"
