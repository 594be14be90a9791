"""The first ``response_format`` request builds the vocabulary's TokenIndex (seconds for Qwen2.5's
151,936 tokens on a small CPU). The async front end builds it in a worker thread before it hands
the request to the engine thread, so a batch already running goes on stepping meanwhile. Before,
``add_request`` built it on the engine thread: every running stream stalled until it was done.
"""

from __future__ import annotations

import asyncio
import json
import threading

import cloud_server.engine.structured as structured
from cloud_server.config import EngineConfig
from cloud_server.engine.async_engine import AsyncLLMEngine
from cloud_server.engine.sampling_params import SamplingParams

from .test_structured_output_review32 import JSON_OBJECT, PROMPTS, json_engine


async def _text(stream) -> str:
    text = ""
    async for out in stream:
        text += out.delta_text
    return text


def _texts(eng, requests: list[tuple[str, list[int], SamplingParams]]) -> list[str]:
    """Each request's text, streamed at once from an AsyncLLMEngine driving ``eng``."""
    async def main():
        engine = AsyncLLMEngine(EngineConfig(model="stub", max_waiting=1000), engine=eng)
        await engine.start()
        try:
            return await asyncio.wait_for(asyncio.gather(
                *(_text(engine.generate(rid, prompt, params)) for rid, prompt, params in requests)), 60)
        finally:
            await engine.stop()

    return asyncio.run(main())


def test_a_running_stream_keeps_stepping_while_the_first_index_is_built(monkeypatch) -> None:
    release, building = threading.Event(), threading.Event()
    real_build = structured.build_index

    def slow_build(*args, **kwargs):  # a large vocabulary's pass, held until the test lets it go
        building.set()
        release.wait(30)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(structured, "build_index", slow_build)
    eng = json_engine(1.0)

    async def main():
        engine = AsyncLLMEngine(EngineConfig(model="stub", max_waiting=1000), engine=eng)
        await engine.start()
        try:
            plain = asyncio.create_task(_text(engine.generate(
                "plain", PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))))
            await asyncio.sleep(0)
            shaped = asyncio.create_task(_text(engine.generate(
                "json", PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=280,
                                                   response_format=JSON_OBJECT))))
            assert await asyncio.to_thread(building.wait, 10)
            # the index is still being built: the plain stream must finish all the same
            done, _ = await asyncio.wait({plain}, timeout=10)
            finished_while_building = plain in done and not release.is_set()
            release.set()
            return finished_while_building, await asyncio.wait_for(plain, 10), \
                await asyncio.wait_for(shaped, 30)
        finally:
            release.set()
            await engine.stop()

    finished_while_building, plain_text, json_text = asyncio.run(main())
    assert finished_while_building, "the plain stream stalled while the index was built"
    assert plain_text
    assert isinstance(json.loads(json_text), dict)
    assert eng.runner.token_index is not None and eng.runner.token_index is eng.prepare_structured()


def test_concurrent_first_requests_build_the_index_once(monkeypatch) -> None:
    calls = []
    real_build = structured.build_index

    def counted(*args, **kwargs):
        calls.append(1)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(structured, "build_index", counted)
    params = SamplingParams(temperature=0.0, max_tokens=280, response_format=JSON_OBJECT)
    texts = _texts(json_engine(1.0), [(f"j{i}", p, params) for i, p in enumerate(PROMPTS)])
    assert len(calls) == 1
    assert all(isinstance(json.loads(t), dict) for t in texts)


def test_a_new_patterns_token_groups_are_built_off_the_engine_thread(monkeypatch) -> None:
    # a pattern's first mask needs a pass over the vocabulary (its token groups): the front end
    # makes it beside the batch too, not the engine thread in the middle of a step
    from hybridllm._structured import TokenIndex

    from .test_pattern_format_engine_review33 import EVENT, _check

    threads: list[str] = []
    real = TokenIndex._pattern_groups

    def recorded(self, regex, raw=False):
        with self._lock:
            new = (regex, raw) not in self._groups
        if new:
            threads.append(threading.current_thread().name)
        return real(self, regex, raw)

    monkeypatch.setattr(TokenIndex, "_pattern_groups", recorded)
    params = SamplingParams(temperature=0.0, max_tokens=280, response_format=EVENT)
    (text,) = _texts(json_engine(1.0), [("e", PROMPTS[0], params)])
    _check(text)
    assert len(threads) == 3, threads  # the date format and two patterns, once each
    assert not any(name.startswith("hybridllm-engine") for name in threads), threads
