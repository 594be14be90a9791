"""``hybridllm serve`` bounds each stop string's length as the cloud server does (one shared request
model): a megabyte-long one is OpenAI's 400 with param "stop", and never reaches a backend."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402
from hybridllm.wire.requests import MAX_STOP_CHARS  # noqa: E402

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


@pytest.mark.parametrize("stop", ["s" * 1_000_000, ["\n", "s" * (MAX_STOP_CHARS + 1)]])
def test_an_overlong_stop_string_is_a_400_on_the_device(http, edge, stop) -> None:
    r = http.post("/v1/chat/completions", json={"model": "x", "messages": MSGS, "stop": stop})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "stop" and str(MAX_STOP_CHARS) in err["message"]
    assert edge.calls == []


def test_a_stop_string_at_the_bound_is_served(http, edge) -> None:
    r = http.post("/v1/chat/completions",
                  json={"model": "x", "messages": MSGS, "stop": "s" * MAX_STOP_CHARS})
    assert r.status_code == 200, r.text
