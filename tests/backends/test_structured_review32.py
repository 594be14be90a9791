"""Structured output on the device backends (review 32): with a ``response_format`` every sampled
token is held to the format's grammar (hybridllm._structured's matcher and token index): the ONNX
sampler masks the row before its penalties and its draw, llama.cpp gets the mask as a logits
processor, the answer ends once the value is complete, a continuation goes on from its prefix, and
a request without a format builds nothing. Before: the format was ignored (any text came out).
Fast: a toy vocabulary and a fake model; the real models are in test_structured_real_review32.py."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("hybridllm._structured")

from hybridllm import EdgeError, GenerationParams, InvalidRequestError  # noqa: E402
from hybridllm.backends.onnx_sampling import _sample  # noqa: E402

OBJECT = {"type": "json_object"}
INTEGER = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}
# a toy vocabulary: the bytes each id adds, None for the end-of-text id
VOCAB: list[bytes | None] = [b"hello", b"{", b"}", b'"a"', b":", b" ", b"1", b"12", b"\n", None]
EOS = 9
# the fake model's logits, every step: "hello" (never JSON) first, then '"a"', ':', '1', ...
ROW = np.array([5.0, 1.0, 0.5, 2.0, 1.5, -1.0, 1.2, 1.1, -2.0, 0.0], dtype=np.float32)
MSGS = [{"role": "user", "content": "hi"}]


def _formats(vocabulary: Any = None) -> Any:
    from hybridllm.backends.structured import DeviceFormats

    return DeviceFormats(vocabulary or (lambda: (VOCAB, {EOS})))


class _Detok:
    def decode(self, token: int) -> str:
        piece = VOCAB[token]
        return piece.decode() if piece else ""


def _fake_onnx(row: np.ndarray = ROW) -> Any:
    """An OnnxBackend with its model replaced by a fixed row of logits (counting the steps)."""
    from hybridllm.backends.onnx import OnnxBackend
    from hybridllm.prompts import PromptFormat

    backend = OnnxBackend.__new__(OnnxBackend)
    backend._model = object()
    backend._tok = SimpleNamespace(create_stream=_Detok)
    backend._lock = threading.Lock()
    backend._n_ctx = 512
    backend._eos_ids = {EOS}
    backend._formats = _formats()
    backend.prompt_format = PromptFormat(chat_template=None, bos_token="", eos_token="")
    backend.tokenize = lambda messages, prefix="": [0, 1]  # type: ignore[method-assign]
    backend.steps = 0

    def logits(seq: list[int], closed_message: str = "") -> np.ndarray:
        backend.steps += 1
        return row.copy()

    backend._logits = logits  # type: ignore[method-assign]
    return backend


# ---- the ONNX sampler: the mask comes first ---------------------------------------------------


def test_greedy_takes_the_best_allowed_token() -> None:
    row = np.array([9.0, 1.0, 3.0, 2.0], dtype=np.float32)
    allowed = np.array([False, True, False, True])
    assert _sample(row, GenerationParams(temperature=0.0), 1, 0, []) == 0
    assert _sample(row, GenerationParams(temperature=0.0), 1, 0, [], allowed=allowed) == 3


def test_sampled_draws_only_allowed_tokens_by_the_masked_softmax() -> None:
    # masked first, then top-k 2 of what is left: {1: log 0.3, 3: log 0.2} -> 0.6 / 0.4
    row = np.log(np.array([0.4, 0.3, 0.1, 0.2])).astype(np.float32)
    allowed = np.array([False, True, True, True])
    params = GenerationParams(temperature=1.0, top_k=2, top_p=1.0)
    picks = np.array([_sample(row, params, seed, 0, [], allowed=allowed) for seed in range(4000)])
    assert set(picks.tolist()) == {1, 3}  # the masked best (0) never; the third allowed cut by top-k
    assert abs((picks == 1).mean() - 0.6) < 0.03


@pytest.mark.parametrize("penalty", [1e-30, 1.3, 10.0])
def test_a_repeat_penalty_never_brings_a_refused_token_back(penalty: float) -> None:
    # a seen refused token stays -inf (the penalties' +-1e30 cap made it -1e30 before): with every
    # other allowed logit far below it, only an allowed token may come
    row = np.array([3.0, -1e31, -5e30], dtype=np.float32)
    allowed = np.array([False, True, True])
    params = GenerationParams(temperature=0.0, repeat_penalty=penalty)
    assert _sample(row, params, 1, 2, [0, 0], allowed=allowed) in (1, 2)


def test_no_allowed_token_with_a_finite_logit_is_an_error() -> None:
    row = np.array([1.0, -np.inf, -np.inf], dtype=np.float32)
    with pytest.raises(EdgeError, match="response_format allows"):
        _sample(row, GenerationParams(temperature=0.7), 1, 0, [], allowed=np.array([False, True, True]))


# ---- the ONNX token loop ----------------------------------------------------------------------


def test_onnx_answer_is_the_format_and_ends_when_the_value_is_complete() -> None:
    backend = _fake_onnx()
    plain = backend.generate(MSGS, GenerationParams(temperature=0.0, max_tokens=4))
    assert plain.text == "hello" * 4 and plain.finish_reason == "length"  # unconstrained: as before
    backend.steps = 0
    out = backend.generate(MSGS, GenerationParams(temperature=0.0, max_tokens=50, response_format=OBJECT))
    assert out.text == '{"a":"a"}' and json.loads(out.text) == {"a": "a"}
    assert out.finish_reason == "stop" and out.usage.completion_tokens == 5
    assert backend.steps == 5  # complete: no step for the end-of-text token


def test_onnx_sampled_answers_are_the_format() -> None:
    backend = _fake_onnx()
    for seed in range(20):
        out = backend.generate(MSGS, GenerationParams(temperature=1.0, top_k=0, seed=seed, max_tokens=200,
                                                      response_format=OBJECT))
        assert out.finish_reason == "stop", out.text
        assert isinstance(json.loads(out.text), dict)


def test_onnx_end_of_text_only_once_a_value_is_done() -> None:
    # the row puts the end-of-text id first: refused before a digit, taken right after it
    row = np.array([5.0, 1.0, 0.5, 2.0, 1.5, -1.0, 1.2, 1.1, -2.0, 9.0], dtype=np.float32)
    backend = _fake_onnx(row)
    assert backend.generate(MSGS, GenerationParams(temperature=0.0, max_tokens=8)).text == ""
    out = backend.generate(MSGS, GenerationParams(temperature=0.0, max_tokens=8, response_format=INTEGER))
    assert (out.text, out.finish_reason, out.usage.completion_tokens) == ("1", "stop", 1)


def test_onnx_streamed_pieces_join_to_the_answer() -> None:
    backend = _fake_onnx()
    params = GenerationParams(temperature=0.0, max_tokens=50, response_format=OBJECT)
    deltas = list(backend.stream(MSGS, params))
    assert "".join(d.text for d in deltas) == backend.generate(MSGS, params).text
    assert deltas[-1].finish_reason == "stop"


def test_onnx_continuation_goes_on_from_the_prefix() -> None:
    backend = _fake_onnx()
    params = GenerationParams(temperature=0.0, max_tokens=50, response_format=OBJECT)
    # the prefix ends a number: digits may follow (and this model likes them) up to the grammar's
    # 32 bytes; after the space only the object's end (or more space) may
    rest = "".join(d.text for d in backend.stream_continuation(MSGS, '{"a": 12', params))
    assert json.loads('{"a": 12' + rest)["a"] == int("12" + rest.rstrip("}")) and rest.endswith("}")
    rest = "".join(d.text for d in backend.stream_continuation(MSGS, '{"a": 12 ', params))
    assert rest == "}"
    # a prefix that completed the value: nothing follows, no model step
    backend.steps = 0
    deltas = list(backend.stream_continuation(MSGS, '{"a": 1}', params))
    assert "".join(d.text for d in deltas) == "" and deltas[-1].finish_reason == "stop"
    assert backend.steps == 0
    with pytest.raises(EdgeError, match="does not fit the request's response_format"):
        list(backend.stream_continuation(MSGS, "hello", params))
    # and the prefix is this request's only: the next plain structured answer starts afresh
    assert backend.generate(MSGS, params).text == '{"a":"a"}'


# ---- what the two backends share (hybridllm/backends/structured.py) ---------------------------


def test_a_request_without_a_format_builds_nothing() -> None:
    def vocabulary() -> Any:
        raise AssertionError("the token index was built for an unstructured request")

    formats = _formats(vocabulary)
    assert formats.start(GenerationParams()) is None
    assert formats.start(GenerationParams(response_format={"type": "text"})) is None


def test_a_bad_format_is_a_request_error_before_any_step() -> None:
    bad = {"type": "json_schema",
           "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(a)\\1"}}}
    with pytest.raises(InvalidRequestError, match="response_format.json_schema.schema"):
        _formats().start(SimpleNamespace(response_format=bad))


def test_the_token_index_is_built_once_per_model() -> None:
    calls = []

    def vocabulary() -> Any:
        calls.append(1)
        return VOCAB, {EOS}

    formats = _formats(vocabulary)
    for _ in range(3):
        constraint = formats.start(GenerationParams(response_format=OBJECT))
        constraint.bind()
    assert len(calls) == 1
    formats.forget()  # the model closed: its index goes with it
    assert formats._index is None


def test_closing_the_onnx_backend_drops_its_token_index() -> None:
    backend = _fake_onnx()
    backend.generate(MSGS, GenerationParams(temperature=0.0, max_tokens=50, response_format=OBJECT))
    assert backend._formats._index is not None
    backend.close()
    assert backend._formats._index is None
    with pytest.raises(EdgeError, match="closed"):
        backend.generate(MSGS, GenerationParams(temperature=0.0, max_tokens=5, response_format=OBJECT))
    assert backend._formats._index is None  # not built again for a closed model


def test_the_llama_logits_processor_masks_in_place() -> None:
    constraint = _formats().start(GenerationParams(response_format=OBJECT))
    constraint.bind()
    # llama-cpp-python hands the processor the logit column of its token data records (strided)
    records = np.zeros(len(VOCAB), dtype=np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)],
                                                  align=True))
    records["logit"] = ROW
    out = constraint.logits_processor()(np.zeros(3, dtype=np.intc), records["logit"])
    finite = np.flatnonzero(np.isfinite(records["logit"])).tolist()
    assert finite == [1]  # '{': the answer starts with its object
    assert out is not None and np.array_equal(np.isfinite(out), np.isfinite(records["logit"]))
    constraint.check()  # nothing went wrong


def test_an_error_inside_the_native_callback_is_raised_after_the_step() -> None:
    constraint = _formats().start(GenerationParams(response_format=OBJECT))
    constraint.bind()
    scores = ROW[:5].copy()  # a row narrower than the vocabulary
    constraint.logits_processor()(None, scores)
    assert np.array_equal(scores, ROW[:5])  # left as it was, not half masked
    with pytest.raises(EdgeError, match="logits cover 5 tokens"):
        constraint.check()


def test_a_token_the_grammar_refuses_is_an_error_not_a_broken_answer() -> None:
    constraint = _formats().start(GenerationParams(response_format=OBJECT))
    constraint.bind()
    with pytest.raises(EdgeError, match="refuses"):
        constraint.feed(0)  # "hello"
