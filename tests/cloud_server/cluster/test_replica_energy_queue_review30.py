"""A cluster replica's request pays energy from its first engine step, not from its admission.

The single-process server counts a request's share from when the engine first schedules it
(cloud_server/engine/test_energy_queue_review30.py); a replica counted it from admission, so a
request that waited behind a full batch took a share of steps it never ran in. Fake model, one
request at a time, an estimate source on a clock each model step moves by one second (1 J a step).
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray.serve", reason="needs the [cluster] extra")

from cloud_server.cluster.app import EngineReplica  # noqa: E402
from cloud_server.config import EngineConfig  # noqa: E402
from cloud_server.energy import EnergyMeter  # noqa: E402
from cloud_server.energy_sources import EstimateSource  # noqa: E402
from cloud_server.engine.async_engine import AsyncLLMEngine  # noqa: E402

from ..engine.test_fuzz_fake_batching8 import make_engine  # noqa: E402

PARAMS = {"temperature": 0, "max_tokens": 4, "ignore_eos": True}  # 4 steps a request


def test_a_replica_request_that_waited_does_not_pay_for_the_steps_before_it():
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    eng = make_engine(8, max_num_seqs=1)  # the second request waits through the first's steps
    real = eng.runner.execute

    def execute(scheduled, **kw):
        now[0] += 1.0
        return real(scheduled, **kw)

    eng.runner.execute = execute
    replica = EngineReplica.__new__(EngineReplica)  # no Serve: only its generate is run
    replica.meter = EnergyMeter(EstimateSource(1.0, clock), 1.0, clock=clock)

    async def one(rid: str) -> float:
        outs = [out async for out in replica.generate([1, 2, 3], dict(PARAMS), rid)]
        return outs[-1].energy["joules"]

    async def main():
        replica.engine = AsyncLLMEngine(EngineConfig(model="stub", max_waiting=1000), engine=eng)
        await replica.engine.start()
        try:
            return await asyncio.wait_for(asyncio.gather(one("a"), one("b")), 10)
        finally:
            await replica.engine.stop()

    a, b = asyncio.run(main())
    assert a + b == 8.0  # every step's joule, to someone
    # "a" ran alone for its 4 steps (its end may be read a step late, in "b"'s first, shared);
    # counted from admission, "b" took half of "a"'s steps (a = 2, b = 6)
    assert a >= 4.0 and b <= 4.0, (a, b)
