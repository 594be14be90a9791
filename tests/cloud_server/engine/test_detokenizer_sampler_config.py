"""Plain pieces: incremental detokenization with stop strings, sampling, settings validation."""

from __future__ import annotations

import pytest

from cloud_server.config import EngineConfig
from cloud_server.engine.detokenizer import IncrementalDetokenizer
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.exceptions import ConfigError, InvalidRequestError

PIECES = {1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "\ufffd", 6: "!"}


def decode(ids: list[int]) -> str:
    return "".join(PIECES[i] for i in ids)


def test_detokenizer_streams_deltas_and_waits_for_whole_characters():
    d = IncrementalDetokenizer(decode, [])
    deltas = [d.update([1, 2, 3][: i + 1]) for i in range(3)]
    assert deltas == ["Hel", "lo", " wor"]
    assert d.update([1, 2, 3, 5]) == ""  # incomplete UTF-8: hold
    assert d.update([1, 2, 3, 4], final=True) == "ld"


def test_detokenizer_stop_string_is_cut_and_never_sent():
    d = IncrementalDetokenizer(decode, ["world"])
    sent = d.update([1]) + d.update([1, 2]) + d.update([1, 2, 3])
    assert "wor" not in sent  # held back: may start the stop string
    sent += d.update([1, 2, 3, 4])
    assert d.stopped and sent == "Hello " and d.text == "Hello "


def test_sampling_params_validation():
    with pytest.raises(InvalidRequestError):
        SamplingParams(temperature=-1)
    with pytest.raises(InvalidRequestError):
        SamplingParams(top_p=0)
    with pytest.raises(InvalidRequestError):
        SamplingParams(max_tokens=0)
    assert SamplingParams(stop="x").stop == ["x"]
    assert SamplingParams(temperature=0).is_greedy


@pytest.mark.parametrize(
    "kwargs",
    [dict(max_num_seqs=0), dict(block_size=12), dict(device="tpu"), dict(dtype="int8"),
     dict(kv_cache_memory_bytes=10), dict(model="")],
)
def test_engine_config_validation(kwargs):
    with pytest.raises(ConfigError):
        EngineConfig(**{"model": "m", **kwargs})


def test_sampler_greedy_topk_and_seed():
    import torch

    from cloud_server.layers.sampler import Sampler

    logits = torch.tensor([[0.0, 5.0, 1.0, 4.9], [3.0, 0.0, 0.0, 0.0]])
    s = Sampler(seed=0)
    assert s(logits, [1, 2], [SamplingParams(temperature=0)] * 2) == [1, 0]
    top1 = SamplingParams(temperature=1.0, top_k=1)
    assert all(s(logits[:1], [3], [top1]) == [1] for _ in range(20))
    nucleus = SamplingParams(temperature=1.0, top_p=0.5)  # only token 1 is inside 50% mass
    assert all(s(logits[:1], [4], [nucleus]) == [1] for _ in range(20))
    seeded = SamplingParams(temperature=2.0, seed=123)
    a = [s(logits, [10, 11], [seeded, SamplingParams(temperature=2.0)])[0] for _ in range(10)]
    s.release(10)
    b = [s(logits[:1], [10], [seeded])[0] for _ in range(10)]
    assert a == b  # same seed, same tokens, whatever the batch
