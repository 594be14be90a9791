"""The server learns of its engine's death from the engine itself (``wait_dead``), not by polling.

Before, ``_watch_engine`` read ``engine.is_ready`` every 0.2 s for the whole life of the server: a
task woke five times a second while the engine was healthy, and a death was noticed up to a poll
interval late.
"""

from __future__ import annotations

import asyncio

import pytest

from cloud_server.api.lifespan import ServerState, _watch_engine
from cloud_server.config import EngineConfig
from cloud_server.engine.async_engine import AsyncLLMEngine
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.exceptions import EngineError, NotReadyError

from .fake_engine import FakeEngine


class _CountsReads(FakeEngine):
    """Counts how often anything asks whether it is ready."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    @property  # type: ignore[override]
    def is_ready(self) -> bool:
        self.reads += 1
        return self._ready

    @is_ready.setter
    def is_ready(self, ready: bool) -> None:
        FakeEngine.is_ready.fset(self, ready)  # type: ignore[attr-defined]


def _state(engine: object) -> ServerState:
    return ServerState(lambda: engine, None, None)  # type: ignore[arg-type,return-value]


def test_the_watcher_does_not_wake_while_the_engine_is_healthy() -> None:
    engine = _CountsReads()
    dead: list[EngineError] = []

    async def main() -> None:
        await engine.start()
        watcher = asyncio.create_task(_watch_engine(_state(engine), engine, dead.append))
        await asyncio.sleep(0.7)  # three and more poll intervals of the old watcher
        assert engine.reads == 0, f"the watcher polled is_ready {engine.reads} times"
        assert not watcher.done() and not dead
        engine.is_ready = False  # its loop ends by itself
        await asyncio.wait_for(watcher, timeout=5)

    asyncio.run(main())
    assert len(dead) == 1 and "its loop ended" in str(dead[0])


class _Broken(BaseException):
    """A fault the engine loop does not catch per step (a bug in the loop itself)."""


class _Stub:
    """The part of LLMEngine the loop drives; adding the request "fatal" breaks the loop."""

    def __init__(self) -> None:
        self.live: list[str] = []
        self.scheduler = type("S", (), {"num_queued_beyond_slots": 0, "max_num_seqs": 8,
                                        "running": [], "waiting": []})()

    def encode_prompt(self, prompt: object) -> list[int]:
        return [1, 2]

    def check_request(self, ids: object, params: object) -> None:
        pass

    def add_request(self, request_id: str, prompt_ids: list[int], params: object) -> None:
        if request_id == "fatal":
            raise _Broken("the engine's state is broken")
        self.live.append(request_id)

    def abort(self, request_id: str) -> None:
        if request_id in self.live:
            self.live.remove(request_id)

    def has_unfinished(self) -> bool:
        return bool(self.live)

    def step(self) -> list:
        return []


async def _drain(engine: AsyncLLMEngine, rid: str) -> None:
    try:
        async for _ in engine.generate(rid, "hi", SamplingParams(max_tokens=4)):
            pass
    except EngineError:
        pass


def test_wait_dead_returns_the_failure_of_the_real_loop_and_the_watcher_acts_on_it() -> None:
    engine = AsyncLLMEngine(EngineConfig(model="stub"), engine=_Stub())
    dead: list[EngineError] = []

    async def main() -> None:
        await engine.start()
        waiting = asyncio.create_task(engine.wait_dead())
        watcher = asyncio.create_task(_watch_engine(_state(engine), engine, dead.append))  # type: ignore[arg-type]
        live = asyncio.create_task(_drain(engine, "live"))
        await asyncio.sleep(0.05)
        assert not waiting.done() and not watcher.done()  # healthy, a request in flight
        await asyncio.wait_for(_drain(engine, "fatal"), timeout=5)
        cause = await asyncio.wait_for(waiting, timeout=5)
        assert isinstance(cause, _Broken) and cause is engine.failure
        await asyncio.wait_for(asyncio.gather(watcher, live), timeout=5)

    asyncio.run(main())
    assert len(dead) == 1 and "_Broken: the engine's state is broken" in str(dead[0])


def test_a_clean_stop_is_no_death() -> None:
    engine = AsyncLLMEngine(EngineConfig(model="stub"), engine=_Stub())

    async def main() -> None:
        with pytest.raises(NotReadyError):
            await engine.wait_dead()  # not started: nothing to wait for
        await engine.start()
        waiting = asyncio.create_task(engine.wait_dead())
        await engine.stop()
        await asyncio.sleep(0.05)
        assert not waiting.done() and engine.failure is None
        waiting.cancel()

    asyncio.run(main())
