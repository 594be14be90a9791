"""A custom backend's own exception (edge= or cloud=, see hybridllm.backends.base) reaches the
caller as the HybridLLM error of its side, with the original as ``__cause__`` and its message in
the text; a cloud-side one is a CloudUnavailableError, so the device answers in its place. Before,
a RuntimeError of a user backend passed through raw (and a failing cloud backend failed the whole
request instead of falling back). hybridllm's own errors are not wrapped twice, and
KeyboardInterrupt / CancelledError pass as they are."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from hybridllm import (
    AsyncHybridLLM,
    Backend,
    CloudUnavailableError,
    Delta,
    EdgeBusyError,
    EdgeError,
    GenerationParams,
    HybridLLM,
    Usage,
)
from hybridllm.backends.base import aguarded, guarded
from hybridllm.backends.fake import FakeBackend


class Broken(Backend):
    """A user backend that says ``first`` and then raises ``exc`` (at once with first=None)."""

    name = "mine"

    def __init__(self, exc: BaseException, first: str | None = None) -> None:
        self.exc, self.first, self.model = exc, first, "mine-1"

    def stream(self, messages, params: GenerationParams) -> Iterator[Delta]:
        if self.first is not None:
            yield Delta(self.first)
        raise self.exc


class CloudRouter:
    """Every request to the cloud (a policy as HybridLLM accepts one)."""

    def decide(self, messages, *, force=None, prompt_tokens=None, embedding=None):
        from hybridllm import Decision

        return Decision(force or "cloud", "test: cloud", messages_for_cloud=list(messages))

    def should_escalate(self, mean_logprob: float) -> bool:
        return False


def test_a_custom_edge_backends_error_is_an_edge_error_with_its_cause():
    boom = RuntimeError("the accelerator fell over")
    with HybridLLM(edge=Broken(boom), cache=False) as llm:
        with pytest.raises(EdgeError) as info:
            llm.chat("hi")
        assert info.value.__cause__ is boom
        assert "RuntimeError: the accelerator fell over" in str(info.value)
        assert "'mine' (Broken)" in str(info.value)
        with pytest.raises(EdgeError) as info, llm.stream("hi") as s:  # mid-answer, streamed
            llm.edge.first = "half "
            list(s)
        assert info.value.__cause__ is boom


def test_the_async_client_wraps_it_too():
    async def main() -> BaseException | None:
        async with AsyncHybridLLM(edge=Broken(KeyError("gone"), first="x"), cache=False) as llm:
            try:
                await llm.chat("hi")
            except EdgeError as exc:
                return exc
        return None

    err = asyncio.run(main())
    assert isinstance(err, EdgeError) and isinstance(err.__cause__, KeyError)
    assert "KeyError: 'gone'" in str(err)


def test_our_own_errors_are_not_wrapped_twice():
    own = EdgeBusyError("the device is busy; retry later")
    with HybridLLM(edge=Broken(own), cache=False) as llm:
        with pytest.raises(EdgeBusyError) as info:
            llm.chat("hi")
    assert info.value is own and info.value.__cause__ is None


def test_a_custom_cloud_backends_error_falls_back_to_the_device():
    cloud = Broken(ConnectionResetError("peer went away"))
    device = FakeBackend(reply=lambda m: "device answer")
    with HybridLLM(edge=device, cloud=cloud, policy=CloudRouter(), cache=False) as llm:
        c = llm.chat("hi")
        assert (c.text, c.route) == ("device answer", "edge (cloud unavailable)")
        assert "ConnectionResetError: peer went away" in c.reason
        cloud.first = "half an "  # broken mid-answer: the device finishes it, as for our own cloud
        c = llm.chat("hi")
        assert c.route == "cloud->edge" and c.text.startswith("half an ")


def test_a_custom_cloud_backends_error_is_a_cloud_error_where_the_device_cannot_stand_in():
    cloud = Broken(ValueError("bad gateway config"))
    device = FakeBackend(context_length=3)  # no prompt fits: only the cloud could answer
    with HybridLLM(edge=device, cloud=cloud, policy=CloudRouter(), cache=False) as llm:
        with pytest.raises(CloudUnavailableError) as info:
            llm.chat("hi there")
    assert "ValueError: bad gateway config" in str(info.value)
    assert isinstance(info.value.__cause__, CloudUnavailableError)
    assert isinstance(info.value.__cause__.__cause__, ValueError)


def test_keyboard_interrupt_and_cancellation_pass_unwrapped():
    with pytest.raises(KeyboardInterrupt):
        list(guarded(lambda: Broken(KeyboardInterrupt()).stream([], GenerationParams()), None, "edge"))

    async def main() -> None:
        async def cancelled():
            yield Delta("x")
            raise asyncio.CancelledError

        async for _ in aguarded(cancelled, None, "cloud"):
            pass

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())


def test_closing_the_guard_closes_the_backends_stream():
    closed = []

    def deltas():
        try:
            yield Delta("a")
            yield Delta("b", finish_reason="stop", usage=Usage())
        finally:
            closed.append(True)

    it = guarded(deltas, None, "edge")
    assert next(it).text == "a"
    it.close()
    assert closed == [True]


@pytest.mark.real
def test_the_real_device_answers_when_a_custom_cloud_backend_raises(smollm2_path):
    from hybridllm.backends.base import create_backend

    edge = create_backend("llama_cpp", model=str(smollm2_path), n_ctx=256, n_threads=1)
    with HybridLLM(edge=edge, cloud=Broken(OSError("no route to host")), policy=CloudRouter(),
                   cache=False, max_tokens=4, temperature=0.0) as llm:
        c = llm.chat("Say hi.")
    assert c.route == "edge (cloud unavailable)" and c.text.strip()
    assert "OSError: no route to host" in c.reason
