"""Review 13 of the cloud server's API (fake engine, real uvicorn): an unexpected error is
answered once and logs no request text, ``stop_token_ids`` is bounded, and /metrics tells
a request the engine failed apart from one whose client hung up."""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest

from cloud_server.api.protocol import CloudChatCompletionRequest, parse_request
from cloud_server.api.server import create_app
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.exceptions import EngineError
from hybridllm.wire.errors import WireError
from hybridllm.wire.requests import MAX_STOP_TOKEN_IDS

from .fake_engine import FakeEngine, FakeOutput
from .helpers import ThreadServer, metric_value, sse_payloads

SECRET = "my private question"
MSGS = [{"role": "user", "content": SECRET}]


class _Records(logging.Handler):
    """Every record of the loggers it is put on, formatted with its traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(logging.Formatter("%(name)s %(levelname)s %(message)s").format(record))


@contextlib.contextmanager
def _records() -> Iterator[_Records]:
    """Put on uvicorn's error logger and ours. uvicorn's does not propagate to the root (caplog
    would not see its traceback), and its config clears it: call this once the server is made."""
    handler = _Records()
    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "cloud_server")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


class _Crashes(FakeEngine):
    """An engine whose generate fails with an error no handler names, quoting the prompt."""

    def generate(
        self, request_id: str, prompt: str | list[int], params: SamplingParams,
        on_scheduled: Callable[[], None] | None = None,
    ) -> AsyncIterator[FakeOutput]:
        text = self.tokenizer.decode(prompt) if isinstance(prompt, list) else prompt
        raise RuntimeError(f"bad state at /srv/secret/engine.py for {text}")


def _rejected_500(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return metric_value(text, "hybridllm_requests_rejected_total", status="500") or 0.0


def test_an_unexpected_error_is_one_openai_500_and_logs_no_request_text() -> None:
    srv = ThreadServer(create_app(lambda: _Crashes()))
    try:
        with _records() as records:
            srv.start()
            records.lines.clear()  # the start-up lines
            before = _rejected_500(srv.url)
            r = httpx.post(f"{srv.url}/v1/chat/completions", json={"model": "fake-model", "messages": MSGS},
                           timeout=30)
            after = _rejected_500(srv.url)
    finally:
        srv.stop()
    assert r.status_code == 500
    assert r.json() == {"error": {"message": "The server had an error while processing your request.",
                                  "type": "server_error", "param": None, "code": None}}
    assert after - before == 1
    logged = "\n".join(records.lines)
    # before the fix uvicorn also logged "Exception in ASGI application" with the whole traceback
    assert SECRET not in logged and "/srv/secret" not in logged, logged
    errors = [line for line in records.lines if " ERROR " in line]
    # the line names the request (X-Request-Id, here one the server made)
    line = r"cloud_server\.api ERROR internal error: RuntimeError \[request_id=[0-9a-f]{32}\]"
    assert len(errors) == 1 and re.fullmatch(line, errors[0]), logged


def test_stop_token_ids_are_bounded() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    ok = parse_request(CloudChatCompletionRequest, {**body, "stop_token_ids": [0] * MAX_STOP_TOKEN_IDS})
    assert len(ok.stop_token_ids or []) == MAX_STOP_TOKEN_IDS
    with pytest.raises(WireError) as info:
        parse_request(CloudChatCompletionRequest, {**body, "stop_token_ids": [0] * (MAX_STOP_TOKEN_IDS + 1)})
    assert info.value.param == "stop_token_ids"
    assert f"at most this many items: {MAX_STOP_TOKEN_IDS}" in str(info.value)


def test_a_body_of_two_million_stop_token_ids_is_a_400() -> None:
    """Under the body limit, but each generated token would be checked against all of them."""
    engine = FakeEngine()
    srv = ThreadServer(create_app(lambda: engine)).start()
    try:
        body = {"model": "fake-model", "messages": MSGS, "max_tokens": 4, "stop_token_ids": [0] * 2_000_000}
        r = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=60)
    finally:
        srv.stop()
    assert r.status_code == 400, r.text[:200]
    assert r.json()["error"]["param"] == "stop_token_ids"


class _FailsMidway(FakeEngine):
    """The engine's step fails after two tokens (as AsyncLLMEngine ends a failed batch)."""

    def generate(
        self, request_id: str, prompt: str | list[int], params: SamplingParams,
        on_scheduled: Callable[[], None] | None = None,
    ) -> AsyncIterator[FakeOutput]:
        inner = super().generate(request_id, prompt, params, on_scheduled)

        async def failing() -> AsyncIterator[FakeOutput]:
            n = 0
            async for out in inner:
                yield out
                n += 1
                if n == 2:
                    await inner.aclose()
                    raise EngineError("the step failed")

        return failing()


def test_metrics_count_an_engine_failure_as_error_and_a_hang_up_as_abort() -> None:
    engine = _FailsMidway()
    srv = ThreadServer(create_app(lambda: engine)).start()

    def finished(reason: str) -> float:
        text = httpx.get(f"{srv.url}/metrics").text
        return metric_value(text, "hybridllm_requests_finished_total", finish_reason=reason) or 0.0

    try:
        body = {"model": "fake-model", "messages": MSGS, "max_tokens": 20}
        plain = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=30)
        streamed = httpx.post(f"{srv.url}/v1/chat/completions", json={**body, "stream": True}, timeout=30)
        assert finished("error") == 2 and finished("abort") == 0
        engine.generate = FakeEngine.generate.__get__(engine)  # type: ignore[method-assign]
        long = {**body, "max_tokens": 400, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json=long, timeout=30) as r:
            lines = r.iter_lines()
            for _ in range(4):
                next(lines)
        deadline = time.monotonic() + 5
        while finished("abort") == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert finished("abort") == 1 and finished("error") == 2
    finally:
        srv.stop()
    assert plain.status_code == 500
    events = sse_payloads(iter(streamed.text.splitlines()))
    assert events[-1] == "[DONE]" and events[-2]["error"]["type"] == "server_error"
