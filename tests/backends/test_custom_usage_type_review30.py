"""A custom backend whose last Delta's ``usage`` is not a ``Usage`` (review 30).

Before: a dict, a number or a string as ``Delta.usage`` failed the request with an AttributeError
traceback ('dict' object has no attribute 'prompt_tokens'), on either side, sync or async. Now
the usage is unknown for that request, as from a backend that reports none (the pipeline
estimates a cloud call's tokens), one warning names the backend, the answer arrives, and
``stats()`` stays finite."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterator

import pytest

from hybridllm import AsyncHybridLLM, HybridLLM, Usage
from hybridllm.backends.base import Backend, Delta
from hybridllm.backends.fake import FakeBackend

ODD = [
    {"prompt_tokens": 3, "completion_tokens": 2},  # OpenAI's usage object, as a dict
    7,
    math.nan,
    "12 tokens",
    [3, 2],
]
IDS = ["dict", "int", "nan", "str", "list"]


class _Custom(Backend):
    """A user's backend, written against the Backend ABC, whose usage is ``usage``."""

    name = "homemade"
    model = "homemade-1"

    def __init__(self, usage: object) -> None:
        self.usage = usage

    def stream(self, messages, params) -> Iterator[Delta]:
        yield Delta("a custom")
        yield Delta(" answer")
        yield Delta("", "stop", self.usage)  # type: ignore[arg-type]  # what the test is about


def _parts(side: str, usage: object) -> dict:
    custom = _Custom(usage)
    return {"edge": custom, "cloud": FakeBackend()} if side == "edge" else \
        {"edge": FakeBackend(), "cloud": custom}


def _said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def _check(c, stats: dict, said: list[str], side: str, usage: object, before: int = 0) -> None:
    """``before``: the cloud tokens ``stats()`` counted for earlier requests."""
    assert c.text == "a custom answer" and c.route == side
    assert isinstance(c.usage, Usage)
    assert c.energy_j is None and c.co2_g is None
    if side == "cloud":  # the pipeline's estimate, as for a cloud that sends no count
        assert c.usage.prompt_tokens > 0 and c.usage.completion_tokens > 0
        assert stats["cloud_tokens"] == before + c.usage.total_tokens
    else:  # the device's usage is unknown: none, as from a backend that reports none
        assert c.usage.total_tokens == 0
    assert all(math.isfinite(v) for v in stats.values() if isinstance(v, float)), stats
    assert len(said) == 1, said
    assert "'homemade' (_Custom)" in said[0] and type(usage).__name__ in said[0], said
    assert ("cloud" if side == "cloud" else "device") in said[0]


@pytest.mark.parametrize("side", ["edge", "cloud"])
@pytest.mark.parametrize("usage", ODD, ids=IDS)
def test_sync_chat_answers_and_warns_once(side, usage, caplog):
    with HybridLLM(**_parts(side, usage), cache=False) as llm, \
            caplog.at_level(logging.WARNING, logger="hybridllm"):
        c = llm.chat("hello", route=side)
        said = _said(caplog)
        stats = llm.stats()
    _check(c, stats, said, side, usage)


@pytest.mark.parametrize("side", ["edge", "cloud"])
def test_sync_stream_answers_and_warns_once(side, caplog):
    usage = {"prompt_tokens": 3, "completion_tokens": 2}
    with HybridLLM(**_parts(side, usage), cache=False) as llm, \
            caplog.at_level(logging.WARNING, logger="hybridllm"):
        with llm.stream("hello", route=side) as s:
            text = "".join(chunk.text for chunk in s)
        said = _said(caplog)
        stats = llm.stats()
    assert text == "a custom answer"
    assert s.completion is not None
    _check(s.completion, stats, said, side, usage)


@pytest.mark.parametrize("side", ["edge", "cloud"])
@pytest.mark.parametrize("usage", [ODD[0], ODD[3]], ids=["dict", "str"])
def test_async_chat_and_stream_answer_and_warn(side, usage, caplog):
    async def main() -> tuple:
        async with AsyncHybridLLM(**_parts(side, usage), cache=False) as llm:
            c = await llm.chat("hello", route=side)
            first, stats = _said(caplog), llm.stats()
            caplog.clear()
            async with llm.stream("hello again", route=side) as s:
                text = "".join([chunk.text async for chunk in s])
            return c, first, stats, s.completion, text, _said(caplog), llm.stats()

    with caplog.at_level(logging.WARNING, logger="hybridllm"):
        c, first, stats, streamed, text, second, after = asyncio.run(main())
    assert text == "a custom answer"
    _check(c, stats, first, side, usage)
    _check(streamed, after, second, side, usage, before=stats["cloud_tokens"])


def test_a_good_usage_after_a_bad_one_is_counted(caplog):
    """The bad usage is unknown for its own request only: the next one's count is the backend's."""
    cloud = _Custom({"prompt_tokens": 3})
    with HybridLLM(edge=FakeBackend(), cloud=cloud, cache=False) as llm:
        llm.chat("one", route="cloud")
        cloud.usage = Usage(prompt_tokens=5, completion_tokens=4)
        c = llm.chat("two", route="cloud")
    assert (c.usage.prompt_tokens, c.usage.completion_tokens) == (5, 4)
