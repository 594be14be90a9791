"""A custom backend's own exception from its other calls (is_available, unavailable_reason,
retry_after_s, context_length, close) is handled by the rule its generate / stream errors follow
(see tests/test_backend_errors_api9.py). Before, each reached the caller raw: a cloud whose
is_available() raised failed every cloud request instead of letting the device answer, and an edge
whose close() raised left the cloud (and the cache) open.

is_available() or unavailable_reason() raising: the cloud counts as unavailable, the reason names
the error, the device answers (as for an open circuit); where the device cannot hold the prompt the
CloudUnavailableError has the wrapped error as its ``__cause__``. context_length raising: an
EdgeError with the original as ``__cause__``. close() raising: logged, and the other parts close."""

from __future__ import annotations

import asyncio
import logging

import pytest

from hybridllm import AsyncHybridLLM, CloudUnavailableError, Decision, EdgeError, HybridLLM
from hybridllm.backends.fake import FakeBackend


class CloudRouter:
    """Every request to the cloud; the cascade always escalates (a policy as HybridLLM accepts one)."""

    def decide(self, messages, *, force=None, prompt_tokens=None, embedding=None):
        return Decision(force or "cloud", "test: cloud", messages_for_cloud=list(messages))

    def should_escalate(self, mean_logprob: float) -> bool:
        return True


class MoodyCloud(FakeBackend):
    """A cloud whose is_available / unavailable_reason / retry_after_s / close raise what is set."""

    name = "moody"

    def __init__(self, **kwargs) -> None:
        super().__init__(reply=lambda m: "cloud answer", **kwargs)
        self.available: bool | Exception = True
        self.reason: str | Exception = "my own reason"
        self.retry: float | Exception = 7.0
        self.close_error: Exception | None = None
        self.closed = 0

    def is_available(self) -> bool:
        if isinstance(self.available, Exception):
            raise self.available
        return self.available

    def unavailable_reason(self) -> str:
        if isinstance(self.reason, Exception):
            raise self.reason
        return self.reason

    def retry_after_s(self) -> float | None:
        if isinstance(self.retry, Exception):
            raise self.retry
        return self.retry

    def close(self) -> None:
        self.closed += 1
        if self.close_error is not None:
            raise self.close_error


class ClosingEdge(FakeBackend):
    name = "closing"

    def __init__(self, error: Exception | None = None, **kwargs) -> None:
        super().__init__(reply=lambda m: "device answer", **kwargs)
        self.error, self.closed = error, 0

    def close(self) -> None:
        self.closed += 1
        if self.error is not None:
            raise self.error


class BadLength(FakeBackend):
    name = "badlen"

    @property
    def context_length(self) -> int:
        raise RuntimeError("no n_ctx here")


def test_is_available_raising_means_unavailable_and_the_device_answers():
    cloud = MoodyCloud()
    cloud.available = RuntimeError("health probe broke")
    with HybridLLM(edge=ClosingEdge(), cloud=cloud, policy=CloudRouter(), cache=False) as llm:
        c = llm.chat("hi")
    assert (c.text, c.route) == ("device answer", "edge (cloud unavailable)")
    assert "is_available() raised RuntimeError: health probe broke" in c.reason
    assert cloud.calls == []  # not asked


def test_unavailable_reason_raising_still_falls_back_and_names_the_error():
    cloud = MoodyCloud()
    cloud.available, cloud.reason = False, ValueError("no words")
    with HybridLLM(edge=ClosingEdge(), cloud=cloud, policy=CloudRouter(), cache=False) as llm:
        c = llm.chat("hi")
    assert c.route == "edge (cloud unavailable)"
    assert "unavailable_reason() raised ValueError: no words" in c.reason


def test_where_the_device_cannot_stand_in_the_error_keeps_the_backends_error_as_its_cause():
    cloud = MoodyCloud()
    cloud.available = KeyError("region")
    cloud.retry = RuntimeError("no clock")  # the Retry-After hint is dropped, not the request
    edge = ClosingEdge(context_length=3)  # no prompt fits on the device
    with HybridLLM(edge=edge, cloud=cloud, policy=CloudRouter(), cache=False) as llm:
        with pytest.raises(CloudUnavailableError) as info:
            llm.chat("hi there you")
    err = info.value
    assert "is_available() raised KeyError: 'region'" in str(err)
    assert err.retry_after_s is None
    assert isinstance(err.__cause__, CloudUnavailableError)  # the wrapped one, naming the backend
    assert "'moody' (MoodyCloud)" in str(err.__cause__)
    assert isinstance(err.__cause__.__cause__, KeyError)


