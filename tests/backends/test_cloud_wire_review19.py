"""The cloud client's errors on odd answers (review 19): a key in the URL's query string never in an
error, a warning or a reason; a model list whose first id is null or empty is no model name."""

from __future__ import annotations

import logging

import httpx
import pytest

from hybridllm import CloudUnavailableError, GenerationParams
from hybridllm.backends.cloud import CloudBackend

MSGS = [{"role": "user", "content": "hi"}]
P = GenerationParams(max_tokens=8)
SSE = 'data: {"choices":[{"delta":{"content":"x"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'


def backend(handler, url="http://cloud.test/v1?key=SECRET-123&api-version=2024", **kw):
    return CloudBackend(base_url=url, transport=httpx.MockTransport(handler), backoff_base_s=0.0,
                        max_retries=0, remember_refusals=False, **kw)


@pytest.mark.parametrize("status", [404, 302, 500, 413])
def test_a_key_in_the_query_string_is_in_no_error_warning_or_reason(status, caplog):
    seen = []

    def handler(request):
        seen.append(request.url)
        return httpx.Response(status, text="nope", headers={"location": "https://elsewhere.test/"})

    b = backend(handler, model="m")
    with caplog.at_level(logging.INFO, logger="hybridllm"), pytest.raises(CloudUnavailableError) as err:
        b.generate(MSGS, P)
    assert seen and all(u.params["key"] == "SECRET-123" for u in seen)  # it still goes with the request
    told = [str(err.value), b.unavailable_reason(), *(e.last_failure or "" for e in b.endpoints),
            caplog.text]
    # before: "HTTP 404 from .../completions?key=SECRET-123"
    assert not [t for t in told if "SECRET" in t], told
    assert f"HTTP {status}" in str(err.value) and "http://cloud.test/v1/chat/completions" in " ".join(told)


def test_a_listing_error_does_not_show_the_key_either():
    b = backend(lambda request: httpx.Response(410, text="gone"))
    with pytest.raises(CloudUnavailableError) as err:
        b.generate(MSGS, P)
    assert "SECRET" not in str(err.value) and "http://cloud.test/v1/models" in str(err.value)


@pytest.mark.parametrize("listed", [[{"id": None}], [{"id": ""}], [{"id": "  "}], [{"id": {"x": 1}}]])
def test_a_model_list_without_a_name_is_no_model(listed):
    """Before: {"id": null} sent the model "None" to the server (and "" sent an empty name)."""
    posted = []

    def handler(request):
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": listed})
        posted.append(request)
        return httpx.Response(200, text=SSE, headers={"content-type": "text/event-stream"})

    b = backend(handler, url="http://cloud.test")
    with pytest.raises(CloudUnavailableError, match=r"could not list models at http://cloud.test/v1: "
                                                    r"its first model has no name"):
        b.generate(MSGS, P)
    assert posted == []


def test_an_empty_model_list_says_so():
    b = backend(lambda r: httpx.Response(200, json={"data": []}), url="http://cloud.test")
    with pytest.raises(CloudUnavailableError, match="could not list models at http://cloud.test/v1: "
                                                    "it lists no model"):
        b.generate(MSGS, P)


def test_a_numeric_model_id_is_still_a_name():
    def handler(request):
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": 7}]})
        return httpx.Response(200, text=SSE, headers={"content-type": "text/event-stream"})

    b = backend(handler, url="http://cloud.test")
    assert b.generate(MSGS, P).text == "x" and b.model == "7"
