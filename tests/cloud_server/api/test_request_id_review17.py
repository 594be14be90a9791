"""X-Request-Id on the cloud server (fake engine, in-process): the client's id (the proxy's) or a new
one on every answer, error and stream included, and in the error lines written about it."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from cloud_server.api.server import create_app

from .fake_engine import FakeEngine

KEY = "sk-test"
MSGS = [{"role": "user", "content": "Hi"}]
BODY = {"model": "fake-model", "messages": MSGS}


@pytest.fixture
def http() -> Iterator[TestClient]:
    with TestClient(create_app(lambda: FakeEngine(), api_keys=[KEY]),
                    headers={"authorization": f"Bearer {KEY}"}) as client:
        yield client


def test_every_answer_sends_the_clients_id_back(http: TestClient) -> None:
    rid = {"x-request-id": "proxy-id-1"}
    answers = {
        "json 200": http.post("/v1/chat/completions", json=BODY, headers=rid),
        "stream 200": http.post("/v1/chat/completions", json={**BODY, "stream": True}, headers=rid),
        "completions": http.post("/v1/completions", json={"model": "fake-model", "prompt": "a"}, headers=rid),
        "400": http.post("/v1/chat/completions", content=b"{", headers=rid),
        "401": http.post("/v1/chat/completions", json=BODY, headers={**rid, "authorization": "Bearer no"}),
        "404 model": http.post("/v1/chat/completions", json={**BODY, "model": "other"}, headers=rid),
        "404": http.get("/nowhere", headers=rid),
        "405": http.delete("/v1/models", headers=rid),
        "health": http.get("/health", headers=rid),
        "metrics": http.get("/metrics", headers=rid),
    }
    for what, r in answers.items():
        assert r.headers.get("x-request-id") == "proxy-id-1", (what, r.status_code)
    statuses = [answers[k].status_code for k in ("400", "401", "404 model", "404", "405")]
    assert statuses == [400, 401, 404, 404, 405]
    assert answers["stream 200"].text.rstrip().endswith("[DONE]")


def test_an_absent_or_unfit_id_is_replaced_by_a_new_one(http: TestClient) -> None:
    for headers in ({}, {"x-request-id": "y" * 129}, {"x-request-id": "a\x7fb"}):
        ids = [http.get("/v1/models", headers=headers).headers["x-request-id"] for _ in range(2)]
        assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids) and ids[0] != ids[1], headers


class _Fails(FakeEngine):
    def generate(self, request_id, prompt, params, on_scheduled=None):  # type: ignore[override]
        raise RuntimeError("internal")


def test_the_error_line_names_the_request(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="cloud_server.api"), \
            TestClient(create_app(lambda: _Fails())) as http:
        r = http.post("/v1/chat/completions", json=BODY, headers={"x-request-id": "trace-9"})
    assert r.status_code == 500 and r.headers["x-request-id"] == "trace-9"
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "cloud_server.api"]
    assert any("internal error" in line and "trace-9" in line for line in lines), lines
