"""A cloud that rate-limits (429) a prompt the device cannot hold is a 429 from `hybridllm serve`.

Before: the pipeline turned the cloud's CloudRateLimitError into a CloudUnavailableError once the
device could not stand in (the prompt past its context), so the proxy's client got 503
``upstream_unavailable`` ("The cloud is unavailable"), the right Retry-After but the wrong status:
measured with a fake cloud answering 429 with a 42 s wait, both the plain and the streamed request
were ``503 upstream_unavailable``. The cloud was up and asked to wait: now 429 ``requests`` with code
``cloud_rate_limited``, its Retry-After and the prompt's numbers; a library caller gets a
CloudRateLimitError that carries them.
"""

from __future__ import annotations

import pytest

from hybridllm import CloudRateLimitError, CloudUnavailableError
from hybridllm.backends.cloud import CloudBackend

from .backends.test_cloud_http import (
    _url,
    server,  # noqa: F401 (the fixture)
)
from .test_context_window import LONG, SHORT, Cloud, client

pytest.importorskip("fastapi")


def _limited() -> CloudRateLimitError:
    return CloudRateLimitError("HTTP 429 from the cloud: slow down", status_code=429, retry_after_s=42)


def _posts(llm, prompt: str = LONG):
    from fastapi.testclient import TestClient

    from hybridllm.proxy import create_app

    req = {"model": "x", "messages": [{"role": "user", "content": prompt}]}
    with TestClient(create_app(llm)) as http:
        return [http.post("/v1/chat/completions", json={**req, "stream": s}) for s in (False, True)]


def test_the_library_raises_a_rate_limit_error_with_the_prompts_numbers():
    llm, edge = client(Cloud(fail=_limited()))
    with llm:
        for call in (lambda: llm.chat(LONG), lambda: list(llm.stream(LONG))):
            with pytest.raises(CloudRateLimitError) as info:
                call()
            err = info.value
            assert (err.prompt_tokens, err.context_length, err.retry_after_s) == (44, 32, 42)
            assert err.status_code == 429 and "rate-limiting" in str(err) and "Retry" in str(err)
    assert edge.generated == 0


def test_the_proxy_answers_429_cloud_rate_limited_with_the_clouds_wait():
    llm, _ = client(Cloud(fail=_limited()))
    for r in _posts(llm):
        assert r.status_code == 429, r.text
        error = r.json()["error"]
        assert error["type"] == "requests" and error["code"] == "cloud_rate_limited", error
        assert "rate-limiting" in error["message"] and "44 tokens" in error["message"]
        assert "(32, n_ctx)" in error["message"]
        assert r.headers["retry-after"] == "42"
    llm.close()


def test_a_cloud_that_is_down_is_still_a_503_and_a_short_prompt_is_answered_on_the_device():
    llm, _ = client(Cloud(fail=CloudUnavailableError("connection refused")))
    for r in _posts(llm):
        assert r.status_code == 503 and r.json()["error"]["type"] == "upstream_unavailable", r.text
    llm.close()
    llm, edge = client(Cloud(fail=_limited()))
    for r in _posts(llm, SHORT):  # the router says edge: the cloud is not asked
        assert r.status_code == 200 and "device answer" in r.text, r.text
    llm.close()


def test_a_real_cloud_answering_429_reaches_the_openai_client_as_a_rate_limit(server):  # noqa: F811
    openai = pytest.importorskip("openai")
    from hybridllm.proxy import create_app
    from tests.cloud_server.api.helpers import ThreadServer

    cloud = CloudBackend(base_url=_url(server, "429-120"), model="m", max_retries=0)
    llm, edge = client(cloud)
    proxy = ThreadServer(create_app(llm)).start()
    try:
        api = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0, timeout=10)
        with pytest.raises(openai.RateLimitError) as info:
            api.chat.completions.create(model="x", messages=[{"role": "user", "content": LONG}])
    finally:
        proxy.stop()
        llm.close()
    err = info.value
    assert err.status_code == 429 and err.code == "cloud_rate_limited", err
    assert 100 < int(err.response.headers["retry-after"]) <= 120
    assert edge.generated == 0
