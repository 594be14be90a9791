"""The cache key with a cloud but no cloud_model names the cloud's endpoints (review 21): before it
was "edge|cloud" whatever cloud_url pointed at, so a new server was served the old one's answers.
The endpoints are named normalised (order, case, default port, trailing slash) and without their
credentials or query string (fast: fakes, a mock transport, a temporary cache file)."""

from __future__ import annotations

import json

import httpx
import pytest

from hybridllm import Decision, HybridLLM
from hybridllm.backends.cloud import CloudBackend
from hybridllm.backends.fake import FakeBackend

SECRETS = ("hunter2", "s3cr3t-query-key", "sk-the-api-key")


class ToCloud:
    def decide(self, msgs, *, force=None, prompt_tokens=None, embedding=None):
        return Decision("cloud", "score 0.9", 0.9, msgs)

    def should_escalate(self, lp):
        return False


class KeyCache:
    """Exact repeats keyed by the model part the pipeline passes, which it records."""

    def __init__(self) -> None:
        self.entries: dict = {}
        self.models: list[str] = []

    def get(self, msgs, *, model, **kw):
        self.models.append(model)
        text = self.entries.get((model, str(msgs)))
        return None if text is None else type("Hit", (), {"text": text, "similarity": 1.0,
                                                          "verifier_prob": None, "metadata": None})()

    def put(self, msgs, text, *, model, **kw):
        self.models.append(model)
        self.entries[(model, str(msgs))] = text
        return "id"


def _server(says: str):
    """An OpenAI-compatible server that lists one model and answers ``says``."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": [{"id": "served"}]})
        body = {"model": "served", "choices": [{"message": {"content": says}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
        return httpx.Response(200, json=body)

    return httpx.MockTransport(handler)


def _client(urls, cache, *, says: str = "answer", model: str | None = None, **kw) -> HybridLLM:
    cloud = CloudBackend(base_url=urls, model=model, transport=_server(says), remember_refusals=False,
                         **kw)
    return HybridLLM(edge=FakeBackend(model="edge-m"), cloud=cloud, cache=cache, policy=ToCloud(),
                     temperature=0)


def _key(urls, **kw) -> str:
    with _client(urls, False, **kw) as llm:
        return llm._core.cache_model


def _sqlite_cache(path):
    from hybridllm.cache import SemanticCache
    from tests.cache.fakes import FakeEmbedder

    return SemanticCache(path, verifier=None, embedder=FakeEmbedder())


def test_another_server_is_not_served_the_old_servers_answers(tmp_path):
    path = tmp_path / "c.sqlite3"
    with _client("http://old.test", _sqlite_cache(path), says="old answer") as llm:
        assert llm.chat("what is new?").route == "cloud"
        assert llm.chat("what is new?").route == "cache"  # the cache works
    with _client("http://new.test", _sqlite_cache(path), says="new answer") as llm:
        c = llm.chat("what is new?")
    # before: ("cache", "old answer")
    assert (c.route, c.text) == ("cloud", "new answer")


def test_the_same_endpoints_written_otherwise_share_the_cache(tmp_path):
    """Listed in another order, the host in capitals, a default port, a trailing slash,
    /v1 or not, credentials or a query string: the same servers, the same answers."""
    path = tmp_path / "c.sqlite3"
    with _client(["http://a.test/v1", "https://b.test:8443/x"], _sqlite_cache(path)) as llm:
        assert llm.chat("what is new?").route == "cloud"
    same = ["https://user:hunter2@B.Test:8443/x/?api-version=1", "http://A.TEST:80/"]
    with _client(same, _sqlite_cache(path)) as llm:
        assert llm.chat("what is new?").route == "cache"


@pytest.mark.parametrize("other", [
    "http://a.test:8001", "https://a.test:8000", "http://b.test:8000", "http://a.test:8000/other/v1",
    ["http://a.test:8000", "http://b.test"]], ids=["port", "scheme", "host", "path", "one more"])
def test_another_endpoint_is_another_key(other):
    # before: every one of them "edge-m|cloud"
    assert _key("http://a.test:8000") != _key(other)


def test_the_key_names_the_endpoints_normalised_and_sorted():
    key = _key(["https://b.test:443/v1/", "http://[::1]:8000", "http://A.test"])
    assert key == "edge-m|cloud@http://[::1]:8000/v1 http://a.test/v1 https://b.test/v1"


def test_carbon_endpoints_are_part_of_the_key():
    carbon = [{"url": "http://green.test", "region": "se", "carbon_intensity": 40}]
    assert _key("http://a.test", carbon=carbon) == "edge-m|cloud@http://a.test/v1 http://green.test/v1"


def test_no_secret_reaches_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDLLM_CLOUD_API_KEY", SECRETS[2])
    urls = ["https://me:hunter2@a.test/v1?key=s3cr3t-query-key", "http://b.test/?token=s3cr3t-query-key"]
    cache = KeyCache()
    with _client(urls, cache) as llm:
        llm.chat("what is new?")
        assert llm.chat("what is new?").route == "cache"
    assert cache.models and not any(s in m for m in cache.models for s in SECRETS)
    path = tmp_path / "c.sqlite3"
    with _client(urls, _sqlite_cache(path)) as llm:
        llm.chat("what is new?")
    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert not any(s.encode() in stored for s in SECRETS)


def test_a_configured_cloud_model_keeps_its_key():
    """Keys that named a model are unchanged (their caches stay valid), whatever the endpoints."""
    assert _key("http://a.test", model="gpt-4o") == "edge-m|cloud:gpt-4o"
    assert _key("http://b.test", model="gpt-4o") == "edge-m|cloud:gpt-4o"


def test_a_cloud_without_endpoints_keeps_its_key():
    for cloud, key in ((FakeBackend(model="cloud"), "edge-m|cloud"),
                       (FakeBackend(model="cloud-m"), "edge-m|cloud:cloud-m"), (None, "edge-m")):
        with HybridLLM(edge=FakeBackend(model="edge-m"), cloud=cloud, cache=False) as llm:
            assert llm._core.cache_model == key


def test_a_discovered_model_does_not_move_the_key():
    """The key is fixed when the client is built: the model the endpoint lists later and the one its
    answer names do not change it (the answers written stay found)."""
    cache = KeyCache()
    with _client("http://a.test", cache) as llm:
        key = llm._core.cache_model
        llm.chat("what is new?")
        assert llm.chat("what is new?").route == "cache"
    assert set(cache.models) == {key}
    assert json.dumps(key)  # a plain string


def test_a_backend_whose_endpoints_hold_credentials_keys_without_them():
    """The key is rebuilt from the URL's parts: a cloud backend of the app's own that names its
    endpoints with their user:password@ or ?key= still puts none of it in the key."""
    from types import SimpleNamespace

    cloud = FakeBackend(model="cloud")
    cloud.endpoints = [SimpleNamespace(base_url="https://me:hunter2@A.test:443/v1/?key=s3cr3t-query-key#x"),
                       SimpleNamespace(base_url=None)]
    with HybridLLM(edge=FakeBackend(model="edge-m"), cloud=cloud, cache=False) as llm:
        assert llm._core.cache_model == "edge-m|cloud@https://a.test/v1"
