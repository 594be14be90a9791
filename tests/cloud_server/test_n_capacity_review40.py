"""``n`` past what the engine can ever hold at once is a 400 naming ``n`` (review 40).

Each choice of an ``n`` > 1 request is an engine request of its own: an idle engine takes
``--max-num-seqs`` of them into its batch and ``--max-waiting`` more into its queue. Before, a
request with more choices than that was a 429 with ``Retry-After: 1`` even on an idle server: it
could never be admitted, yet the official ``openai`` client retried it (twice, by default) before
raising ``RateLimitError``, and a client that keeps retrying a 429 never stopped. The engine is the
real engine code (scheduler, block manager, ``AsyncLLMEngine``) around a fake model runner.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest

from cloud_server.api.server import create_app
from cloud_server.config import EngineConfig
from cloud_server.engine.async_engine import AsyncLLMEngine
from cloud_server.exceptions import InvalidRequestError

from .api.helpers import ThreadServer, metric_value
from .engine.test_fuzz_fake_batching8 import EOS, make_engine

openai = pytest.importorskip("openai")

MODEL = "tiny"
PROMPT = [1, 2, 3, 4, 5]


class _Tok:
    """Ids 0..25 read 'a'..'z'; a chat is its messages' text."""

    eos_token_ids = (EOS,)
    vocab_size = 26  # the fake runner's (make_engine's VOCAB)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        return [(ord(ch) - ord("a")) % 26 for ch in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + i) for i in ids)

    def encode_chat(
        self,
        messages: list[dict[str, str]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
    ) -> list[int]:
        return self.encode("".join(m["content"] for m in messages))

    def stop_strings(self, messages: list[dict[str, str]]) -> tuple[str, ...]:
        return ()


def _engine(max_num_seqs: int, max_waiting: int) -> AsyncLLMEngine:
    eng = make_engine(64, max_num_seqs=max_num_seqs, budget=64)
    eng.tokenizer = _Tok()
    eng.scheduler.max_waiting = max_waiting
    eng.model_name = MODEL
    eng.describe = lambda: "fake runner"
    config = EngineConfig(
        model="stub", max_num_seqs=max_num_seqs, max_num_batched_tokens=64, max_waiting=max_waiting
    )
    return AsyncLLMEngine(config, engine=eng)


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadServer]:
    # 2 batch slots and 1 waiting place: at most 3 choices at once
    srv = ThreadServer(create_app(lambda: _engine(2, 1), served_model_name=MODEL, energy="off")).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("chat", [False, True])
def test_n_past_the_engine_is_a_400_at_once_not_a_429_the_client_retries(
    server: ThreadServer, chat: bool
) -> None:
    # the client's default retries: a 429 was sent three times (about 3 s of Retry-After waits)
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="none") as client:
        start = time.monotonic()
        with pytest.raises(openai.BadRequestError) as info:
            if chat:
                client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "abc"}], n=4, max_tokens=3
                )
            else:
                client.completions.create(model=MODEL, prompt=PROMPT, n=4, max_tokens=3)
        assert time.monotonic() - start < 2.0  # not retried
    error = info.value.body
    assert error["param"] == "n" and error["type"] == "invalid_request_error"
    assert "n <= 3" in error["message"] and "--max-num-seqs" in error["message"], error
    text = httpx.get(f"{server.url}/metrics").text
    assert metric_value(text, "hybridllm_requests_rejected_total", status="429") is None


def test_n_that_fits_is_still_served(server: ThreadServer) -> None:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0) as client:
        body = client.completions.create(
            model=MODEL, prompt=PROMPT, n=3, max_tokens=3, extra_body={"ignore_eos": True}
        )
    assert [c.index for c in body.choices] == [0, 1, 2]
    assert body.usage.completion_tokens == 9


def test_an_engine_without_a_config_is_not_checked() -> None:
    """A cluster's engine (replicas, each with its own queue) says no capacity: nothing refused."""
    from cloud_server.api.serving import _check_n_fits

    _check_n_fits(128, None)
    _check_n_fits(3, SimpleNamespace(max_num_seqs=2, max_waiting=1))
    with pytest.raises(InvalidRequestError) as info:
        _check_n_fits(4, SimpleNamespace(max_num_seqs=2, max_waiting=1))
    assert info.value.param == "n"
