"""What the cloud client says about a failing endpoint (review 19): a retried 5xx names the endpoint
(of several balanced), without its query string; a redirect's Location is quoted without its query
string, fragment or password (a captive portal's token)."""

from __future__ import annotations

import logging

import httpx
import pytest

from hybridllm import CloudRateLimitError, CloudUnavailableError, GenerationParams
from hybridllm.backends.cloud import CloudBackend

MSGS = [{"role": "user", "content": "hi"}]
P = GenerationParams(max_tokens=8)


def backend(handler, url="http://cloud.test/v1?key=SECRET-123", **kw):
    return CloudBackend(base_url=url, transport=httpx.MockTransport(handler), backoff_base_s=0.0,
                        remember_refusals=False, model="m", **kw)


@pytest.mark.parametrize("status", [500, 503, 429])
def test_a_retried_failure_names_the_endpoint_without_its_key(status):
    b = backend(lambda request: httpx.Response(status, text="boom"), max_retries=1)
    with pytest.raises(CloudRateLimitError if status == 429 else CloudUnavailableError) as err:
        b.generate(MSGS, P)
    text = str(err.value)
    # before: "The cloud failed after 2 attempts: HTTP 500: boom", no word of which endpoint
    assert text.startswith(f"The cloud failed after 2 attempts: HTTP {status}: boom"), text
    assert "http://cloud.test/v1/chat/completions" in text and "SECRET" not in text, text


def test_a_redirect_quotes_where_it_points_without_its_query_or_password(caplog):
    where = "https://user:hunter2@portal.test/login?token=TOK-42&next=x#frag"
    b = backend(lambda request: httpx.Response(302, headers={"location": where}), max_retries=0)
    with caplog.at_level(logging.INFO, logger="hybridllm"), pytest.raises(CloudUnavailableError) as err:
        b.generate(MSGS, P)
    told = " ".join([str(err.value), b.unavailable_reason(), caplog.text])
    # before: the Location in full, its token and password with it
    assert "TOK-42" not in told and "hunter2" not in told and "frag" not in told, told
    assert "a redirect to https://***@portal.test/login:" in str(err.value), str(err.value)


def test_a_relative_redirect_is_still_quoted():
    b = backend(lambda request: httpx.Response(307, headers={"location": "/v2/chat?sig=abc"}),
                max_retries=0)
    with pytest.raises(CloudUnavailableError, match=r"a redirect to /v2/chat: set cloud_url") as err:
        b.generate(MSGS, P)
    assert "abc" not in str(err.value)
