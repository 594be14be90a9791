"""`hybridllm serve` review 16d (fakes only): a non-finite number (a custom router's NaN score, a
custom cloud's NaN cost or energy) is null in the answer, not a 500 after the answer was made (nor
a bare NaN token in a stream, which no JSON parser but Python's reads), and /stats answers too; a
request forcing the cloud on a server without one names the server's option, not the library's."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import Decision, HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402

CHAT = "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]


class NaNRouter:  # a custom routing policy whose score is NaN
    def decide(self, messages, *, force=None, prompt_tokens=None, embedding=None):
        return Decision("edge", "custom score", math.nan, messages)


def strict(text: str) -> object:
    """JSON as a browser or any strict parser reads it: NaN and Infinity are no JSON."""
    def refuse(token: str) -> object:
        raise ValueError(f"not JSON: {token}")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def http() -> Iterator[TestClient]:
    # (a cloud, or the router is never asked: the device answers everything)
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "one two"), cloud=FakeBackend(model="c"),
                    policy=NaNRouter(), cache=False)
    with TestClient(create_app(llm), raise_server_exceptions=False) as client:
        yield client
    llm.close()


def test_a_nan_router_score_is_null_not_a_500(http):
    r = http.post(CHAT, json={"model": "x", "messages": MSGS})
    assert r.status_code == 200, r.text
    body = strict(r.text)
    assert body["choices"][0]["message"]["content"] == "one two"
    assert body["hybridllm"]["score"] is None and body["hybridllm"]["route"] == "edge"


def test_a_nan_router_score_streams_as_null_not_as_a_bare_nan(http):
    r = http.post(CHAT, json={"model": "x", "messages": MSGS, "stream": True,
                              "stream_options": {"include_usage": True}})
    assert r.status_code == 200
    events = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [strict(e) for e in events[:-1]]  # old: the last chunk held "score":NaN
    last = next(c for c in chunks if c.get("hybridllm"))
    assert last["hybridllm"]["score"] is None


def test_non_finite_cost_and_energy_are_null_in_the_answer_and_in_stats():
    """A custom cloud's cost and energy: ``cost_usd`` NaN (a price it computed) and energy that
    adds NaN to the stats' totals; the answer and /stats both answer, with null."""
    from hybridllm._pipeline import core as _pipeline

    class Cloud:  # every question to the cloud
        def decide(self, messages, *, force=None, prompt_tokens=None, embedding=None):
            return Decision("cloud", "custom", math.inf, messages)

    llm = HybridLLM(edge=FakeBackend(), cloud=FakeBackend(model="c", reply=lambda m: "cloud"),
                    policy=Cloud(), cache=False)
    real = _pipeline._account

    def account(stats, req, c):  # what a cloud with a broken price table or meter reports
        n = real(stats, req, c)
        c.cost_usd, c.energy_j, c.co2_g = math.nan, math.nan, math.inf
        return n

    try:
        _pipeline._account = account
        with TestClient(create_app(llm), raise_server_exceptions=False) as http:
            for stream in (False, True):
                r = http.post(CHAT, json={"model": "x", "messages": MSGS, "stream": stream})
                assert r.status_code == 200, r.text
                if stream:
                    body = [strict(ln[6:]) for ln in r.text.splitlines()
                            if ln.startswith("data: {")][-1]
                else:
                    body = strict(r.text)
                assert body["hybridllm"]["cost_usd"] is None and body["hybridllm"]["score"] is None
            s = http.get("/stats")
            assert s.status_code == 200, s.text
            stats = strict(s.text)
            assert stats["requests"] == 2 and stats["co2_g"] is None
    finally:
        _pipeline._account = real
        llm.close()


def test_forcing_the_cloud_without_one_names_the_servers_option():
    llm = HybridLLM(edge=FakeBackend(), cache=False)
    try:
        with TestClient(create_app(llm)) as http:
            for stream in (False, True):
                r = http.post(CHAT, json={"model": "x", "messages": MSGS, "stream": stream,
                                          "hybridllm": {"route": "cloud"}})
                assert r.status_code == 400, r.text
                error = r.json()["error"]
                # old: "route='cloud' needs a cloud endpoint: pass cloud_url=..." (a keyword the
                # server's user has no way to pass)
                assert "--cloud-url" in error["message"] and "cloud_url=..." not in error["message"]
                assert error["param"] == "hybridllm.route"
            # the device still answers the same request without the forced route
            ok = http.post(CHAT, json={"model": "x", "messages": MSGS})
            assert ok.status_code == 200
    finally:
        llm.close()
