"""`hybridllm serve`'s 429 for a busy device (review 20): a code, and the error's own wait (fakes).

Before: the body's ``code`` was null, where OpenAI's clients and LiteLLM look for one (OpenAI's
429s say ``rate_limit_exceeded``); and the Retry-After ignored what the device worker knew (the
error's ``retry_after_s``), estimating from the proxy's own clock alone.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm._exceptions import EdgeBusyError  # noqa: E402
from hybridllm._proxy_errors import _retry_after_s, code_of  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import DEVICE_WAIT_MAX_S, DeviceClock, create_app  # noqa: E402

BODY = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}


def _llm_stub(waiting: int):
    worker = SimpleNamespace(num_waiting=waiting)
    return SimpleNamespace(_core=SimpleNamespace(edge_worker=worker, ledger=None, cloud=None))


@pytest.mark.parametrize(("retry_after_s", "expected"), [
    (12.2, 13),  # the worker's own estimate, rounded up
    (0.1, 1),  # at least a second
    (1e6, DEVICE_WAIT_MAX_S),  # capped as before
    (float("inf"), DEVICE_WAIT_MAX_S),
])
def test_the_errors_own_wait_is_preferred(retry_after_s, expected):
    device = DeviceClock()
    device.service_s = 5.0  # the proxy's clock alone would say 5 s
    exc = EdgeBusyError("busy", retry_after_s=retry_after_s)
    assert _retry_after_s(exc, _llm_stub(0), device) == expected


def test_without_the_errors_wait_the_proxys_clock_still_answers():
    device = DeviceClock()
    device.service_s = 2.5
    assert _retry_after_s(EdgeBusyError("busy"), _llm_stub(2), device) == 8


def test_a_busy_device_429_has_openais_rate_limit_code():
    assert code_of(EdgeBusyError("busy")) == "rate_limit_exceeded"

    class Busy(FakeBackend):
        def stream(self, messages, params):
            raise EdgeBusyError("the device is busy", retry_after_s=7.5)
            yield  # a generator

    llm = HybridLLM(edge=Busy(), cache=False)
    try:
        with TestClient(create_app(llm)) as http:
            r = http.post("/v1/chat/completions", json=BODY)
    finally:
        llm.close()
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "rate_limit_exceeded", r.json()
    assert r.json()["error"]["type"] == "requests"
    assert r.headers["retry-after"] == "8"
