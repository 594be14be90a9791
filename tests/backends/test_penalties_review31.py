"""presence_penalty and frequency_penalty on the backends (review 31): the ONNX sampler applies
OpenAI's rule over the answer's tokens so far, the cloud route sends them under OpenAI's names when
not 0 (and a refusal stays an error, never a silent drop), llama.cpp gets them. Fast: plain arrays
and a mock transport; the llama.cpp test on SmolLM2 is marked real."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from hybridllm import GenerationParams, InvalidRequestError
from hybridllm.backends.cloud import CloudBackend
from hybridllm.backends.onnx_sampling import _sample

MSGS = [{"role": "user", "content": "hi"}]
N = 8000  # seeds 0..N-1: deterministic; 0.02 is about 3.6 sigma


def _reference(row: np.ndarray, recent: list[int], presence: float, frequency: float) -> np.ndarray:
    """OpenAI's rule written out token by token: logit[t] -= p * [count > 0] + f * count."""
    out = row.astype(np.float64).copy()
    for t in range(row.shape[0]):
        count = recent.count(t)
        out[t] -= presence * (count > 0) + frequency * count
    return out


@pytest.mark.parametrize(("presence", "frequency", "recent", "want"), [
    (0.0, 0.3, [0, 0, 0], 0),  # 3 - 0.9 = 2.1 > 2
    (0.0, 0.35, [0, 0, 0], 1),  # 3 - 1.05 < 2: each repeat counts
    (0.5, 0.1, [0, 0, 0], 0),  # 3 - 0.5 - 0.3 = 2.2
    (0.5, 0.2, [0, 0, 0], 1),  # 3 - 0.5 - 0.6 = 1.9
    (1.01, 0.0, [0, 0, 0, 0, 0, 0], 1),  # presence counts once, however many repeats
    (0.99, 0.0, [0, 0, 0, 0, 0, 0], 0),
    (2.0, 2.0, [2, 1], 0),  # other tokens seen: token 0 untouched
    (-1.5, 0.0, [], 0),  # nothing said yet: nothing penalised
])
def test_greedy_follows_the_rule(presence: float, frequency: float, recent: list[int], want: int) -> None:
    row = np.array([3.0, 2.0, 1.0, -1.0], dtype=np.float32)
    params = GenerationParams(temperature=0.0, presence_penalty=presence, frequency_penalty=frequency)
    assert _sample(row, params, 1, len(recent), recent) == want
    assert int(_reference(row, recent, presence, frequency).argmax()) == want


def test_a_negative_penalty_favours_repeats() -> None:
    row = np.array([2.0, 3.0, 0.0], dtype=np.float32)
    assert _sample(row, GenerationParams(temperature=0.0, presence_penalty=-1.5), 1, 1, [0]) == 0
    assert _sample(row, GenerationParams(temperature=0.0, frequency_penalty=-0.4), 1, 2, [0, 0]) == 1


def test_sampled_draws_follow_the_penalised_softmax() -> None:
    row = np.log(np.array([0.4, 0.3, 0.2, 0.1])).astype(np.float32)
    recent = [0, 0, 1, 3]
    params = GenerationParams(temperature=1.0, top_k=0, top_p=1.0, presence_penalty=0.3,
                              frequency_penalty=0.4)
    picks = [_sample(row, params, seed, len(recent), list(recent)) for seed in range(N)]
    freq = np.bincount(picks, minlength=4) / N
    ref = _reference(row, recent, 0.3, 0.4)
    want = np.exp(ref - ref.max()) / np.exp(ref - ref.max()).sum()
    assert freq == pytest.approx(want, abs=0.02)
    plain = GenerationParams(temperature=1.0, top_k=0, top_p=1.0)
    assert np.bincount([_sample(row, plain, s, 4, list(recent)) for s in range(N)],
                       minlength=4) / N == pytest.approx(np.exp(row) / np.exp(row).sum(), abs=0.02)


def test_the_row_given_is_not_changed() -> None:
    row = np.array([3.0, 2.0, 1.0], dtype=np.float32)
    _sample(row, GenerationParams(temperature=0.0, frequency_penalty=2.0), 1, 2, [0, 0])
    assert row.tolist() == [3.0, 2.0, 1.0]


def _cloud(handler) -> CloudBackend:  # type: ignore[no-untyped-def]
    return CloudBackend(base_url="http://cloud.test/v1", model="m", transport=httpx.MockTransport(handler),
                        remember_refusals=False, max_retries=0)


SSE = (f"data: {json.dumps({'choices': [{'delta': {'content': 'fine'}}]})}\n\n"
       f"data: {json.dumps({'choices': [{'delta': {}, 'finish_reason': 'stop'}]})}\n\n"
       "data: [DONE]\n\n").encode()


