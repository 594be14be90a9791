"""Several endpoints serving different (discovered) models: each answer names the model of the
endpoint that produced it, not the last model discovered (review 19)."""

from __future__ import annotations

import asyncio
import json

import httpx

from hybridllm import AsyncHybridLLM, HybridLLM
from hybridllm.backends.cloud import CloudBackend
from hybridllm.backends.fake import FakeBackend

MODELS = {"a.test": "alpha", "b.test": "beta"}


def sse(model: str) -> httpx.Response:
    events = [{"choices": [{"delta": {"content": f"from {model} "}, "finish_reason": None}]},
              {"choices": [{"delta": {"content": "."}, "finish_reason": None}]},
              {"choices": [{"delta": {}, "finish_reason": "stop"}]}]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})


def handler(request: httpx.Request) -> httpx.Response:
    model = MODELS[request.url.host]
    if request.url.path == "/v1/models":
        return httpx.Response(200, json={"object": "list", "data": [{"id": model}]})
    assert json.loads(request.content)["model"] == model  # each endpoint is asked for its own
    return sse(model)


def cloud() -> CloudBackend:
    return CloudBackend(base_url=["http://a.test", "http://b.test"], transport=httpx.MockTransport(handler),
                        remember_refusals=False)


def test_each_answer_names_the_model_of_the_endpoint_that_answered():
    llm = HybridLLM(edge=FakeBackend(model="edge-model"), cloud=cloud(), cache=False)
    try:
        answers = [llm.chat("hi", route="cloud") for _ in range(4)]  # balanced: a, b, a, b
    finally:
        llm.close()
    assert {a.text.split()[1] for a in answers} == {"alpha", "beta"}
    for a in answers:  # before: the third answer (a's) said "beta", the last model discovered
        assert a.model == a.text.split()[1], (a.model, a.text)


def test_streamed_chunks_name_their_endpoints_model_when_streams_interleave():
    async def main():
        llm = AsyncHybridLLM(edge=FakeBackend(model="edge-model"), cloud=cloud(), cache=False)
        try:
            first = llm.stream("hi", route="cloud")
            c1 = await first.__anext__()  # endpoint a (alpha) starts answering
            second = llm.stream("hi", route="cloud")
            chunks2 = [c async for c in second]  # endpoint b (beta) answers whole meanwhile
            chunks1 = [c1] + [c async for c in first]
        finally:
            await llm.aclose()
        return chunks1, chunks2

    chunks1, chunks2 = asyncio.run(main())
    assert {c.model for c in chunks1} == {"alpha"} and chunks1[-1].completion.model == "alpha"
    assert {c.model for c in chunks2} == {"beta"} and chunks2[-1].completion.model == "beta"


def test_model_outside_an_answer():
    """Configured: that name for every endpoint. Discovered: the model of the latest answer, "cloud"
    before any."""
    assert CloudBackend(base_url=["http://a.test", "http://b.test"], model="m").model == "m"
    b = cloud()
    assert b.model == "cloud"
    assert b.generate([{"role": "user", "content": "hi"}], __import__("hybridllm").GenerationParams()
                      ).text.startswith("from alpha")
    assert b.model == "alpha"


def test_an_answer_names_the_model_its_deltas_name_not_the_backends_latest():
    """The backend's ``model`` moves with every answer (another stream may be read meanwhile): each
    chunk and the completion carry the model the answer's own deltas name."""
    import time

    from hybridllm._pipeline.answer import _Answer
    from hybridllm._types import Usage
    from hybridllm.backends.base import Delta

    backend = FakeBackend(model="alpha")
    answer = _Answer(backend, time.perf_counter(), route="cloud", reason="r", score=None)
    first = answer.feed(Delta("from alpha", model="alpha"))
    backend.model = "beta"  # another answer, from another endpoint, was read meanwhile
    later = answer.feed(Delta(" .", model="alpha"))
    answer.feed(Delta("", finish_reason="stop", usage=Usage(), model="alpha"))
    last = answer.finish()
    assert first is not None and later is not None
    assert (first.model, later.model, last.model, last.completion.model) == ("alpha",) * 4
