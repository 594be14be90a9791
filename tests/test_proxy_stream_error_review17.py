"""A stream that fails after its headers ends with an in-band error whose ``code`` is a string or
null, as in OpenAI's error objects and the proxy's own JSON errors (fakes, fast).

Before: ``code`` was the HTTP status the error would have had, an integer (500, 503), which a
client typed on OpenAI's schema (``code: str | None``) could not read."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm._exceptions import ContextWindowExceededError, EdgeBusyError  # noqa: E402
from hybridllm._types import Usage  # noqa: E402
from hybridllm.backends.base import Delta  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402

BODY = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _breaking(error: Exception) -> FakeBackend:
    class Breaks(FakeBackend):
        def stream(self, messages, params):
            yield Delta("partial", None, Usage(), None)
            raise error
    return Breaks()


def _last_error(error: Exception) -> dict:
    llm = HybridLLM(edge=_breaking(error), cache=False)
    try:
        with TestClient(create_app(llm)) as http:
            r = http.post("/v1/chat/completions", json=BODY)
    finally:
        llm.close()
    assert r.status_code == 200, r.text
    events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events
    return json.loads(events[-2])["error"]


@pytest.mark.parametrize(("error", "etype", "code"), [
    (RuntimeError("boom"), "server_error", None),
    (EdgeBusyError("busy"), "requests", "rate_limit_exceeded"),
    (ContextWindowExceededError("too long"), "invalid_request_error", "context_length_exceeded"),
])
def test_an_in_band_errors_code_is_a_string_or_null(error, etype, code):
    body = _last_error(error)
    assert (body["type"], body["code"]) == (etype, code), body
    assert "boom" not in body["message"]
