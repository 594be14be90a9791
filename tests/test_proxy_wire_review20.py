"""``hybridllm serve`` with the shared request model's edge cases: a blank ``model`` and an empty
``tools`` array are 400s naming the field, as OpenAI answers them; a body that is not UTF-8 is told
so; more than 4 stop strings stay a 400 here (the device library takes OpenAI's 4, since its cloud
route may be OpenAI), never reaching a backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402

MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture
def edge() -> FakeBackend:
    return FakeBackend(reply=lambda m: "one two three")


@pytest.fixture
def http(edge: FakeBackend) -> Iterator[TestClient]:
    llm = HybridLLM(edge=edge, cache=False)
    with TestClient(create_app(llm)) as client:
        yield client
    llm.close()


@pytest.mark.parametrize(("extra", "param"), [
    ({"model": ""}, "model"),
    ({"tools": []}, "tools"),
    ({"response_format": {"type": "text", "json_schema": {"name": "x"}}}, "response_format.json_schema"),
])
def test_openais_400s_name_the_field_and_reach_no_backend(http, edge, extra, param) -> None:
    r = http.post("/v1/chat/completions", json={"model": "x", "messages": MSGS, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert edge.calls == []


def test_five_stop_strings_are_a_clear_400_on_the_device(http, edge) -> None:
    r = http.post("/v1/chat/completions", json={"model": "x", "messages": MSGS, "stop": list("abcde")})
    assert r.status_code == 400, r.text
    assert "at most 4" in r.json()["error"]["message"]
    assert edge.calls == []


def test_a_body_that_is_not_utf8_is_told_so(http) -> None:
    body = b'{"model": "x", "messages": [{"role": "user", "content": "caf\xe9"}]}'
    r = http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert "not valid UTF-8" in r.json()["error"]["message"]
