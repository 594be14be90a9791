"""Review 15: the cloud server's HTTP layer at the ASGI level (fake engine, no sockets)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from cloud_server.api.server import create_app

from .fake_engine import FakeEngine
from .helpers import metric_value


class _AbortRecorder(FakeEngine):
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.abort_calls: list[str] = []

    async def abort(self, request_id: str) -> None:
        self.abort_calls.append(request_id)
        await super().abort(request_id)


def _scope(path: str, method: str = "POST") -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
            "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "headers": [(b"content-type", b"application/json")],
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}


async def _with_app(engine: FakeEngine, body: Any) -> Any:
    app = create_app(lambda: engine)
    lifespan: asyncio.Queue = asyncio.Queue()
    await lifespan.put({"type": "lifespan.startup"})

    async def lsend(message: Any) -> None:
        pass

    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}}, lifespan.get, lsend))
    try:
        for _ in range(500):
            if app.state.server.serving is not None:
                break
            await asyncio.sleep(0.01)
        await body(app)
    finally:
        await lifespan.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(task, 10)
    return app


def test_stream_closed_before_its_headers_went_out_ends_the_request() -> None:
    """The client hangs up while the response's headers wait to be written (a paused transport):
    the event generator is closed before its first step. Before, its ``finally`` never ran: no
    abort, no finish in /metrics, and the request's energy share stayed open for good."""
    engine = _AbortRecorder(step_s=0.01)
    payload = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "Hi"}],
                          "stream": True, "max_tokens": 300}).encode()

    async def run(app: Any) -> None:
        gone = asyncio.Event()
        sent_body = False

        async def receive() -> dict[str, Any]:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": payload, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                gone.set()
                await asyncio.Event().wait()  # never written: the client is gone

        await asyncio.wait_for(app(_scope("/v1/chat/completions"), receive, send), 5)
        text = app.state.metrics.render().decode()
        assert metric_value(text, "hybridllm_requests_finished_total", finish_reason="abort") == 1
        assert len(engine.abort_calls) == 1
        meter = app.state.metrics.energy.meter
        assert meter is None or not meter._active  # no energy share left open

    asyncio.run(_with_app(engine, run))


def test_head_health_and_metrics_answer_as_get() -> None:
    """A monitor's HEAD probe (``curl -I``, uptime checkers) got 405 Method Not Allowed: a healthy
    server looked down. RFC 9110 has every GET resource answer HEAD too."""
    import httpx

    from .helpers import ThreadServer

    server = ThreadServer(create_app(lambda: FakeEngine())).start()
    try:
        for path in ("/health", "/metrics"):
            get, head = httpx.get(server.url + path), httpx.head(server.url + path)
            assert head.status_code == get.status_code == 200, (path, head.status_code)
            assert head.content == b""
            assert head.headers["content-type"] == get.headers["content-type"]
        # still no HEAD on the POST routes, and the API document lists no HEAD operation
        assert httpx.head(server.url + "/v1/chat/completions").status_code == 405
        doc = httpx.get(server.url + "/openapi.json").json()
        assert all("head" not in ops for ops in doc["paths"].values())
    finally:
        server.stop()
