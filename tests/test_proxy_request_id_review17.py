"""X-Request-Id on `hybridllm serve` (fakes, fast): the client's id or a new one on every answer,
in the error lines written about the request, and forwarded to the cloud (the cloud server app in
front of which the proxy runs: one id traces a question through both)."""

from __future__ import annotations

import logging
import re

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm._types import Usage  # noqa: E402
from hybridllm.backends.base import Delta  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402

MSGS = [{"role": "user", "content": "hi"}]
BODY = {"model": "x", "messages": MSGS}
NEW_ID = re.compile(r"[0-9a-f]{32}")


@pytest.fixture
def http():
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "one two"), cache=False)
    with TestClient(create_app(llm, api_keys=["k"], allow_hosts=["testserver"]),
                    headers={"authorization": "Bearer k"}) as client:
        yield client
    llm.close()


def test_every_answer_sends_the_clients_id_back(http):
    rid = {"x-request-id": "trace-42"}
    answers = {
        "json 200": http.post("/v1/chat/completions", json=BODY, headers=rid),
        "stream 200": http.post("/v1/chat/completions", json={**BODY, "stream": True}, headers=rid),
        "400": http.post("/v1/chat/completions", json={"model": "x"}, headers=rid),
        "401": http.get("/v1/models", headers={**rid, "authorization": "Bearer wrong"}),
        "403 host": http.get("/health", headers={**rid, "host": "evil.example"}),
        "404": http.get("/nowhere", headers=rid),
        "405": http.get("/v1/chat/completions", headers=rid),
        "health": http.get("/health", headers=rid),
    }
    for what, r in answers.items():
        assert r.headers.get("x-request-id") == "trace-42", (what, r.status_code, r.headers)
    assert answers["stream 200"].text.rstrip().endswith("[DONE]")
    statuses = [answers[k].status_code for k in ("400", "401", "403 host", "404", "405")]
    assert statuses == [400, 401, 403, 404, 405]


@pytest.mark.parametrize("given", [None, "", "x" * 129, "caf\u00e9", "a\tb"])
def test_an_absent_or_unfit_id_is_replaced_by_a_new_one(http, given):
    headers = {} if given is None else {"x-request-id": given.encode("utf-8")}
    ids = [http.post("/v1/chat/completions", json=BODY, headers=headers).headers["x-request-id"]
           for _ in range(2)]
    assert all(NEW_ID.fullmatch(i) for i in ids) and ids[0] != ids[1]


def test_the_longest_id_kept_is_128_characters(http):
    rid = "a" * 128
    assert http.get("/health", headers={"x-request-id": rid}).headers["x-request-id"] == rid


class _Breaks(FakeBackend):
    def stream(self, messages, params):
        yield Delta("partial", None, Usage(), None)
        raise RuntimeError("boom")


def test_error_lines_name_the_request(caplog):
    llm = HybridLLM(edge=_Breaks(), cache=False)
    with caplog.at_level(logging.INFO, logger="hybridllm.proxy"), TestClient(create_app(llm)) as http:
        r = http.post("/v1/chat/completions", json={**BODY, "stream": True}, headers={"x-request-id": "t-7"})
    llm.close()
    assert r.headers["x-request-id"] == "t-7"
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "hybridllm.proxy"]
    assert any("stream failed" in line and "t-7" in line for line in lines), lines


def test_a_line_logged_outside_a_request_is_left_as_it_was(caplog):
    llm = HybridLLM(edge=FakeBackend(), cache=False)
    create_app(llm)  # installs the log filter
    llm.close()
    with caplog.at_level(logging.INFO, logger="hybridllm.proxy"):
        logging.getLogger("hybridllm.proxy").info("plain %s", "line")
    assert [rec.getMessage() for rec in caplog.records] == ["plain line"]


def _cloud_seeing(ids: list[str | None]):
    """The cloud server's app on a fake engine, noting each /v1 request's X-Request-Id."""
    from cloud_server.api.server import create_app as cloud_app
    from tests.cloud_server.api.fake_engine import FakeEngine

    app = cloud_app(lambda: FakeEngine())

    async def noting(scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1/chat"):
            ids.append(dict(scope["headers"]).get(b"x-request-id", b"").decode() or None)
        await app(scope, receive, send)

    return noting


def test_the_proxy_forwards_its_request_id_to_the_cloud():
    from tests.cloud_server.api.helpers import ThreadServer

    seen: list[str | None] = []
    srv = ThreadServer(_cloud_seeing(seen)).start()
    llm = HybridLLM(edge=FakeBackend(), cloud_url=srv.url, cache=False)
    cloud = {**BODY, "hybridllm": {"route": "cloud"}}
    try:
        with TestClient(create_app(llm)) as http:
            given = http.post("/v1/chat/completions", json=cloud, headers={"x-request-id": "q-1"})
            made = http.post("/v1/chat/completions", json={**cloud, "stream": True})
            local = http.post("/v1/chat/completions", json={**BODY, "hybridllm": {"route": "edge"}},
                              headers={"x-request-id": "q-2"})
    finally:
        llm.close()
        srv.stop()
    assert given.status_code == made.status_code == local.status_code == 200, (given.text, made.text)
    assert given.headers["x-hybridllm-route"].startswith("cloud")
    assert seen == ["q-1", made.headers["x-request-id"]]  # the device's answer sent nothing
