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


class _Broken(BaseException):
    """A fault the loop does not catch per step (a bug in the loop itself)."""


class _LoopBreaks(_StepFails):
    def __init__(self) -> None:
        super().__init__()
        self.added: list[str] = []

    def add_request(self, request_id: str, prompt_ids: list[int], params: object) -> None:
        self.added.append(request_id)
        if request_id == "fatal":
            raise _Broken("the engine's state is broken")

    def has_unfinished(self) -> bool:
        return bool(self.added)

    def step(self) -> list:
        return []  # the live request waits for tokens that do not come


def test_a_loop_that_dies_ends_its_streams_releases_aborts_and_says_why() -> None:
    """Before: the loop task died with the error; a stream in flight waited for ever, a later abort
    waited for ever, and stop() raised the loop's error again (the server's shutdown failed)."""
    from cloud_server.engine.sampling_params import SamplingParams
    from cloud_server.exceptions import EngineDeadError, EngineError

    stub = _LoopBreaks()
    engine = AsyncLLMEngine(EngineConfig(model="stub"), engine=stub)
    engine.engine = stub
    stub.encode_prompt = lambda prompt: [1, 2]  # type: ignore[attr-defined]
    stub.check_request = lambda ids, params: None  # type: ignore[attr-defined]
    stub.scheduler = type("S", (), {"num_queued_beyond_slots": 0, "max_num_seqs": 8,  # type: ignore[attr-defined]
                                    "running": [], "waiting": []})()
    got: list[BaseException] = []

    async def read(rid: str) -> None:
        try:
            async for _ in engine.generate(rid, "hi", SamplingParams(max_tokens=4)):
                pass
        except EngineError as exc:
            got.append(exc)

    async def main() -> None:
        await engine.start()
        live = asyncio.create_task(read("live"))
        await asyncio.sleep(0.05)
        fatal = asyncio.create_task(read("fatal"))
        await asyncio.wait_for(asyncio.gather(live, fatal), timeout=5)
        assert not engine.is_ready and isinstance(engine.failure, _Broken)
        await asyncio.wait_for(engine.abort("live"), timeout=5)
        await asyncio.wait_for(engine.stop(), timeout=5)  # no error raised again

    asyncio.run(main())
    assert len(got) == 2 and all("The engine failed (_Broken)" in str(e) for e in got)
    assert all(isinstance(e, EngineDeadError) for e in got)


class _Steps:
    """An engine whose steps fail or work as ``plan`` says (True: fails), one request at a time."""

    def __init__(self, plan: list[bool]) -> None:
        self.plan = plan
        self.live: set[str] = set()
        self.scheduler = type("S", (), {"num_queued_beyond_slots": 0, "max_num_seqs": 8,
                                        "running": [], "waiting": []})()

    def encode_prompt(self, prompt: object) -> list[int]:
        return [1, 2]

    def check_request(self, ids: object, params: object) -> None:
        pass

    def add_request(self, request_id: str, prompt_ids: list[int], params: object) -> None:
        self.live.add(request_id)

    def abort(self, request_id: str) -> None:
        self.live.discard(request_id)

    def has_unfinished(self) -> bool:
        return bool(self.live)

    def step(self) -> list:
        from cloud_server.engine.outputs import RequestOutput

        if self.plan.pop(0):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        rid = self.live.pop()
        return [RequestOutput(request_id=rid, delta_text="ok", delta_token_ids=[3], finished=True,
                              finish_reason="stop", num_prompt_tokens=2, num_output_tokens=1,
                              num_cached_tokens=0)]


def _run_requests(engine: AsyncLLMEngine, n: int) -> list[str]:
    from cloud_server.engine.sampling_params import SamplingParams
    from cloud_server.exceptions import EngineError

    ends: list[str] = []

    async def main() -> None:
        await engine.start()
        for i in range(n):
            try:
                async for _ in engine.generate(f"r{i}", "hi", SamplingParams(max_tokens=1)):
                    pass
                ends.append("ok")
            except EngineError as exc:
                ends.append(type(exc).__name__)
            except Exception as exc:  # NotReadyError once the engine is dead
                ends.append(type(exc).__name__)
        await asyncio.wait_for(engine.stop(), timeout=5)

    asyncio.run(main())
    return ends


def test_steps_that_keep_failing_end_the_engine() -> None:
    """A device that fails every step (a lost GPU) served 500s for ever; three failed steps in a
    row, none working between them, end the engine so the server exits and is restarted."""
    from cloud_server.engine.async_engine import MAX_FAILED_STEPS

    engine = AsyncLLMEngine(EngineConfig(model="stub"), engine=_Steps([True] * 10))
    ends = _run_requests(engine, MAX_FAILED_STEPS + 1)
    assert ends == ["EngineError"] * MAX_FAILED_STEPS + ["NotReadyError"], ends
    assert isinstance(engine.failure, RuntimeError) and not engine.is_ready


def test_a_failed_step_between_working_ones_is_not_the_end() -> None:
    engine = AsyncLLMEngine(EngineConfig(model="stub"), engine=_Steps([True, False] * 4))
    ends = _run_requests(engine, 6)
    assert ends == ["EngineError", "ok"] * 3, ends
    assert engine.failure is None
