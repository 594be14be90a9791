"""``n`` = 2 on the real server (SmolLM2 weights, in-process uvicorn) through the official client:
two seeded answers that differ, streamed as they are answered whole, greedy ones alike, the prompt
computed once, every block back afterwards (review 31; before, n=2 was a 400)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cloud_server.api.server import create_app

from .helpers import ThreadServer

pytestmark = pytest.mark.real
openai = pytest.importorskip("openai")

MODEL = "smol"
MSGS = [{"role": "user", "content": "Write one short sentence about the sea, please, in plain English."}]


@pytest.fixture(scope="module")
def served(smollm2_path: Path) -> Iterator[tuple[ThreadServer, Any]]:
    from cloud_server.config import EngineConfig
    from cloud_server.engine.async_engine import AsyncLLMEngine

    config = EngineConfig(str(smollm2_path), max_model_len=512, kv_cache_memory_bytes=128 << 20,
                          block_size=16)
    engine = AsyncLLMEngine(config)
    srv = ThreadServer(create_app(lambda: engine, served_model_name=MODEL)).start(timeout_s=180)
    yield srv, engine
    srv.stop()


def _idle(engine: Any) -> None:
    inner = engine.engine
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        bm = inner.block_manager
        if not inner.has_unfinished() and bm.num_free_blocks == bm.num_blocks:
            return
        time.sleep(0.02)
    raise AssertionError(f"not idle: {inner.stats()}")


def test_n2_on_smollm2(served: tuple[ThreadServer, Any]) -> None:
    srv, engine = served
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0)
    bm = engine.engine.block_manager
    hits = bm.prefix_cache_hits
    kw: dict[str, Any] = dict(model=MODEL, messages=MSGS, n=2, seed=7, temperature=1.0, max_tokens=24)
    whole = client.chat.completions.create(**kw)
    texts = [c.message.content for c in whole.choices]
    assert [c.index for c in whole.choices] == [0, 1]
    assert texts[0] != texts[1] and all(texts), texts
    prompt = whole.usage.prompt_tokens
    # choice 1 found choice 0's full prompt blocks in the prefix cache
    assert bm.prefix_cache_hits - hits >= (prompt - 1) // 16 * 16 > 0
    # streamed: the same two answers, each with its index, its role chunk and its finish
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    streamed = ["".join(c.choices[0].delta.content or "" for c in chunks[:-1] if c.choices[0].index == i)
                for i in range(2)]
    assert streamed == texts
    assert chunks[-1].usage.prompt_tokens == prompt
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    for i in range(2):
        mine = [c.choices[0] for c in chunks[:-1] if c.choices[0].index == i]
        assert mine[0].delta.role == "assistant" and mine[-1].finish_reason in ("stop", "length")
    single = [client.chat.completions.create(model=MODEL, messages=MSGS, seed=7 + i, temperature=1.0,
                                             max_tokens=24) for i in range(2)]
    assert [s.choices[0].message.content for s in single] == texts  # choice i: seeded seed + i
    # usage: the prompt once, the choices' completion tokens summed
    assert whole.usage.prompt_tokens == single[0].usage.prompt_tokens
    assert whole.usage.completion_tokens == sum(s.usage.completion_tokens for s in single)
    greedy = client.completions.create(model=MODEL, prompt="The capital of France is", n=2,
                                       temperature=0, max_tokens=8)
    assert greedy.choices[0].text == greedy.choices[1].text
    _idle(engine)
