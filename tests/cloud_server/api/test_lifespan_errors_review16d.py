"""The cloud server's lifespan and error shapes: an engine built but never serving (its start
failed, the load failed after it started, or a shutdown came during its start) is stopped, once;
a 405 names the method, the path and the methods allowed (HEAD too where GET is). Fake engine,
TestClient: fast."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from cloud_server.api import lifespan as lifespan_module  # noqa: E402
from cloud_server.api.server import create_app  # noqa: E402

from .fake_engine import FakeEngine  # noqa: E402


class CountingEngine(FakeEngine):
    def __init__(self, fail_start: bool = False, hold_start: bool = False) -> None:
        super().__init__()
        self.fail_start, self.hold_start = fail_start, hold_start
        self.started = self.stops = 0

    async def start(self) -> None:
        await super().start()  # its resources taken, as a real engine's executor thread
        self.started += 1
        if self.hold_start:
            await asyncio.Event().wait()  # a slow start: the shutdown comes first
        if self.fail_start:
            raise RuntimeError("CUDA out of memory")

    async def stop(self) -> None:
        self.stops += 1
        await super().stop()


def _health(client: TestClient, want: str, timeout_s: float = 5.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        body = client.get("/health").json()
        if body["status"] == want or time.monotonic() > deadline:
            return body
        time.sleep(0.01)


def test_an_engine_whose_start_fails_is_stopped_once_and_health_says_error() -> None:
    engine = CountingEngine(fail_start=True)
    errors: list[BaseException] = []
    app = create_app(lambda: engine, on_load_error=errors.append)
    with TestClient(app) as client:
        assert _health(client, "error") == {"status": "error"}
        assert client.get("/health").status_code == 503
        assert engine.stops == 1  # its threads and memory freed at once, not left for the process
        assert [str(e) for e in errors] == ["CUDA out of memory"]
        assert client.get("/v1/models").status_code == 503
    assert engine.stops == 1  # the lifespan's end does not stop it a second time


def test_an_engine_started_but_failing_later_in_the_load_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_meter(app: Any, engine: Any) -> None:
        raise OSError("NVML: driver not loaded")

    monkeypatch.setattr(lifespan_module, "_attach_energy_meter", broken_meter)
    engine = CountingEngine()
    app = create_app(lambda: engine)
    with TestClient(app) as client:
        assert _health(client, "error") == {"status": "error"}
        assert engine.started == 1 and engine.stops == 1
    assert engine.stops == 1


def test_a_shutdown_during_the_engines_start_stops_it() -> None:
    engine = CountingEngine(hold_start=True)
    app = create_app(lambda: engine)
    with TestClient(app) as client:
        deadline = time.monotonic() + 5
        while not engine.started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.started == 1
        assert client.get("/health").json() == {"status": "loading"}
    assert engine.stops == 1  # the cancelled start left no engine running


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    app = create_app(FakeEngine, api_keys=["key-one", "key-two"])
    with TestClient(app) as client:
        assert _health(client, "ok")["status"] == "ok"
        yield client


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("GET", "/v1/chat/completions", "POST"),
    ("DELETE", "/v1/models", "GET, HEAD"),
    ("POST", "/v1/models/fake-model", "GET, HEAD"),
    ("PUT", "/health", "GET, HEAD"),
])
def test_405_names_the_method_the_path_and_the_methods_allowed(
        client: TestClient, method: str, path: str, allowed: str) -> None:
    response = client.request(method, path, headers={"Authorization": "Bearer key-one"})
    assert response.status_code == 405
    assert response.json() == {"error": {
        "message": f"Method Not Allowed ({method} {path}); allowed: {allowed}",
        "type": "invalid_request_error", "param": None, "code": None}}
    assert response.headers["allow"] == allowed


def test_every_get_route_answers_head_as_the_405s_allow_says(client: TestClient) -> None:
    paths = [p for p, ops in client.app.openapi()["paths"].items() if "get" in ops]
    assert "/v1/models" in paths and "/health" in paths
    for path in paths:
        url = path.replace("{model_id}", "fake-model")
        response = client.head(url, headers={"Authorization": "Bearer key-two"})
        assert response.status_code == 200, url


def test_either_key_and_a_lower_case_scheme_are_accepted(client: TestClient) -> None:
    for header in ("Bearer key-one", "bearer key-two", "BEARER key-one"):
        assert client.get("/v1/models", headers={"Authorization": header}).status_code == 200
    refused = client.get("/v1/models", headers={"Authorization": "Bearer key-three"})
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
