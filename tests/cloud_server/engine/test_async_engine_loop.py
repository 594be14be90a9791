"""AsyncLLMEngine's loop around a stub engine (no model): what a failed step leaves behind."""

from __future__ import annotations

import asyncio

from cloud_server.config import EngineConfig
from cloud_server.engine.async_engine import AsyncLLMEngine


class _StepFails:
    """The part of LLMEngine the loop drives; once ``fail`` is set, the next step fails as a
    model failure would."""

    def __init__(self) -> None:
        self.fail = False
        self.aborted: list[str] = []

    def add_request(self, request_id: str, prompt_ids: list[int], params: object) -> None:
        pass

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def has_unfinished(self) -> bool:
        return self.fail

    def step(self) -> list:
        self.fail = False
        raise RuntimeError("model step failed")


def test_an_abort_applied_in_a_failed_step_still_returns() -> None:
    """The abort ran before the step failed: its caller (a request closing after its client went
    away) must not wait for ever."""
    stub = _StepFails()
    engine = AsyncLLMEngine(EngineConfig(model="stub"), engine=stub)

    async def main() -> None:
        await engine.start()
        await asyncio.sleep(0.01)  # the loop is idle, waiting for work
        stub.fail = True
        try:
            await asyncio.wait_for(engine.abort("gone"), timeout=5)
        finally:
            await engine.stop()

    asyncio.run(main())
    assert stub.aborted == ["gone"]


def test_an_abort_waiting_when_the_engine_stops_returns() -> None:
    """An abort pushed just before stop(): the loop ended without applying it, and its caller (a
    request closing as the server shuts down) waited for ever on a future nobody resolved."""
    stub = _StepFails()
    engine = AsyncLLMEngine(EngineConfig(model="stub"), engine=stub)

    async def main() -> None:
        await engine.start()
        await asyncio.sleep(0.01)  # the loop is idle, waiting for work
        aborting = asyncio.create_task(engine.abort("closing"))
        await asyncio.sleep(0)  # the abort is queued; the loop has not run since
        await engine.stop()
        await asyncio.wait_for(aborting, timeout=5)

    asyncio.run(main())
