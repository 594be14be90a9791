"""Review 16 of the cloud server's HTTP layer (fake engine, in-process client):

- a NaN or +inf log-probability (a model whose logits overflowed) made a non-streamed answer a
  500 (JSON has no NaN: the answer's text was lost) and put a bare ``NaN``, no JSON, in a stream's
  chunk; now such a value is sent as ``null`` (as vLLM's pydantic responses do) and -inf keeps
  OpenAI's -9999.0 floor."""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from cloud_server.api.server import create_app
from cloud_server.engine.logprobs import TokenLogprob
from cloud_server.engine.sampling_params import SamplingParams

from .fake_engine import FakeEngine

# the logprob of each token the fake emits, in turn (and its top entries the same values)
_ODD = [math.nan, math.inf, -math.inf, -0.5]


class _OddLogprobs(FakeEngine):
    """Attaches a log-probability entry to each token, from ``_ODD`` in turn."""

    def generate(self, request_id: str, prompt: str | list[int],
                 params: SamplingParams, on_scheduled: Any = None) -> AsyncIterator[Any]:
        inner = super().generate(request_id, prompt, params, on_scheduled)

        async def outputs() -> AsyncIterator[Any]:
            n = 0
            async for out in inner:
                entries = []
                for token_id in out.delta_token_ids:
                    value = _ODD[n % len(_ODD)]
                    top = [(token_id, value), (ord("z"), value)][: max(1, params.logprobs or 0)]
                    entries.append(TokenLogprob(token_id, value, top, n))
                    n += 1
                out.logprobs = entries
                yield out

        return outputs()


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    engine = _OddLogprobs(step_s=0.0)
    with TestClient(create_app(lambda: engine)) as http:
        deadline = time.monotonic() + 10
        while http.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "the fake engine did not start"
            time.sleep(0.01)
        yield http


def _strict(text: str) -> Any:
    """JSON as a strict parser reads it (a browser's JSON.parse): no NaN, no Infinity."""

    def refuse(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "logprobs": True, "top_logprobs": 2}
LEGACY = {"model": "fake-model", "prompt": "hi", "max_tokens": 4, "logprobs": 2}


def test_a_nan_logprob_keeps_a_chat_answer(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200, r.text
    body = _strict(r.text)
    choice = body["choices"][0]
    assert choice["message"]["content"] == "Hell"
    content = choice["logprobs"]["content"]
    assert [e["logprob"] for e in content] == [None, None, -9999.0, -0.5]
    assert [[t["logprob"] for t in e["top_logprobs"]] for e in content] == [
        [None, None], [None, None], [-9999.0, -9999.0], [-0.5, -0.5]]


def test_a_nan_logprob_keeps_a_legacy_answer(client: TestClient) -> None:
    r = client.post("/v1/completions", json=LEGACY)
    assert r.status_code == 200, r.text
    choice = _strict(r.text)["choices"][0]
    assert choice["text"] == "Hell"
    assert choice["logprobs"]["token_logprobs"] == [None, None, -9999.0, -0.5]
    assert choice["logprobs"]["top_logprobs"][0] == {"H": None, "z": None}


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", CHAT), ("/v1/completions", LEGACY)])
def test_a_nan_logprob_in_a_stream_is_json(client: TestClient, path: str, body: dict) -> None:
    r = client.post(path, json={**body, "stream": True})
    assert r.status_code == 200, r.text
    events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [_strict(e) for e in events[:-1]]  # every chunk strict JSON: no bare NaN
    assert not any("error" in c for c in chunks), chunks
    text = "".join((c["choices"][0].get("delta", {}).get("content") or c["choices"][0].get("text") or "")
                   for c in chunks if c.get("choices"))
    assert text == "Hell"