def test_the_cascade_keeps_the_edge_answer_when_is_available_raises():
    cloud = MoodyCloud()
    cloud.available = RuntimeError("probe")
    policy = CloudRouter()
    policy.decide = lambda messages, **kw: Decision("edge", "test: edge", score=0.5, cascade=True,
                                                   messages_for_cloud=list(messages))
    with HybridLLM(edge=ClosingEdge(), cloud=cloud, policy=policy, cache=False) as llm:
        c = llm.chat("hi")
    assert (c.text, c.route) == ("device answer", "edge")
    assert "the cloud is unavailable" in c.reason


def test_context_length_raising_is_an_edge_error_with_its_cause():
    with pytest.raises(EdgeError) as info:  # read at construction, for the router's context limit
        HybridLLM(edge=BadLength(), cloud=MoodyCloud(), cache=False)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "RuntimeError: no n_ctx here" in str(info.value) and "'badlen' (BadLength)" in str(info.value)
    # with a policy of the caller's own, it is read at the first request instead
    with HybridLLM(edge=BadLength(), cloud=MoodyCloud(), policy=CloudRouter(), cache=False) as llm:
        with pytest.raises(EdgeError) as info:
            llm.chat("hi")
    assert isinstance(info.value.__cause__, RuntimeError)


def test_an_edge_close_error_does_not_keep_the_cloud_open(caplog):
    edge, cloud = ClosingEdge(OSError("device stuck")), MoodyCloud()
    llm = HybridLLM(edge=edge, cloud=cloud, policy=CloudRouter(), cache=False)
    assert llm.chat("hi").text == "cloud answer"
    with caplog.at_level(logging.WARNING, logger="hybridllm"):
        llm.close()  # no raise
    assert (edge.closed, cloud.closed) == (1, 1)
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "closing the edge part 'closing' (ClosingEdge) failed: OSError: device stuck" in said
    with pytest.raises(Exception, match="closed"):
        llm.chat("hi")


def test_the_async_close_closes_the_device_when_the_cloud_fails_to(caplog):
    edge, cloud = ClosingEdge(), MoodyCloud()
    cloud.close_error = RuntimeError("socket jammed")

    async def main() -> None:
        llm = AsyncHybridLLM(edge=edge, cloud=cloud, policy=CloudRouter(), cache=False)
        assert (await llm.chat("hi")).text == "cloud answer"
        await llm.aclose()

    with caplog.at_level(logging.WARNING, logger="hybridllm"):
        asyncio.run(main())
    assert edge.closed == 1 and cloud.closed >= 1
    assert "RuntimeError: socket jammed" in caplog.text


def test_keyboard_interrupt_from_close_still_passes():
    edge = ClosingEdge(KeyboardInterrupt())  # type: ignore[arg-type]
    llm = HybridLLM(edge=edge, cache=False)
    with pytest.raises(KeyboardInterrupt):
        llm._core.close()
    llm.close()  # the rest of the client (its parts are closed already)


@pytest.mark.real
def test_the_real_device_answers_when_a_custom_clouds_is_available_raises(smollm2_path):
    from hybridllm.backends.base import create_backend

    cloud = MoodyCloud()
    cloud.available = ConnectionError("status page unreachable")
    cloud.close_error = RuntimeError("already gone")
    edge = create_backend("llama_cpp", model=str(smollm2_path), n_ctx=256, n_threads=1)
    with HybridLLM(edge=edge, cloud=cloud, policy=CloudRouter(), cache=False, max_tokens=4,
                   temperature=0.0) as llm:
        c = llm.chat("Say hi.")
    assert c.route == "edge (cloud unavailable)" and c.text.strip()
    assert "is_available() raised ConnectionError: status page unreachable" in c.reason
    assert edge._llm is None  # the real model was freed although the cloud's close() raised
