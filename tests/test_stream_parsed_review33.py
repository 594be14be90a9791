"""A stream's completion carries ``parsed`` too (review 33): ``with llm.stream(..., response_format=
...) as s`` then ``s.completion.parsed`` is the answer read as JSON, sync and async, as ``chat()``
gives it. Before, only ``chat()`` set it, and a streamed answer's completion said None. Fast: fakes."""

from __future__ import annotations

import asyncio

from hybridllm import AsyncHybridLLM, HybridLLM

from .test_response_format_review32 import SCHEMA, Recording

ADA = {"name": "Ada", "age": 36}


def test_a_streamed_answers_completion_is_parsed() -> None:
    with HybridLLM(edge=Recording(), cache=False) as llm:
        with llm.stream("who?", response_format=SCHEMA) as stream:
            text = "".join(chunk.text for chunk in stream)
        assert stream.completion is not None and stream.completion.parsed == ADA
        assert text == '{"name": "Ada", "age": 36}'
        with llm.stream("who?") as plain:  # no format: nothing parsed
            list(plain)
        assert plain.completion is not None and plain.completion.parsed is None


def test_an_async_streamed_answers_completion_is_parsed() -> None:
    async def main() -> tuple:
        async with AsyncHybridLLM(edge=Recording(), cache=False) as llm:
            async with llm.stream("who?", response_format=SCHEMA) as stream:
                async for _ in stream:
                    pass
            async with llm.stream("who?") as plain:
                async for _ in plain:
                    pass
            return stream.completion.parsed, plain.completion.parsed

    assert asyncio.run(main()) == (ADA, None)
