"""`hybridllm serve`'s Retry-After when a cloud's wait is not a finite number.

Before: a custom cloud backend whose ``retry_after_s()`` said ``inf`` or ``NaN`` (or that raised a
``CloudError`` with such a ``retry_after_s``) made ``math.ceil`` raise, and the client got a 500
"server_error" with no Retry-After instead of the 503 (or 429) saying when to come back. Now inf is
the longest wait (300 s for the cloud; an hour for a budget) and NaN is "not known" (1 s; an hour).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm._exceptions import (  # noqa: E402
    CloudBudgetSpentError,
    CloudRateLimitError,
    CloudUnavailableError,
)
from hybridllm._proxy_errors import _retry_after_s  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import CLOUD_WAIT_MAX_S, NEVER_S, DeviceClock, create_app  # noqa: E402

LONG = [{"role": "user", "content": "word " * 50}]  # past the edge's context: only the cloud can


class _Cloud(FakeBackend):
    def __init__(self, wait: float | None, **kw) -> None:
        super().__init__(**kw)
        self.wait = wait

    def retry_after_s(self) -> float | None:
        return self.wait


@pytest.mark.parametrize(("wait", "error_wait", "expected"), [
    (float("inf"), None, CLOUD_WAIT_MAX_S),
    (float("nan"), None, 1),
    (None, float("inf"), CLOUD_WAIT_MAX_S),
    (None, float("nan"), 1),
])
@pytest.mark.parametrize("stream", [False, True])
def test_a_cloud_wait_that_is_no_finite_number_is_still_a_503_with_retry_after(
        wait, error_wait, expected, stream):
    cloud = _Cloud(wait, fail=CloudUnavailableError("down", retry_after_s=error_wait))
    llm = HybridLLM(edge=FakeBackend(context_length=8), cloud=cloud, cache=False)
    try:
        with TestClient(create_app(llm), raise_server_exceptions=False) as http:
            r = http.post("/v1/chat/completions", json={"model": "x", "messages": LONG, "stream": stream})
    finally:
        llm.close()
    assert r.status_code == 503, r.text
    assert r.json()["error"]["type"] == "upstream_unavailable"
    assert r.headers["retry-after"] == str(expected)


def test_non_finite_waits_of_each_kind_give_whole_seconds():
    llm = SimpleNamespace(_core=SimpleNamespace(ledger=None, cloud=None))
    device = DeviceClock()
    for wait, cloud_s, budget_s in ((float("inf"), CLOUD_WAIT_MAX_S, NEVER_S),
                                    (float("nan"), 1, NEVER_S), (float("-inf"), 1, 1), (2.5, 3, 3),
                                    (-4.0, 1, 1), (1e300, CLOUD_WAIT_MAX_S, int(1e300))):
        assert _retry_after_s(CloudRateLimitError("429", retry_after_s=wait), llm, device) == cloud_s
        spent = CloudBudgetSpentError("spent", reason="r", retry_after_s=wait)
        assert _retry_after_s(spent, llm, device) == budget_s
