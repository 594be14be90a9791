"""`hybridllm serve` takes at most 4 stop strings (OpenAI's bound; HybridLLM's ``MAX_STOP``), while the
wire format it shares with the cloud server takes 32. Before: five were refused only past the door,
by HybridLLM, as a 400 with ``param`` null, and the proxy's OpenAPI document said 32 were fine (a
client or fuzzer built from it sent 5 to 32 and got a 400). Now the 400 names ``stop``, as OpenAI's
does, and the document says 4."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm._types import MAX_STOP  # noqa: E402
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


@pytest.mark.parametrize("stream", [False, True])
def test_five_stop_strings_are_a_400_naming_stop(http, edge, stream) -> None:
    r = http.post("/v1/chat/completions", json={"model": "x", "messages": MSGS, "stream": stream,
                                                "stop": list("abcde")})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["type"]) == ("stop", "invalid_request_error")
    assert "at most 4" in error["message"] and "5 stop strings" in error["message"]
    assert edge.calls == []


@pytest.mark.parametrize("stop", [list("abcd"), ["", "a", "b", "c", "d"], "a"])
def test_four_stop_strings_and_empty_ones_still_pass(http, edge, stop) -> None:
    """Empty strings stop nothing and are dropped, as before: they do not count."""
    r = http.post("/v1/chat/completions", json={"model": "x", "messages": MSGS, "stop": stop})
    assert r.status_code == 200, r.text
    assert len(edge.calls) == 1


def test_the_document_says_four(http) -> None:
    doc = http.get("/openapi.json").json()
    ref = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    schema = doc["components"]["schemas"][ref["schema"]["$ref"].rsplit("/", 1)[1]]
    lists = [alt for alt in schema["properties"]["stop"]["anyOf"] if alt.get("type") == "array"]
    assert [alt["maxItems"] for alt in lists] == [MAX_STOP] == [4]
