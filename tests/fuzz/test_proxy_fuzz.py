"""Schemathesis against `hybridllm serve`'s OpenAPI document, on fake backends (fast)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("schemathesis")

from hybridllm import HybridLLM  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402
from tests.cloud_server.api.helpers import ThreadServer  # noqa: E402

from .runner import fuzz  # noqa: E402

CHAT = "POST /v1/chat/completions"


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadServer]:
    # the cache on (a fake-free semantic cache would need the embedder): off keeps this fast; the
    # cache's own paths are tested in tests/cache
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "a short fake answer"), cache=False)
    srv = ThreadServer(create_app(llm)).start()
    yield srv
    srv.stop()
    llm.close()


def test_fuzz_every_operation(server: ThreadServer) -> None:
    report = fuzz(server.url, max_examples=60)
    assert report.failures == [], "\n\n".join(report.failures[:5])
    assert report.server_errors() == 0
    assert report.count(CHAT, 200, "positive") > 20, report.statuses
    assert report.count(CHAT, 400, "negative") > 20, report.statuses
    assert report.seconds < 60
