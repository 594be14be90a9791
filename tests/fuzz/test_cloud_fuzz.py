"""Schemathesis against the cloud server's OpenAPI document (fake engine: fast, every operation).

The real engine gets its own, smaller run in ``tests/cloud_server/api/test_hardening.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("schemathesis")

from cloud_server.api.server import create_app  # noqa: E402
from hybridllm.wire.requests import MAX_MODEL_CHARS  # noqa: E402
from tests.cloud_server.api.fake_engine import FakeEngine  # noqa: E402
from tests.cloud_server.api.helpers import ThreadServer  # noqa: E402

from .runner import fuzz  # noqa: E402

KEY = "sk-fuzz"
POSTS = ("POST /v1/chat/completions", "POST /v1/completions")


def served_model(case: Any) -> None:
    """Name the served model where the fuzzer wrote some string, so requests reach the engine; a
    name past the schema's bounds (empty, or too long) is left as it is (a negative case the server
    must refuse)."""
    model = case.body.get("model") if isinstance(case.body, dict) else None
    if isinstance(model, str) and 1 <= len(model) <= MAX_MODEL_CHARS:
        case.body["model"] = "fake-model"


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadServer]:
    engine = FakeEngine(max_num_seqs=8, max_waiting=256, max_model_len=512, step_s=0.0002)
    srv = ThreadServer(create_app(lambda: engine, api_keys=[KEY])).start()
    yield srv
    srv.stop()


def test_fuzz_every_operation(server: ThreadServer) -> None:
    report = fuzz(server.url, max_examples=40, prepare=served_model,
                  headers={"Authorization": f"Bearer {KEY}"})
    assert report.failures == [], "\n\n".join(report.failures[:5])
    assert report.server_errors() == 0
    for op in POSTS:  # the fuzzer reached the request logic, and its bad requests were refused
        assert report.count(op, 200, "positive") > 10, report.statuses
        assert report.count(op, 400, "negative") > 10, report.statuses
    assert report.seconds < 60


def test_fuzz_without_the_key_is_all_401(server: ThreadServer) -> None:
    report = fuzz(server.url, max_examples=5, prepare=served_model, operations=set(POSTS))
    assert report.failures == [], "\n\n".join(report.failures[:5])
    assert {status for (_, _, status) in report.statuses} == {401}
