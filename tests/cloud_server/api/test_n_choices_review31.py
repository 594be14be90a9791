"""``n`` > 1 on the cloud server (review 31): n choices, each its own engine request.

The engine is the real engine code (scheduler, block manager with its prefix cache, sampler with
per-request seeds) around a random one-layer model (``_tiny_model``), behind the real app on
uvicorn, read through the official ``openai`` client. Before, any n other than 1 was a 400.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from cloud_server.api.server import create_app
from cloud_server.api.serving import usage_of
from cloud_server.config import EngineConfig
from cloud_server.engine.async_engine import AsyncLLMEngine
from cloud_server.exceptions import EngineError, QueueFullError

from ..engine._tiny_model import tiny_config, tiny_model, tiny_runner, tiny_weights
from ..engine.test_fuzz_fake_batching8 import make_engine
from .fake_engine import FakeEngine
from .helpers import ThreadServer, metric_value, sse_payloads

openai = pytest.importorskip("openai")

MODEL = "tiny"
NUM_BLOCKS = 64
BS = 4  # make_engine's block size
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]  # 21 tokens
MSGS = [{"role": "user", "content": "abcdefghij"}]


class _Tok:
    """One id a character (ids 0..63 read '0'..'o'); a chat is its messages' text."""

    eos_token_ids = (7,)

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        return [ord(ch) % 64 for ch in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(0x30 + i) for i in ids)

    def encode_chat(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True,
                    tools: list[dict] | None = None) -> list[int]:
        return self.encode("".join(m["content"] for m in messages))

    def stop_strings(self, messages: list[dict[str, str]]) -> tuple[str, ...]:
        return ()


