"""AsyncLLMEngine around the real engine code on the KV-honest fake model (no torch model):
cancellation in every state, a loop that dies with ops in hand, streams that start late, and the
back-pressure check racing the engine thread."""

from __future__ import annotations

import asyncio
import random
import sys
import threading
import time

import pytest

from cloud_server.config import EngineConfig
from cloud_server.engine.async_engine import AsyncLLMEngine
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.exceptions import EngineDeadError, EngineError, NotReadyError

from .test_fuzz_fake_batching8 import check_invariants, make_engine


def _params(rng: random.Random, max_len: int, prompt: list[int]) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=rng.randint(1, max_len - len(prompt)),
                          ignore_eos=True)


@pytest.mark.parametrize("seed", range(6))
def test_requests_cancelled_in_every_state_leave_no_block_behind(seed):
    """Streams closed before their add is applied, while waiting, mid-prefill, while decoding,
    after a preemption and after they finished; explicit aborts of live, finished and unknown
    ids, twice. Afterwards the pool is whole and the engine holds nothing."""
    rng = random.Random(seed)
    eng = make_engine(6, max_num_seqs=3, budget=3)  # tiny pool and budget: chunks, preemptions
    engine = AsyncLLMEngine(EngineConfig(model="stub", max_waiting=1000), engine=eng)
    stopped_at: dict[str, int] = {}

    async def one(i: int) -> None:
        rid = f"r{i}"
        prompt = [rng.randrange(1, 20) for _ in range(rng.randint(1, 16))]
        stop_after = rng.choice([0, 1, 2, 5, None])
        n = 0
        async for out in engine.generate(rid, prompt, _params(rng, eng.max_model_len, prompt)):
            n += 1
            if out.finished or (stop_after is not None and n >= stop_after):
                break
            if rng.random() < 0.2:
                await engine.abort(rid)
        stopped_at[rid] = n
        if rng.random() < 0.5:
            await engine.abort(rid)
            await engine.abort(rid)

    async def main() -> None:
        await engine.start()
        tasks = []
        for i in range(30):
            tasks.append(asyncio.create_task(one(i)))
            if rng.random() < 0.3:
                await asyncio.sleep(0)
            if rng.random() < 0.1:  # cancelled before it ever ran, or mid-stream
                victim = rng.choice(tasks)
                victim.cancel()
        await engine.abort("unknown")
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=30)
        for _ in range(100):  # the aborts of closed streams are applied by the loop
            if not eng.has_unfinished():
                break
            await asyncio.sleep(0.01)
        await engine.stop()

    asyncio.run(main())
    check_invariants(eng)
    assert not eng.has_unfinished()
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


class _Broken(BaseException):
    """A fault the loop does not catch per op (a bug in the loop itself)."""


class _Stub:
    def __init__(self) -> None:
        self.live: set[str] = set()
        self.scheduler = type("S", (), {"num_queued_beyond_slots": 0, "max_num_seqs": 8,
                                        "running": [], "waiting": []})()

    def encode_prompt(self, prompt: object) -> list[int]:
        return [1, 2]

    def check_request(self, ids: object, params: object) -> None:
        pass

    def add_request(self, request_id: str, prompt_ids: list[int], params: object) -> None:
        if request_id == "fatal":
            raise _Broken("the engine's state is broken")
        self.live.add(request_id)

    def abort(self, request_id: str) -> None:
        self.live.discard(request_id)

    def has_unfinished(self) -> bool:
        return bool(self.live)

    def step(self) -> list:
        time.sleep(0.001)
        return []


def test_an_abort_applied_just_before_the_loop_dies_still_returns():
    """The worker thread had taken the abort off the queue and applied it when the next op broke
    the loop: the loop's cleanup released only the ops still queued, so that abort's caller
    waited for ever."""
    engine = AsyncLLMEngine(EngineConfig(model="stub"), engine=_Stub())

    async def main() -> None:
        await engine.start()
        await asyncio.sleep(0.01)  # the loop is idle, waiting for work
        # both queued before the loop wakes: the engine thread takes them in one batch
        aborting = asyncio.create_task(engine.abort("gone"))
        gen = engine.generate("fatal", "hi", SamplingParams(max_tokens=2))
        first = asyncio.create_task(gen.__anext__())
        with pytest.raises(EngineDeadError):
            await asyncio.wait_for(first, timeout=5)
        await asyncio.wait_for(aborting, timeout=5)
        await engine.stop()

    asyncio.run(main())
    assert isinstance(engine.failure, _Broken)


@pytest.mark.parametrize("how", ["dead", "stopped"])
def test_a_stream_first_read_after_the_loop_ended_fails_instead_of_hanging(how):
    """generate() validated while the loop ran; the stream, read later, queued its add for a loop
    that was gone and waited for ever."""
    stub = _Stub()
    engine = AsyncLLMEngine(EngineConfig(model="stub"), engine=stub)

    async def main() -> None:
        await engine.start()
        late = engine.generate("late", "hi", SamplingParams(max_tokens=2))
        if how == "dead":
            with pytest.raises(EngineDeadError):
                async for _ in engine.generate("fatal", "hi", SamplingParams(max_tokens=2)):
                    pass
        else:
            await engine.stop()
        with pytest.raises((EngineError, NotReadyError)):
            await asyncio.wait_for(late.__anext__(), timeout=5)
        await engine.stop()

    asyncio.run(main())
    assert "late" not in stub.live


class _SlowOps(_Stub):
    """Ops that take a moment each (and let other threads run), as a real add_request does."""

    def add_request(self, request_id: str, prompt_ids: list[int], params: object) -> None:
        time.sleep(0.0002)

    def abort(self, request_id: str) -> None:
        time.sleep(0.0002)

    def has_unfinished(self) -> bool:
        return False


def test_the_queue_full_check_does_not_race_the_engine_thread():
    """generate() counted the pending adds by iterating the op deque on the event loop while the
    engine thread popped from it: 'deque mutated during iteration' came back as a 500."""
    engine = AsyncLLMEngine(EngineConfig(model="stub", max_waiting=10**9), engine=_SlowOps())
    errors: list[BaseException] = []
    old = sys.getswitchinterval()

    async def main() -> None:
        await engine.start()
        for _ in range(3000):
            engine._push("abort", "x")  # many ops for the engine thread to apply, one by one
        for _ in range(3000):
            engine._push("add", ("y", [1], SamplingParams()))
        await asyncio.sleep(0.01)  # the engine thread is applying them now
        deadline = time.monotonic() + 1.0
        while engine._ops and time.monotonic() < deadline:
            try:
                engine.generate(f"g{threading.get_ident()}", "hi", SamplingParams(max_tokens=1))
            except RuntimeError as exc:
                errors.append(exc)
                break
        await engine.stop()

    sys.setswitchinterval(1e-5)
    try:
        asyncio.run(main())
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors
