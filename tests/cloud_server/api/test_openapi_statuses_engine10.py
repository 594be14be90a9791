"""The OpenAPI document lists every status the /v1 routes really answer, and no other.

Before, it listed neither the 500 of a failed step or of a dead engine (engine_dead), on any route,
and it promised a 422 on ``GET /v1/models/{model_id}`` that the server never answers (a validation
error is a 400 here). The statuses are not read from the document's own code: each one is produced
by a real request to a real server (a fake engine behind it), then looked up in /openapi.json.
The 408 of a body that comes too slowly was answered and not listed (2026-12-04): a raw socket
sends part of a body and stops.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

from cloud_server.api.server import create_app
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.exceptions import EngineError, NotReadyError, QueueFullError
from hybridllm.wire import body as wire_body

from .fake_engine import FakeEngine, FakeOutput
from .helpers import ThreadServer

KEY = "sk-openapi"
AUTH = {"Authorization": f"Bearer {KEY}"}
POSTS = {"/v1/completions": {"model": "fake-model", "prompt": "hi", "max_tokens": 2},
         "/v1/chat/completions": {"model": "fake-model", "max_tokens": 2,
                                  "messages": [{"role": "user", "content": "hi"}]}}
GETS = ("/v1/models", "/v1/models/fake-model")


class _Scripted(FakeEngine):
    """Answers as the real engine does for some prompts: a full queue, a loop that is not running,
    a step that fails."""

    fault: str = ""

    def generate(self, request_id: str, prompt: str | list[int],
                 params: SamplingParams, on_scheduled: Any = None) -> AsyncIterator[FakeOutput]:
        if self.fault == "queue full":
            raise QueueFullError("the waiting queue is full", retry_after_s=1.0)
        if self.fault == "not ready":
            raise NotReadyError("the engine loop is not running")
        if self.fault == "step fails":
            return self._fails()
        return super().generate(request_id, prompt, params, on_scheduled)

    async def _fails(self) -> AsyncIterator[FakeOutput]:
        await asyncio.sleep(0)
        raise EngineError("model step failed")
        yield  # an async generator


class _Loading(FakeEngine):
    async def start(self) -> None:
        await asyncio.sleep(60)  # the model is still loading while the test runs


def _route(path: str) -> str:
    return "/v1/models/{model_id}" if path.startswith("/v1/models/") else path


def _slow_body_status(url: str, path: str) -> int:
    """The status answered to a body announced whole and sent in part (its first bytes, then
    nothing), read off a raw socket: httpx cannot send a body that stops."""
    body = json.dumps(POSTS[path]).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + body[:10])  # and the rest never
        answer = sock.recv(65536)  # the server answers when its body timeout is over
    assert answer.startswith(b"HTTP/1.1 "), answer[:80]
    return int(answer.split(b" ", 2)[1])


def _observe(url: str, engine: _Scripted, dead: list[EngineError]) -> set[tuple[str, str, int]]:
    seen: set[tuple[str, str, int]] = set()
    with httpx.Client(base_url=url, headers=AUTH, timeout=10) as client:

        def post(path: str, body: Any = None, **kwargs: Any) -> None:
            r = client.post(path, json=POSTS[path] if body is None else body, **kwargs)
            seen.add(("post", path, r.status_code))

        def get(path: str, **kwargs: Any) -> None:
            seen.add(("get", _route(path), client.get(path, **kwargs).status_code))

        for path in POSTS:
            post(path)  # 200
            post(path, headers={"Authorization": "Bearer wrong"})  # 401
            seen.add(("post", path, client.post(path, content=b"{not json").status_code))  # 400
            post(path, body={**POSTS[path], "max_tokens": 10_000})  # 400, beyond the context
            post(path, body={**POSTS[path], "padding": "x" * 5000})  # 413
            post(path, body={**POSTS[path], "model": "other"})  # 404
            for fault in ("queue full", "not ready", "step fails"):  # 429, 503, 500
                engine.fault = fault
                post(path)
            engine.fault = ""
            seen.add(("post", path, _slow_body_status(url, path)))  # 408
        for path in GETS:
            get(path)  # 200
            get(path, headers={"Authorization": "Bearer wrong"})  # 401
        get("/v1/models/other")  # 404
        engine.is_ready = False  # the engine's loop dies: every /v1 route answers engine_dead
        deadline = time.monotonic() + 10
        while not dead and time.monotonic() < deadline:
            time.sleep(0.01)
        assert dead, "the server did not notice the engine's death"
        for path in POSTS:
            post(path)
        for path in GETS:
            get(path)
    return seen


def _observe_loading(url: str) -> set[tuple[str, str, int]]:
    with httpx.Client(base_url=url, headers=AUTH, timeout=10) as client:
        seen = {("post", path, client.post(path, json=body).status_code) for path, body in POSTS.items()}
        return seen | {("get", _route(path), client.get(path).status_code) for path in GETS}


def _documented(url: str) -> set[tuple[str, str, int]]:
    doc = httpx.get(f"{url}/openapi.json", timeout=10).json()
    return {(method, path, int(status))
            for path, operations in doc["paths"].items() if path.startswith("/v1/")
            for method, operation in operations.items()
            for status in operation["responses"]}


def test_the_document_lists_each_status_the_routes_answer_and_no_other(monkeypatch) -> None:
    monkeypatch.setattr(wire_body, "BODY_TIMEOUT_S", 0.3)  # a slow body's 408 within the test
    engine = _Scripted()
    dead: list[EngineError] = []
    server = ThreadServer(create_app(lambda: engine, api_keys=[KEY], max_body_bytes=4096,
                                     on_engine_dead=dead.append)).start()
    try:
        documented = _documented(server.url)
        seen = _observe(server.url, engine, dead)
    finally:
        server.stop()
    loading = ThreadServer(create_app(_Loading, api_keys=[KEY])).start(wait_healthy=False)
    try:
        seen |= _observe_loading(loading.url)
    finally:
        loading.stop()
    statuses = {status for _, _, status in seen}
    assert {200, 400, 401, 404, 408, 413, 429, 500, 503} <= statuses, sorted(seen)
    assert ("get", "/v1/models", 500) in seen  # engine_dead reaches the routes without an engine call
    missing = seen - documented
    assert not missing, f"answered but not in /openapi.json: {sorted(missing)}"
    never = documented - seen
    assert not never, f"in /openapi.json but never answered: {sorted(never)}"


def test_the_document_says_what_500_and_503_mean_here() -> None:
    app = create_app(lambda: FakeEngine())
    responses = app.openapi()["paths"]["/v1/completions"]["post"]["responses"]
    assert "engine_dead" in responses["500"]["description"]
    assert "shutting down" in responses["503"]["description"]
    assert "401" not in responses  # no API key configured: no 401 either
