"""A refusal that comes with the first output (a cluster replica's queue full or a prompt too
long, seen by the front end only then) is counted as rejected, not also as a request finished
with an error: the single server counts the same refusal at generate() as rejected only."""

import httpx
import pytest

from cloud_server.api.server import create_app
from cloud_server.exceptions import ContextLengthError, QueueFullError
from tests.cloud_server.api.fake_engine import FakeEngine
from tests.cloud_server.api.helpers import ThreadServer


def _late(exc):
    class LateRefusal(FakeEngine):  # as RemoteEngine: the refusal arrives at the first output
        def generate(self, request_id, prompt, params, on_scheduled=None):
            async def gen():
                raise exc
                yield

            return gen()

    return LateRefusal


@pytest.mark.parametrize("exc, status", [(QueueFullError("queue full", retry_after_s=1.0), 429),
                                         (ContextLengthError("too long"), 400)])
def test_a_late_refusal_is_rejected_not_failed(exc, status):
    server = ThreadServer(create_app(_late(exc), energy="off")).start()
    try:
        r = httpx.post(f"{server.url}/v1/completions",
                       json={"model": "fake-model", "prompt": "hi", "max_tokens": 3})
        assert r.status_code == status
        lines = httpx.get(f"{server.url}/metrics").text.splitlines()
    finally:
        server.stop()
    finished = [ln for ln in lines if ln.startswith("hybridllm_requests_finished_total{")]
    assert all(ln.endswith(" 0.0") for ln in finished), finished
    rejected = [ln for ln in lines if ln.startswith("hybridllm_requests_rejected_total{")]
    assert any(f'status="{status}"' in ln and ln.endswith(" 1.0") for ln in rejected), rejected
