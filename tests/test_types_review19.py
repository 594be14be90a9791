"""GenerationParams takes numbers of any type and keeps them as Python's own (fast, fakes)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hybridllm import GenerationParams, HybridLLM, InvalidRequestError
from hybridllm.backends.fake import FakeBackend
from hybridllm.cache._keys import bucket_key


class _Recording(FakeBackend):
    def __init__(self) -> None:
        super().__init__(reply=lambda m: "one two three four five")
        self.seen: list[GenerationParams] = []

    def stream(self, messages, params):
        self.seen.append(params)
        return super().stream(messages, params)


def test_numpy_numbers_are_taken_as_python_numbers():
    """Before: np.float32(0.5) for temperature (and np.int64 for max_tokens, top_k, seed) was
    refused ("temperature must be between 0 and 2, got np.float32(0.5)"), though the config's
    arguments take numpy numbers."""
    p = GenerationParams(max_tokens=np.int64(7), temperature=np.float32(0.5), top_p=np.float32(0.5),
                         top_k=np.int32(5), min_p=np.float64(0.25), repeat_penalty=np.float32(1.5),
                         seed=np.uint64(2**63))
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p, p.repeat_penalty, p.seed) == (
        7, 0.5, 0.5, 5, 0.25, 1.5, 2**63)
    for name in ("max_tokens", "top_k", "seed"):
        assert type(getattr(p, name)) is int, name
    for name in ("temperature", "top_p", "min_p", "repeat_penalty"):
        assert type(getattr(p, name)) is float, name
    json.dumps(p.cache_key())  # what a cloud's JSON body or a cache key holds: no numpy scalar
    assert "np." not in repr(p)


def test_numpy_numbers_reach_the_backend_as_python_numbers():
    edge = _Recording()
    with HybridLLM(edge=edge, cache=False) as llm:
        c = llm.chat("hi", temperature=np.float32(0.0), max_tokens=np.int64(3), seed=np.int64(1))
    assert c.text == "one two three"
    seen = edge.seen[-1]
    assert type(seen.temperature) is float and type(seen.max_tokens) is int and type(seen.seed) is int


def test_numpy_default_sampling_settings_are_taken():
    """Before: HybridLLM(temperature=np.float32(0.5)) raised ConfigError."""
    edge = _Recording()
    with HybridLLM(edge=edge, cache=False, temperature=np.float32(0.5), max_tokens=np.int64(2)) as llm:
        assert llm.chat("hi").text == "one two"
    assert edge.seen[-1].temperature == 0.5 and type(edge.seen[-1].temperature) is float


@pytest.mark.parametrize("ints, floats", [
    (dict(temperature=0), dict(temperature=0.0)),
    (dict(temperature=1, top_p=1, repeat_penalty=1, min_p=0), dict(temperature=1.0, top_p=1.0)),
])
def test_int_and_float_settings_key_one_cache_bucket(ints, floats):
    """Before: temperature=0 (an app, a TOML file, an OpenAI client's JSON) and temperature=0.0 (the
    CLI's --temperature 0) keyed two cache buckets (the key is JSON: "0" and "0.0"), so one's answers
    were never served to the other."""
    a, b = GenerationParams(**ints), GenerationParams(**floats)
    assert bucket_key("default", "m", a.cache_key(), []) == bucket_key("default", "m", b.cache_key(), [])


@pytest.mark.parametrize("name", ["temperature", "top_p", "min_p", "repeat_penalty"])
def test_an_int_past_floats_range_is_refused_clearly(name):
    """Before: temperature=10**400 raised a bare OverflowError from math.isfinite."""
    with pytest.raises(InvalidRequestError, match=name):
        GenerationParams(**{name: 10**400})


@pytest.mark.parametrize("kw", [dict(temperature=True), dict(max_tokens=np.bool_(True)),
                                dict(max_tokens=7.0), dict(top_k=np.float32(3)), dict(seed="1"),
                                dict(temperature=np.float32("nan"))])
def test_bools_strings_and_floats_for_integers_are_still_refused(kw):
    with pytest.raises(InvalidRequestError):
        GenerationParams(**kw)
