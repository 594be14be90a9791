"""Review 18: the model each endpoint serves, and the Retry-After waited out when another endpoint
cannot serve (httpx.MockTransport, no network)."""

from __future__ import annotations

import json

import httpx

from hybridllm import CloudUnavailableError
from hybridllm.backends.cloud import CloudBackend
from tests.backends.test_cloud_circuit_review15b import MSGS, P, sse


def test_each_endpoint_is_sent_the_model_it_lists():
    """Before: the name a.test listed was sent to b.test too (which serves another model: a 404)."""
    served = {"a.test": "model-a", "b.test": "model-b"}
    sent = []

    def handler(request):
        host = request.url.host
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": served[host]}]})
        model = json.loads(request.content)["model"]
        sent.append((host, model))
        if model != served[host]:
            return httpx.Response(404, json={"error": {"message": f"model {model} not found"}})
        return sse(f"from {host}")

    b = CloudBackend(base_url=["http://a.test/v1", "http://b.test/v1"], backoff_base_s=0,
                     transport=httpx.MockTransport(handler))
    b.endpoints[1].add(50)  # a first
    assert b.generate(MSGS, P).text == "from a.test"
    b.endpoints[1].done(50)
    b.endpoints[0].add(50)  # then b
    assert b.generate(MSGS, P).text == "from b.test"
    assert sent == [("a.test", "model-a"), ("b.test", "model-b")]


def test_a_configured_model_goes_to_every_endpoint_without_listing():
    seen = []

    def handler(request):
        seen.append((request.url.host, request.url.path))
        assert json.loads(request.content)["model"] == "m"
        return sse("ok")

    b = CloudBackend(base_url=["http://a.test", "http://b.test"], model="m",
                     transport=httpx.MockTransport(handler))
    b.endpoints[1].add(50)
    assert b.generate(MSGS, P).text == "ok"
    b.endpoints[1].done(50)
    b.endpoints[0].add(50)
    assert b.generate(MSGS, P).text == "ok" and b.model == "m"
    assert all(path.endswith("/chat/completions") for _, path in seen)


def test_the_endpoint_whose_retry_after_was_waited_out_is_asked(monkeypatch):
    """a answers 503 with Retry-After 2, b cannot be reached, c's circuit is open. Before: the
    client waited a's 2 s out, then left a out (it had been tried) and raised b's "cannot be
    reached": a wait for nothing, and the device answered though a was ready."""
    slept = []

    async def sleep(s):
        slept.append(s)

    monkeypatch.setattr("hybridllm.backends.cloud_retry._sleep", sleep)
    monkeypatch.setattr("hybridllm.backends.cloud_retry.awake_clock", lambda: 1000.0 + sum(slept))
    calls = []

    def handler(request):
        calls.append(request.url.host)
        if request.url.host == "b.test":
            raise httpx.ConnectError("refused")
        if calls.count("a.test") == 1:
            return httpx.Response(503, headers={"retry-after": "2"}, json={"error": {"message": "busy"}})
        return sse("from a")

    b = CloudBackend(base_url=["http://a.test", "http://b.test", "http://c.test"], model="m",
                     backoff_base_s=0, transport=httpx.MockTransport(handler))
    b.endpoints[2].breaker.trip()
    b.endpoints[1].add(50)  # a first, then b
    try:
        text = b.generate(MSGS, P).text
    except CloudUnavailableError as exc:  # the old code
        raise AssertionError(f"a was not asked after its wait: {exc}; calls {calls}") from exc
    assert text == "from a" and calls == ["a.test", "b.test", "a.test"]
    assert max(slept) >= 2
