"""A request with tools while the cloud is down or rate-limiting (review 40, fakes).

Only the cloud model calls tools, so the device cannot answer such a request instead, and the proxy
answers 503 (429 for the cloud's rate limit). Before, its message gave the wrong reason: "the prompt
(7 tokens) is past the device model's context (4096, n_ctx)", for a prompt of a few words, so the
user went looking for a long conversation to trim. The library's error carries the prompt's size
for both reasons; one that fits the context was refused for its tools.
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm._exceptions import CloudRateLimitError, CloudUnavailableError  # noqa: E402
from hybridllm._proxy_errors import status_of  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
ASK = [{"role": "user", "content": "what is the weather in Paris"}]


@pytest.mark.parametrize("stream", [False, True])
def test_a_dead_cloud_with_tools_says_the_tools_not_the_context(stream):
    cloud = FakeBackend(model="cloud-model", fail=RuntimeError("connection refused"))
    llm = HybridLLM(edge=FakeBackend(), cloud=cloud, cache=False)
    try:
        with TestClient(create_app(llm)) as http:
            body = {"model": "x", "messages": ASK, "tools": [WEATHER], "stream": stream}
            r = http.post("/v1/chat/completions", json=body)
    finally:
        llm.close()
    assert r.status_code == 503, r.text
    message = r.json()["error"]["message"]
    assert "tools" in message and "context" not in message, message
    assert "connection refused" not in message  # the cloud's own words stay in the log
    assert int(r.headers["retry-after"]) >= 1


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (CloudUnavailableError("down", prompt_tokens=7, context_length=4096), 503),
        (CloudRateLimitError("429", status_code=429, prompt_tokens=7, context_length=4096), 429),
    ],
)
def test_a_prompt_that_fits_the_device_is_not_called_too_long(error, status):
    got, _, message = status_of(error)
    assert got == status
    assert "tools" in message and "past the device model's context" not in message, message


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (CloudUnavailableError("down", prompt_tokens=5000, context_length=4096), 503),
        (CloudRateLimitError("429", status_code=429, prompt_tokens=5000, context_length=4096), 429),
    ],
)
def test_a_prompt_past_the_context_still_says_so(error, status):
    got, _, message = status_of(error)
    assert got == status
    assert "(5000 tokens) is past the device model's context (4096, n_ctx)" in message, message
