"""The cloud backend forwards the request id of the HTTP request being served (``hybridllm serve``)
as X-Request-Id, with the key still sent; a library caller, serving no request, sends none."""

from __future__ import annotations

import asyncio
import json

import httpx

from hybridllm._request_id import REQUEST_ID
from hybridllm._types import GenerationParams
from hybridllm.backends.cloud import CloudBackend

MSGS = [{"role": "user", "content": "hi"}]
P = GenerationParams(max_tokens=8, temperature=0)
DONE = {"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]}


def _backend(seen: list[httpx.Headers]) -> CloudBackend:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        return httpx.Response(200, text=f"data: {json.dumps(DONE)}\n\ndata: [DONE]\n\n",
                              headers={"content-type": "text/event-stream"})

    return CloudBackend(base_url="http://c.test/v1", model="m", api_key="sk-up",
                        transport=httpx.MockTransport(handler))


def test_the_request_being_served_names_the_cloud_request() -> None:
    seen: list[httpx.Headers] = []
    cloud = _backend(seen)

    async def serve(rid: str) -> str:
        REQUEST_ID.set(rid)  # as wire.middleware.RequestId does, in this task's context only
        return "".join(d.text for d in [d async for d in cloud.astream(MSGS, P)])

    async def both() -> list[str]:
        return await asyncio.gather(serve("req-a"), serve("req-b"))

    assert asyncio.run(both()) == ["ok", "ok"]
    assert sorted(h["x-request-id"] for h in seen) == ["req-a", "req-b"]
    assert all(h["authorization"] == "Bearer sk-up" for h in seen)
    cloud.close()


def test_a_library_caller_sends_no_request_id() -> None:
    seen: list[httpx.Headers] = []
    cloud = _backend(seen)
    assert cloud.generate(MSGS, P).text == "ok"
    assert "x-request-id" not in seen[0]
    cloud.close()