def test_the_cloud_is_sent_the_penalties_when_not_zero() -> None:
    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, content=SSE, headers={"content-type": "text/event-stream"})

    cloud = _cloud(handler)
    try:
        params = GenerationParams(presence_penalty=0.5, frequency_penalty=-1.0)
        assert cloud.generate(MSGS, params).text == "fine"
        assert (bodies[-1]["presence_penalty"], bodies[-1]["frequency_penalty"]) == (0.5, -1.0)
        cloud.generate(MSGS, GenerationParams(frequency_penalty=1.25))
        assert bodies[-1]["frequency_penalty"] == 1.25 and "presence_penalty" not in bodies[-1]
        cloud.generate(MSGS, GenerationParams())
        assert "presence_penalty" not in bodies[-1] and "frequency_penalty" not in bodies[-1]
    finally:
        cloud.close()


def test_a_cloud_that_refuses_a_penalty_is_an_error_not_a_silent_drop() -> None:
    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(400, json={"error": {
            "message": "Unsupported parameter: 'presence_penalty' is not supported with this model.",
            "type": "invalid_request_error", "param": "presence_penalty"}})

    cloud = _cloud(handler)
    try:
        with pytest.raises(InvalidRequestError, match="presence_penalty"):
            cloud.generate(MSGS, GenerationParams(presence_penalty=0.5))
        assert all(b.get("presence_penalty") == 0.5 for b in bodies), bodies  # never sent without it
    finally:
        cloud.close()


REPEAT = [{"role": "user", "content": "Repeat the word 'apple' fifty times, separated by spaces."}]


@pytest.mark.real
def test_llama_cpp_applies_a_frequency_penalty(smollm2_path) -> None:  # type: ignore[no-untyped-def]
    """A large frequency penalty breaks SmolLM2's repetition; the settings reach llama.cpp."""
    from hybridllm.backends.llama_cpp import LlamaCppBackend

    backend = LlamaCppBackend(str(smollm2_path), n_ctx=512, n_threads=2)
    try:
        seen: list[dict] = []
        generate = backend._llm.generate

        def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
            seen.append(kwargs)
            return generate(*args, **kwargs)

        backend._llm.generate = recording
        common = {"temperature": 0.0, "seed": 7, "max_tokens": 40}
        plain = backend.generate(REPEAT, GenerationParams(**common)).text
        penalised = backend.generate(REPEAT, GenerationParams(**common, frequency_penalty=2.0,
                                                              presence_penalty=0.5)).text
        assert seen[0]["frequency_penalty"] == 0.0 and seen[0]["presence_penalty"] == 0.0
        assert seen[1]["frequency_penalty"] == 2.0 and seen[1]["presence_penalty"] == 0.5
        assert plain.lower().count("apple") >= 10, plain  # the model repeats without a penalty
        assert penalised != plain
        assert penalised.lower().count("apple") < plain.lower().count("apple") / 2, (plain, penalised)
    finally:
        backend.close()


@pytest.mark.real
def test_onnx_applies_the_penalties_over_the_answer_only(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """SmolLM2 on ONNX Runtime GenAI: the sampler is given the answer's tokens (never the prompt's),
    and a large penalty breaks the repetition."""
    pytest.importorskip("onnxruntime_genai")
    from hybridllm.backends import onnx
    from hybridllm.models.onnx_prepare import prepare_onnx

    prepare_onnx("smollm2-135m-instruct")
    backend = onnx.OnnxBackend("smollm2-135m-instruct", n_ctx=1024)
    seen: list[list[int]] = []
    sample = onnx._sample

    def recording(row, params, seed, step, recent):  # type: ignore[no-untyped-def]
        seen.append(list(recent))
        return sample(row, params, seed, step, recent)

    monkeypatch.setattr(onnx, "_sample", recording)
    try:
        common = {"temperature": 0.0, "seed": 7, "max_tokens": 40}
        plain = backend.generate(REPEAT, GenerationParams(**common)).text
        penalised = backend.generate(REPEAT, GenerationParams(**common, frequency_penalty=2.0)).text
        assert plain.lower().count("apple") >= 10, plain
        assert penalised.lower().count("apple") < plain.lower().count("apple") / 2, (plain, penalised)
        # each step sees the answer so far: nothing at the first, one more token each step after
        starts = [i for i, r in enumerate(seen) if not r]
        assert starts == [0, starts[1]] and all(len(r) == i for i, r in enumerate(seen[starts[1]:]))
    finally:
        backend.close()
