"""Review 15b of the cluster's control code (fakes only, no Ray cluster): serve_cluster gives the
caller's SIGTERM handler back, a bug in a replica's code is not sent to a second replica, and a load
report with figures that are no counts neither breaks routing nor draws every prompt."""

from __future__ import annotations

import asyncio
import math
import os
import signal
from types import SimpleNamespace

import pytest

from cloud_server.cluster.policy import TokenAwareRouter, prompt_block_hashes
from cloud_server.cluster.remote_engine import RemoteEngine
from cloud_server.config import ClusterConfig, EngineConfig
from cloud_server.exceptions import EngineError, ServerError

BS = 4


# -- serve_cluster and the process's SIGTERM handler -------------------------------------------------
def _callers_handler(*_):
    raise AssertionError("the caller's handler is not meant to run here")


def _run_serve_cluster(monkeypatch, start):
    pytest.importorskip("ray.serve", reason="needs the [cluster] extra")
    from cloud_server.cluster import launch

    monkeypatch.setattr(launch, "start", start)
    monkeypatch.setattr(launch, "stop", lambda *a, **kw: None)
    return launch.serve_cluster(EngineConfig(model="m"), ClusterConfig(replicas=1), host="127.0.0.1",
                                port=8000, power_watts=None, app_options={})


def test_serve_cluster_gives_the_callers_sigterm_handler_back_after_a_failure(monkeypatch):
    signal.signal(signal.SIGTERM, _callers_handler)  # conftest restores the suite's own

    def failed(*args, **kwargs):
        assert signal.getsignal(signal.SIGTERM) is not _callers_handler  # ours while it runs
        raise ServerError("the engine replicas could not start")

    with pytest.raises(ServerError):
        _run_serve_cluster(monkeypatch, failed)
    assert signal.getsignal(signal.SIGTERM) is _callers_handler


def test_serve_cluster_gives_the_callers_sigterm_handler_back_after_a_sigterm(monkeypatch):
    signal.signal(signal.SIGTERM, _callers_handler)

    def stopped_while_loading(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # serve_cluster's handler: stop there, as Ctrl-C does
        raise AssertionError("SIGTERM did not stop the start")

    assert _run_serve_cluster(monkeypatch, stopped_while_loading) == 0
    assert signal.getsignal(signal.SIGTERM) is _callers_handler


# -- a replica's own bug is not retried ---------------------------------------------------------
class _Handle:
    """A deployment handle whose calls raise ``errors[i]`` (the last one repeats; None: answers)."""

    def __init__(self, errors: list) -> None:
        self.errors = errors
        self.calls = 0

    def options(self, **_):
        return self

    @property
    def generate(self):
        return self

    def remote(self, prompt_ids, params, request_id):
        err = self.errors[min(self.calls, len(self.errors) - 1)]
        self.calls += 1

        class Stream:
            def __aiter__(self):
                return self._gen()

            async def _gen(self):
                if err is not None:
                    raise err
                yield SimpleNamespace(request_id=request_id)

            def cancel(self):
                pass

        return Stream()


async def _no_sleep(_s: float) -> None:
    return None


def _collect(engine: RemoteEngine) -> list:
    async def go():
        return [o async for o in engine._stream("req", [1, 2], {})]

    return asyncio.run(go())


def _task_error(cause: BaseException) -> BaseException:
    """What a Serve handle raises when the replica's method raised ``cause``."""
    from ray.exceptions import RayTaskError

    return RayTaskError("generate", "Traceback (most recent call last): ...", cause).as_instanceof_cause()


def test_a_bug_in_the_replicas_code_is_a_500_at_once_not_a_second_try(monkeypatch):
    pytest.importorskip("ray", reason="needs the [cluster] extra")
    monkeypatch.setattr(asyncio, "sleep", _no_sleep)
    handle = _Handle([_task_error(ValueError("bad params")), None])
    engine = RemoteEngine(handle, "m", retries=2)
    with pytest.raises(EngineError, match=r"replica serving this request failed \(ValueError\)"):
        _collect(engine)
    assert handle.calls == 1 and engine.num_retried == 0


def test_a_replica_that_died_is_still_retried_even_wrapped_in_a_task_error(monkeypatch):
    pytest.importorskip("ray", reason="needs the [cluster] extra")
    from ray.exceptions import ActorDiedError

    monkeypatch.setattr(asyncio, "sleep", _no_sleep)
    for died in (ActorDiedError(), _task_error(ActorDiedError())):
        handle = _Handle([died, None])
        outs = _collect(RemoteEngine(handle, "m", retries=2))
        assert handle.calls == 2 and outs[0].request_id == "req-retry1"


# -- load reports whose figures are no counts ----------------------------------------------------
@pytest.mark.parametrize("bad", [math.nan, math.inf, None, "many", True])
def test_a_report_figure_that_is_no_count_reads_as_zero_and_routing_goes_on(bad):
    policy = TokenAwareRouter(block_size=BS)
    report = {"outstanding_tokens": bad, "prefill_tokens": bad, "decode_tokens": bad, "prefix_hashes": None}
    policy.on_report("r1", report)  # raised ValueError/TypeError: every routing call failed
    policy.on_report("r2", {"outstanding_tokens": 300, "prefix_hashes": []})
    books = policy.books["r1"]
    assert (books.reported_tokens, books.reported_prefill, books.reported_decode) == (0, 0, 0)
    assert books.reported_hashes == frozenset()
    assert policy.choose(["r1", "r2"], []).replica == "r1"


def test_a_negative_report_does_not_make_a_replica_idler_than_idle():
    prompt = list(range(13))  # three full blocks looked up
    h = prompt_block_hashes(prompt, BS)
    policy = TokenAwareRouter(block_size=BS, min_margin_tokens=128, imbalance_ratio=0.25)
    # r1 holds the prompt's prefix and has 100 prompt tokens to prefill; r2 says -1000
    policy.on_report("r1", {"outstanding_tokens": 100, "prefill_tokens": 100, "prefix_hashes": h})
    policy.on_report("r2", {"outstanding_tokens": -1000, "prefill_tokens": -1000, "prefix_hashes": []})
    assert policy.books["r2"].pressure(policy.decode_weight) == 0
    # r1 is within the margin of an idle replica (100 <= 0 + 128 + 12): the prefix wins; a
    # pressure of -1000 made it overloaded and spilled the prompt to r2
    choice = policy.choose(["r1", "r2"], h)
    assert (choice.replica, choice.reason) == ("r1", "prefix")
