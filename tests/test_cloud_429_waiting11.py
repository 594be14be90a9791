"""While the cloud's 429 Retry-After is being waited out, a prompt only the cloud can hold is a
rate limit (429), not an outage (503).

Before: the first long prompt got the cloud's 429 (CloudRateLimitError), but the cloud then counted
as unavailable until its Retry-After (120 s here, past ``backoff_max_s``) ended, and the next long
prompt took the pipeline's "cloud unavailable" branch: a CloudUnavailableError, so `hybridllm
serve` answered 503 ``upstream_unavailable`` for the same rate limit. Now CloudBackend says it is
rate-limited and the request gets CloudRateLimitError / 429 ``cloud_rate_limited`` with the wait
left, and without asking the cloud again.
"""

from __future__ import annotations

import pytest

from hybridllm import CloudRateLimitError, CloudUnavailableError
from hybridllm.backends.cloud import CloudBackend

from .backends.test_cloud_http import (
    _url,
    server,  # noqa: F401 (the fixture)
)
from .test_context_window import LONG, Cloud, client


def test_the_second_long_prompt_while_waiting_out_a_429_is_a_rate_limit(server):  # noqa: F811
    cloud = CloudBackend(base_url=_url(server, "429-120"), model="m", max_retries=0)
    llm, edge = client(cloud)
    with llm:
        with pytest.raises(CloudRateLimitError):  # the cloud's own answer
            llm.chat(LONG)
        assert not cloud.is_available() and cloud.rate_limited()
        for call in (lambda: llm.chat(LONG), lambda: list(llm.stream(LONG))):
            with pytest.raises(CloudRateLimitError) as info:
                call()
            err = info.value
            assert err.status_code == 429 and "rate-limiting" in str(err), err
            assert 100 < err.retry_after_s <= 120 and err.prompt_tokens == 44
    assert edge.generated == 0


def test_the_proxy_answers_429_while_the_wait_lasts(server):  # noqa: F811
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hybridllm.proxy import create_app

    cloud = CloudBackend(base_url=_url(server, "429-120"), model="m", max_retries=0)
    llm, _ = client(cloud)
    req = {"model": "x", "messages": [{"role": "user", "content": LONG}]}
    with TestClient(create_app(llm)) as http:
        first = http.post("/v1/chat/completions", json=req)
        later = [http.post("/v1/chat/completions", json={**req, "stream": s}) for s in (False, True)]
    llm.close()
    for r in (first, *later):
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "cloud_rate_limited", r.text
        assert 100 < int(r.headers["retry-after"]) <= 120


def test_a_cloud_that_is_down_is_still_unavailable():
    llm, _ = client(Cloud(fail=CloudUnavailableError("connection refused")))
    with llm, pytest.raises(CloudUnavailableError) as info:
        llm.chat(LONG)
    assert not isinstance(info.value, CloudRateLimitError)


def test_a_custom_cloud_whose_rate_limited_raises_is_taken_as_down():
    class Broken(Cloud):
        def is_available(self) -> bool:
            return False

        def rate_limited(self) -> bool:
            raise RuntimeError("boom")

    llm, _ = client(Broken())
    with llm, pytest.raises(CloudUnavailableError) as info:
        llm.chat(LONG)
    assert not isinstance(info.value, CloudRateLimitError)
