"""The TLS context (the CA store read from disk) is built once per process, in a worker thread:
httpx built one for each new client, and the cloud client makes a client per event loop, so the
first cloud call on a loop read the CA store on the loop, 20-250 ms that an async app's other
requests (or `hybridllm serve`'s) stood still for."""

from __future__ import annotations

import asyncio
import gc
import ssl
import time

import pytest

from hybridllm import AsyncHybridLLM
from hybridllm.backends import cloud_http
from hybridllm.backends.fake import FakeBackend

pytest.importorskip("fastapi")


def test_the_first_cloud_call_on_a_loop_reads_the_ca_store_off_the_loop(monkeypatch):
    from cloud_server.api.server import create_app
    from tests.cloud_server.api.fake_engine import FakeEngine
    from tests.cloud_server.api.helpers import ThreadServer

    slow = ssl.SSLContext.load_verify_locations

    def load(self, *args, **kwargs):  # a CA store on a slow disk, or a loaded machine
        time.sleep(0.5)
        return slow(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", load)
    monkeypatch.setattr(cloud_http, "_SSL_CONTEXT", None)  # as in a new process
    server = ThreadServer(create_app(lambda: FakeEngine(step_s=0.001))).start()
    try:
        async def main() -> tuple[float, str]:
            gaps: list[float] = []
            done = asyncio.Event()

            async def ticker() -> None:
                last = time.monotonic()
                while not done.is_set():
                    await asyncio.sleep(0.01)
                    now = time.monotonic()
                    gaps.append(now - last)
                    last = now

            async with AsyncHybridLLM(edge=FakeBackend(), cache=False, max_tokens=4,
                                      cloud_url=server.url, cloud_model="fake-model") as llm:
                tick = asyncio.create_task(ticker())
                await asyncio.sleep(0.05)
                c = await llm.chat("hello", route="cloud")
                done.set()
                await tick
            return max(gaps), c.route

        gc.collect()
        gc.disable()  # a full collection of a long suite's heap is a stall this test does not name
        try:
            worst, route = asyncio.run(main())
        finally:
            gc.enable()
        assert route == "cloud"
        assert worst < 0.3, worst  # the loop ticked on while the 0.5 s CA store was read
        made = cloud_http._SSL_CONTEXT
        assert isinstance(made, ssl.SSLContext)
        assert asyncio.run(_second_loop(server.url)) == "cloud"
        assert cloud_http._SSL_CONTEXT is made  # a second loop's client reuses it: read once
    finally:
        server.stop()


async def _second_loop(url: str) -> str:
    async with AsyncHybridLLM(edge=FakeBackend(), cache=False, max_tokens=4, cloud_url=url,
                              cloud_model="fake-model") as llm:
        return (await llm.chat("hello again", route="cloud")).route
