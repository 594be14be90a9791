"""A shutdown whose grace period ends while the device is inside a step it cannot stop (a long
prompt's prefill, seconds on a CPU) still ends the streams at once with their in-band error.

Before: the error event was sent only after the events were closed, and closing them waits for the
device's step to end; past the server's settle time and uvicorn's own shutdown timeout (5 s + 5 s in
``hybridllm serve``) the connection was closed first: a stream cut without its error event, which a
client reads as a truncated answer. Fakes and a real local uvicorn, fast."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

pytest.importorskip("fastapi")
import uvicorn  # noqa: E402

from hybridllm import HybridLLM  # noqa: E402
from hybridllm._types import Usage  # noqa: E402
from hybridllm.backends.base import Delta  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402
from hybridllm.wire.shutdown import GracefulServer  # noqa: E402
from hybridllm.wire.sse import EventStreamResponse  # noqa: E402
from tests._uvicorn_thread import serving  # noqa: E402
from tests.cloud_server.api.helpers import free_port  # noqa: E402

STEP_S = 4.0  # one step of the device that cannot be stopped


class _Stuck(FakeBackend):
    """Answers one word, then spends ``STEP_S`` in one step (a thread that cannot be cancelled)."""

    def stream(self, messages, params):
        self.calls.append(messages)
        yield Delta("first", None, Usage(), None)
        time.sleep(STEP_S)
        yield Delta(" second", None, Usage(), None)
        yield Delta("", "stop", Usage(3, 2), None)


def test_the_error_event_goes_out_before_the_slow_close_of_the_events():
    """The response itself: the last events are sent before the producer's close ends."""
    order: list[str] = []

    async def events():
        try:
            yield "data: one\n\n"
            await asyncio.Event().wait()  # waits for the next token
        finally:
            await asyncio.sleep(0.3)  # the producer's close waits for the device's step
            order.append("closed")

    async def main() -> list[dict]:
        stop = asyncio.Event()
        sent: list[dict] = []
        never = asyncio.Event()

        async def receive() -> dict:
            await never.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)
            if message.get("body"):
                order.append(message["body"].decode())
            if message.get("body") == b"data: one\n\n":
                stop.set()  # the grace period ends while the next token is awaited

        response = EventStreamResponse(events(), stop=stop, last_events="data: error\n\n")
        await response({"type": "http"}, receive, send)
        return sent

    sent = asyncio.run(main())
    assert order == ["data: one\n\n", "data: error\n\n", "closed"], order
    assert sent[-1] == {"type": "http.response.body", "body": b"data: error\n\n", "more_body": False}


def test_a_stream_in_a_long_device_step_gets_its_error_when_the_grace_period_ends():
    openai = pytest.importorskip("openai")
    llm = HybridLLM(edge=_Stuck(), cache=False)
    app = create_app(llm)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                            timeout_graceful_shutdown=10)
    server = GracefulServer(config, app.state.drain, 0.2)
    seen: dict = {}

    def client() -> None:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0,
                          timeout=30)
        texts = []
        try:
            for chunk in c.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}],
                                                   stream=True):
                texts.extend(ch.delta.content or "" for ch in chunk.choices)
                if texts == ["", "first"]:
                    seen["reading"] = True
        except openai.APIError as exc:
            seen["error"] = (exc.message, time.monotonic())
        seen["texts"] = texts

    try:
        with serving(server):
            reader = threading.Thread(target=client, daemon=True)
            reader.start()
            deadline = time.monotonic() + 10
            while "reading" not in seen:
                assert time.monotonic() < deadline and reader.is_alive(), seen
                time.sleep(0.01)
            stop_at = time.monotonic()
            server.should_exit = True
            reader.join(timeout=30)
    finally:
        llm.close()
    assert "error" in seen, seen  # an APIError, not a truncated success
    message, at = seen["error"]
    assert "shutting down" in message
    assert seen["texts"] == ["", "first"]
    # the grace period (0.2 s) and uvicorn's tick, not the device's step (4 s)
    assert at - stop_at < STEP_S / 2, f"the error came {at - stop_at:.1f}s after the shutdown began"


class _Prefill(FakeBackend):
    """Spends ``STEP_S`` before its first token (a long prompt's prefill), then answers."""

    def stream(self, messages, params):
        self.calls.append(messages)
        time.sleep(STEP_S)
        yield Delta("late", None, Usage(), None)
        yield Delta("", "stop", Usage(3, 1), None)


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_waiting_for_a_long_device_step_gets_its_503_when_the_grace_period_ends(stream):
    """Before: the 503 server_shutting_down came only once the device's step had ended (4 s here;
    past ``hybridllm serve``'s 5 + 5 s the connection was closed without it)."""
    import httpx

    llm = HybridLLM(edge=_Prefill(), cache=False)
    app = create_app(llm)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                            timeout_graceful_shutdown=10)
    server = GracefulServer(config, app.state.drain, 0.2)
    seen: dict = {}

    def client() -> None:
        body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
        with httpx.Client(timeout=30) as http:
            r = http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
        seen["answer"] = (r.status_code, r.json(), time.monotonic())

    try:
        with serving(server):
            reader = threading.Thread(target=client, daemon=True)
            reader.start()
            deadline = time.monotonic() + 10
            while not llm.edge.calls:  # the device is in its step
                assert time.monotonic() < deadline and reader.is_alive(), seen
                time.sleep(0.01)
            stop_at = time.monotonic()
            server.should_exit = True
            reader.join(timeout=30)
        assert llm._core.edge_worker.num_waiting == 0
    finally:
        llm.close()
    status, body, at = seen["answer"]
    assert (status, body["error"]["code"]) == (503, "server_shutting_down"), body
    assert at - stop_at < STEP_S / 2, f"the 503 came {at - stop_at:.1f}s after the shutdown began"