class _Runner:
    """The tiny model's runner; ``delay`` seconds a step (for tests that hang up mid-answer)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.delay = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        if self.delay:
            time.sleep(self.delay)
        return self.inner.execute(*args, **kwargs)


class _FailingChoice(AsyncLLMEngine):
    """Choice ``fail_index`` of a request fails after two outputs, as an engine error would end it."""

    fail_index: int | None = None

    def generate(self, request_id: str, prompt: Any, params: Any, on_scheduled: Any = None
                 ) -> AsyncIterator[Any]:
        inner = super().generate(request_id, prompt, params, on_scheduled)
        if self.fail_index is None or not request_id.endswith(f"-{self.fail_index}"):
            return inner

        async def broken() -> AsyncIterator[Any]:
            try:
                seen = 0
                async for out in inner:
                    yield out
                    seen += 1
                    if seen == 2:
                        raise EngineError("the step failed")
            finally:
                await inner.aclose()  # type: ignore[attr-defined]

        return broken()


def _engine(max_num_seqs: int = 8, max_waiting: int = 64) -> _FailingChoice:
    cfg = tiny_config()
    eng = make_engine(NUM_BLOCKS, max_num_seqs=max_num_seqs, budget=128)
    eng.runner = _Runner(tiny_runner(tiny_model(cfg, tiny_weights(cfg, scale=0.5)), cfg,
                                     num_blocks=NUM_BLOCKS, block_size=BS))
    eng.model_config.vocab_size = cfg.vocab_size
    eng.tokenizer = _Tok()
    eng.model_name = MODEL
    eng.describe = lambda: "tiny"
    eng.scheduler.max_waiting = max_waiting
    return _FailingChoice(EngineConfig(model="stub", max_waiting=max_waiting), engine=eng)


@pytest.fixture(scope="module")
def engine() -> _FailingChoice:
    return _engine()


@pytest.fixture(scope="module")
def server(engine: _FailingChoice) -> Iterator[ThreadServer]:
    srv = ThreadServer(create_app(lambda: engine, served_model_name=MODEL, power_watts=50.0)).start()
    yield srv
    srv.stop()


@pytest.fixture()
def client(server: ThreadServer) -> Iterator[Any]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0) as c:
        yield c


def _idle(engine: AsyncLLMEngine, timeout_s: float = 10.0) -> None:
    """The engine holds no request and every block is back in the pool."""
    inner = engine.engine
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        bm = inner.block_manager
        if not inner.has_unfinished() and bm.num_free_blocks == bm.num_blocks and not engine._queues:
            return
        time.sleep(0.01)
    raise AssertionError(f"not idle: {inner.stats()}")


def _texts(choices: list[Any], chat: bool) -> list[str]:
    assert [c.index for c in choices] == list(range(len(choices)))
    return [c.message.content if chat else c.text for c in choices]


SAMPLED = {"temperature": 1.5, "max_tokens": 8, "extra_body": {"ignore_eos": True}}


def test_chat_n3_seeded_distinct_reproducible_and_choice_i_is_seed_plus_i(client: Any) -> None:
    one = client.chat.completions.create(model=MODEL, messages=MSGS, n=3, seed=11, **SAMPLED)
    texts = _texts(one.choices, chat=True)
    assert len(set(texts)) == 3, texts  # a seed per choice: the answers differ
    assert all(c.finish_reason == "length" for c in one.choices)
    again = client.chat.completions.create(model=MODEL, messages=MSGS, n=3, seed=11, **SAMPLED)
    assert _texts(again.choices, chat=True) == texts  # the whole response is reproducible
    for i in range(3):  # choice i samples as a single request seeded seed + i
        single = client.chat.completions.create(model=MODEL, messages=MSGS, seed=11 + i, **SAMPLED)
        assert single.choices[0].message.content == texts[i]
    # usage: the prompt once, the completion tokens of every choice
    assert one.usage.prompt_tokens == len(MSGS[0]["content"])
    assert one.usage.completion_tokens == 3 * 8
    assert one.usage.total_tokens == one.usage.prompt_tokens + 24


def test_completions_n3_seeded_and_a_seed_near_2_64_wraps(client: Any) -> None:
    body = client.completions.create(model=MODEL, prompt=PROMPT, n=3, seed=2**64 - 2, **SAMPLED)
    texts = _texts(body.choices, chat=False)
    assert len(set(texts)) == 3
    # choice 2's seed is (2^64 - 2 + 2) mod 2^64 = 0
    zero = client.completions.create(model=MODEL, prompt=PROMPT, seed=0, **SAMPLED)
    assert zero.choices[0].text == texts[2]
    assert body.usage.prompt_tokens == len(PROMPT) and body.usage.completion_tokens == 24


def test_greedy_n_gives_n_identical_answers(client: Any) -> None:
    body = client.chat.completions.create(model=MODEL, messages=MSGS, n=4, temperature=0, max_tokens=6,
                                          extra_body={"ignore_eos": True})
    texts = _texts(body.choices, chat=True)
    assert len(texts) == 4 and len(set(texts)) == 1


@pytest.mark.parametrize("chat", [True, False])
def test_streamed_choices_interleave_with_their_index_then_usage_once(client: Any, chat: bool) -> None:
    kw: dict[str, Any] = dict(model=MODEL, n=3, seed=5, **SAMPLED)
    create = client.chat.completions.create if chat else client.completions.create
    where = {"messages": MSGS} if chat else {"prompt": PROMPT}
    whole = create(**where, **kw)
    chunks = list(create(**where, **kw, stream=True, stream_options={"include_usage": True}))
    body, usage = chunks[:-1], chunks[-1]
    assert usage.choices == [] and usage.usage.completion_tokens == whole.usage.completion_tokens
    assert usage.usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(c.usage is None and len(c.choices) == 1 for c in body)
    order = [c.choices[0].index for c in body]
    assert set(order) == {0, 1, 2}
    # interleaved as produced: not all of choice 0 before choice 1 starts
    first_of_1 = order.index(1)
    assert first_of_1 < max(i for i, index in enumerate(order) if index == 0)
    for i in range(3):
        mine = [c.choices[0] for c in body if c.choices[0].index == i]
        if chat:
            assert mine[0].delta.role == "assistant"  # the first chunk of each choice
            assert all(m.delta.role is None for m in mine[1:])
            text = "".join(m.delta.content or "" for m in mine)
        else:
            text = "".join(m.text for m in mine)
        reasons = [m.finish_reason for m in mine]
        assert reasons[-1] == "length" and reasons[:-1] == [None] * (len(mine) - 1)  # its own end
        assert text == _texts(whole.choices, chat)[i]  # the same seeded answer as non-streamed


def test_the_prompt_is_prefilled_once(server: ThreadServer, engine: _FailingChoice) -> None:
    """Choices 1..n-1 start once choice 0 has computed the prompt: they take its full blocks from
    the prefix cache (all but the last partial block's tokens are computed once). The engine is
    kept busy by another request, so choices added together would be prefilled in one step."""
    _idle(engine)
    bm = engine.engine.block_manager
    bm.reset_prefix_cache()
    engine.engine.runner.delay = 0.02
    try:
        with httpx.stream("POST", f"{server.url}/v1/completions", timeout=30, json={
                "model": MODEL, "prompt": [60, 61, 62], "max_tokens": 30, "ignore_eos": True,
                "stream": True}) as busy:
            next(busy.iter_lines())  # it runs: each step now takes 20 ms
            hits = bm.prefix_cache_hits
            prompt = [30 + i % 20 for i in range(23)]  # not seen before: no hit for choice 0
            r = httpx.post(f"{server.url}/v1/completions", timeout=30, json={
                "model": MODEL, "prompt": prompt, "n": 3, "max_tokens": 4, "temperature": 0,
                "ignore_eos": True})
    finally:
        engine.engine.runner.delay = 0.0
    assert r.status_code == 200, r.text
    # (23 - 1) // 4 = 5 full blocks, 20 tokens, for each of choices 1 and 2
    assert bm.prefix_cache_hits - hits == 2 * 20
    # cached_tokens: choice 0's lookup (the prompt is counted once)
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    _idle(engine)


def test_usage_and_metrics_count_the_prompt_once_and_energy_sums(server: ThreadServer,
                                                                 engine: _FailingChoice) -> None:
    _idle(engine)
    before = httpx.get(f"{server.url}/metrics").text

    def metric(text: str, name: str, **labels: str) -> float:
        return metric_value(text, name, model=MODEL, **labels) or 0.0

    r = httpx.post(f"{server.url}/v1/completions", json={
        "model": MODEL, "prompt": PROMPT, "n": 3, "max_tokens": 5, "seed": 3, "ignore_eos": True})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    _idle(engine)
    after = httpx.get(f"{server.url}/metrics").text
    assert metric(after, "hybridllm_prompt_tokens_total") - metric(before, "hybridllm_prompt_tokens_total") \
        == usage["prompt_tokens"] == len(PROMPT)
    assert metric(after, "hybridllm_generation_tokens_total") - \
        metric(before, "hybridllm_generation_tokens_total") == usage["completion_tokens"] == 15
    # each choice is an engine request (as vLLM counts its n > 1 child requests)
    assert metric(after, "hybridllm_requests_finished_total", finish_reason="length") - \
        metric(before, "hybridllm_requests_finished_total", finish_reason="length") == 3
    energy = usage["energy"]
    joules = metric(after, "hybridllm_energy_joules_total", source="estimate") - \
        metric(before, "hybridllm_energy_joules_total", source="estimate")
    assert energy["source"] == "estimate" and energy["joules"] > 0
    assert energy["joules"] == pytest.approx(joules, abs=1e-5)  # the sum of the choices' shares
    assert energy["joules_per_output_token"] == pytest.approx(energy["joules"] / 15, abs=1e-5)


def test_usage_of_sums_choices() -> None:
    def out(tokens: int, joules: float | None, source: str = "rapl") -> Any:
        report = None if joules is None else {"joules": joules, "source": source,
                                             "joules_per_output_token": joules / tokens}
        return SimpleNamespace(num_prompt_tokens=10, num_output_tokens=tokens, num_cached_tokens=4,
                               energy=report)

    usage = usage_of(out(2, 1.0), out(3, 2.0), out(5, 3.0))
    assert usage["prompt_tokens"] == 10 and usage["completion_tokens"] == 10 and usage["total_tokens"] == 20
    assert usage["prompt_tokens_details"] == {"cached_tokens": 4}
    assert usage["energy"] == {"joules": 6.0, "source": "rapl", "joules_per_output_token": 0.6}
    assert usage_of(out(2, 1.0), out(3, 2.0, "estimate"))["energy"]["source"] == "estimate+rapl"
    assert "energy" not in usage_of(out(2, 1.0), out(3, None))  # no figure for one: none for all
    assert usage_of(out(2, 1.5))["energy"]["joules"] == 1.5  # n=1 as before


@pytest.mark.parametrize("stream", [False, True])
def test_a_failed_choice_fails_the_request_and_aborts_the_others(server: ThreadServer,
                                                                  engine: _FailingChoice,
                                                                  stream: bool) -> None:
    _idle(engine)
    before = httpx.get(f"{server.url}/metrics").text
    engine.fail_index = 1
    engine.engine.runner.delay = 0.005  # the others are still running when choice 1 fails
    try:
        r = httpx.post(f"{server.url}/v1/chat/completions", timeout=30, json={
            "model": MODEL, "messages": MSGS, "n": 3, "max_tokens": 30, "ignore_eos": True,
            "stream": stream})
    finally:
        engine.fail_index = None
        engine.engine.runner.delay = 0.0
    if stream:
        assert r.status_code == 200
        events = sse_payloads(iter(r.text.splitlines()))
        assert events[-1] == "[DONE]" and events[-2]["error"]["type"] == "server_error"
        # no choice finished: the other two were cut off with the request
        assert not [e for e in events[:-2] if e["choices"] and e["choices"][0]["finish_reason"]]
    else:
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert "choices" not in r.json()  # no half answer
    _idle(engine)  # every block is back
    after = httpx.get(f"{server.url}/metrics").text

    def finished(reason: str) -> float:
        def value(text: str) -> float:
            return metric_value(text, "hybridllm_requests_finished_total", model=MODEL,
                                finish_reason=reason) or 0.0

        return value(after) - value(before)

    # the failed choice is an error; the other two were aborted with it, not left to run
    assert (finished("error"), finished("abort"), finished("length")) == (1, 2, 0)


def test_a_client_that_hangs_up_aborts_every_choice(server: ThreadServer, engine: _FailingChoice) -> None:
    _idle(engine)
    before = metric_value(httpx.get(f"{server.url}/metrics").text, "hybridllm_requests_finished_total",
                          model=MODEL, finish_reason="abort") or 0.0
    engine.engine.runner.delay = 0.01
    try:
        with httpx.stream("POST", f"{server.url}/v1/completions", timeout=30, json={
                "model": MODEL, "prompt": PROMPT, "n": 3, "max_tokens": 18, "ignore_eos": True,
                "stream": True}) as r:
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["index"] == 2:
                    break  # every choice has started
        # the connection is closed here, mid-answer
        _idle(engine)
    finally:
        engine.engine.runner.delay = 0.0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        after = metric_value(httpx.get(f"{server.url}/metrics").text, "hybridllm_requests_finished_total",
                             model=MODEL, finish_reason="abort") or 0.0
        if after - before == 3:
            break
        time.sleep(0.02)
    assert after - before == 3


def test_n_with_speculative_decoding(client: Any) -> None:
    plain = client.completions.create(model=MODEL, prompt=PROMPT, temperature=0, max_tokens=10,
                                      extra_body={"ignore_eos": True})
    spec = client.completions.create(model=MODEL, prompt=PROMPT, n=2, temperature=0, max_tokens=10,
                                     extra_body={"ignore_eos": True, "speculative_method": "ngram",
                                                 "num_speculative_tokens": 3})
    assert _texts(spec.choices, chat=False) == [plain.choices[0].text] * 2  # lossless, each choice


def test_bounds_and_the_document(server: ThreadServer) -> None:
    for n in (0, 129, 2.5):
        r = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": PROMPT, "n": n})
        assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
    doc = httpx.get(f"{server.url}/openapi.json").json()["components"]["schemas"]
    for name in ("CloudChatCompletionRequest", "CloudCompletionRequest"):
        assert doc[name]["properties"]["n"]["anyOf"][0]["maximum"] == 128


def test_a_full_queue_refuses_the_whole_request() -> None:
    """Each choice counts against the queue: 2 batch slots and 1 waiting place hold 3 choices, so
    n=4 is a 429 (not 3 choices served), its admitted choices aborted; n=3 is served. The engine's
    config keeps the default 16 slots, so the server's capacity check (an ``n`` no idle server could
    hold is a 400, test_n_capacity_review40) lets n=4 through: a scheduler smaller than its config
    stands in for a server whose other slots are busy."""
    engine = _engine(max_num_seqs=2, max_waiting=1)
    srv = ThreadServer(create_app(lambda: engine, served_model_name=MODEL, energy="off")).start()
    try:
        engine.engine.runner.delay = 0.005
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "ignore_eos": True}
        refused = httpx.post(f"{srv.url}/v1/completions", json={**body, "n": 4}, timeout=30)
        assert refused.status_code == 429, refused.text
        assert "choices" not in refused.json()
        _idle(engine)
        text = httpx.get(f"{srv.url}/metrics").text
        # counted once, as rejected: its aborted choices are no finished requests
        assert metric_value(text, "hybridllm_requests_rejected_total", status="429") == 1
        assert metric_value(text, "hybridllm_requests_finished_total", finish_reason="abort") is None
        served = httpx.post(f"{srv.url}/v1/completions", json={**body, "n": 3}, timeout=30)
        assert served.status_code == 200 and len(served.json()["choices"]) == 3
        _idle(engine)
    finally:
        srv.stop()


def test_a_client_gone_while_choices_are_admitted_leaves_nothing_behind(engine: _FailingChoice,
                                                                       server: ThreadServer) -> None:
    """Cancelled during admission (choice 0 taken, the others being added): all are aborted."""
    from cloud_server.api.generation import Choices, Prepared
    from cloud_server.api.metrics import ServerMetrics
    from cloud_server.engine.sampling_params import SamplingParams

    _idle(engine)
    metrics = ServerMetrics(lambda: None, lambda: MODEL)
    prepared = Prepared(kind="completion", request_id="cmpl-x", prompt_ids=list(PROMPT),
                        params=SamplingParams(max_tokens=10, ignore_eos=True), stream=False,
                        include_usage=False, created=0, n=5)

    async def main() -> None:
        task = asyncio.ensure_future(Choices.admit(engine, prepared, metrics.request_timer))
        while not any(rid.endswith("-2") for rid in engine._queues):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    # on the server's loop, which runs the engine's
    loop = engine._loop_task.get_loop()  # type: ignore[union-attr]
    asyncio.run_coroutine_threadsafe(main(), loop).result(timeout=30)
    _idle(engine)


@pytest.mark.parametrize("stream", [False, True])
def test_each_choice_has_its_own_logprobs(client: Any, stream: bool) -> None:
    kw: dict[str, Any] = dict(model=MODEL, prompt=PROMPT, n=2, seed=9, logprobs=1, **SAMPLED)
    if not stream:
        body = client.completions.create(**kw)
        texts = _texts(body.choices, chat=False)
        tokens = [c.logprobs.tokens for c in body.choices]
    else:
        chunks = list(client.completions.create(**kw, stream=True))
        texts = ["".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in range(2)]
        tokens = [[t for c in chunks if c.choices[0].index == i and c.choices[0].logprobs
                   for t in c.choices[0].logprobs.tokens] for i in range(2)]
    assert texts[0] != texts[1]
    assert ["".join(t) for t in tokens] == texts  # each choice's entries are its own tokens'
    assert [len(t) for t in tokens] == [8, 8]


class _Replicas(FakeEngine):
    """As the cluster's front end: choice ``refuse`` is refused at its first output (a replica's
    queue full), and each answer's last output carries its replica's energy report."""

    refuse: int | None = None

    def generate(self, request_id: str, prompt: Any, params: Any, on_scheduled: Any = None
                 ) -> AsyncIterator[Any]:
        if self.refuse is not None and request_id.endswith(f"-{self.refuse}"):
            async def refused() -> AsyncIterator[Any]:
                raise QueueFullError("the replica's queue is full", retry_after_s=1.0)
                yield

            return refused()
        inner = super().generate(request_id, prompt, params)
        joules = 1.5 if request_id.endswith("-0") else 2.5

        async def reported() -> AsyncIterator[Any]:
            async for out in inner:
                if out.finished:
                    out.energy = {"joules": joules, "source": "nvml", "joules_per_output_token": 0.1}
                yield out

        return reported()


def test_cluster_style_refusal_and_replica_energy() -> None:
    engine = _Replicas(step_s=0.01)
    srv = ThreadServer(create_app(lambda: engine, energy="remote")).start()
    try:
        body = {"model": "fake-model", "prompt": "hi", "max_tokens": 20, "ignore_eos": True}
        engine.refuse = 2
        # 300 tokens take 3 s: choices 0 and 1 end long before unless they are aborted
        refused = httpx.post(f"{srv.url}/v1/completions", json={**body, "n": 3, "max_tokens": 300},
                             timeout=30)
        assert refused.status_code == 429, refused.text
        deadline = time.monotonic() + 1.5

        def whole() -> bool:
            return not engine.live and engine.num_free_blocks == engine.num_total_blocks

        while not whole() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert whole()  # choices 0 and 1 were aborted: the fake's pool is whole
        text = httpx.get(f"{srv.url}/metrics").text
        assert metric_value(text, "hybridllm_requests_rejected_total", status="429") == 1
        assert metric_value(text, "hybridllm_requests_finished_total", finish_reason="abort") is None
        engine.refuse = None
        served = httpx.post(f"{srv.url}/v1/completions", json={**body, "n": 2}, timeout=30).json()
        assert served["usage"]["energy"] == {"joules": 4.0, "source": "nvml",
                                             "joules_per_output_token": 0.1}  # 4 J over 40 tokens
        text = httpx.get(f"{srv.url}/metrics").text
        assert metric_value(text, "hybridllm_energy_joules_total", source="nvml") == 4.0
    finally:
        srv.stop()
