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


def test_detokenizer_drops_a_character_cut_at_the_end():
    """max_tokens (or a stop token) can end the output inside a UTF-8 character: its bytes decode
    to U+FFFD, which is dropped, never sent (vLLM does the same); the deltas join to the text."""
    d = IncrementalDetokenizer(decode, [])
    sent = d.update([1, 2]) + d.update([1, 2, 5])
    assert sent == "Hello"  # the text before an incomplete character still goes out
    sent += d.update([1, 2, 5, 3, 5], final=True)
    assert sent == d.text == "Hello\ufffd wor"  # a U+FFFD mid-text is the model's own
    with_stop = IncrementalDetokenizer(decode, ["xyz"])
    assert with_stop.update([1, 2, 5], final=True) == with_stop.text == "Hello"


def test_detokenizer_finds_a_stop_string_before_an_incomplete_character():
    d = IncrementalDetokenizer(decode, ["lo"])
    assert d.update([1]) == "He"  # "l" held back: it may begin the stop string
    assert d.update([1, 2, 5]) == "l" and d.stopped and d.text == "Hel"


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
    assert s(logits, [1, 2], [SamplingParams(temperature=0)] * 2).tokens == [1, 0]
    top1 = SamplingParams(temperature=1.0, top_k=1)
    assert all(s(logits[:1], [3], [top1]).tokens == [1] for _ in range(20))
    nucleus = SamplingParams(temperature=1.0, top_p=0.5)  # only token 1 is inside 50% mass
    assert all(s(logits[:1], [4], [nucleus]).tokens == [1] for _ in range(20))
    seeded = SamplingParams(temperature=2.0, seed=123)
    a = [s(logits, [10, 11], [seeded, SamplingParams(temperature=2.0)]).tokens[0] for _ in range(10)]
    s.release(10)
    b = [s(logits[:1], [10], [seeded]).tokens[0] for _ in range(10)]
    assert a == b  # same seed, same tokens, whatever the batch
    assert len(set(a)) > 1  # and it does sample (T = 2 over two close logits)


def test_sampler_draws_in_proportion_and_returns_probs():
    import torch

    from cloud_server.layers.sampler import Sampler

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 1e-9]]))
    s = Sampler(seed=1)
    params = [SamplingParams(temperature=1.0)] * 4000
    out = s(logits.expand(4000, 4), list(range(4000)), params, return_probs=True)
    counts = torch.bincount(torch.tensor(out.tokens), minlength=4).float() / 4000
    assert torch.allclose(counts, torch.tensor([0.5, 0.3, 0.2, 0.0]), atol=0.03)
    assert out.probs is not None and torch.allclose(out.probs[0], torch.tensor([0.5, 0.3, 0.2, 0.0]),
                                                     atol=1e-6)


def test_sampler_tiny_top_p_keeps_the_top_token():
    import torch

    from cloud_server.layers.sampler import Sampler

    logits = torch.tensor([[0.0, 5.0, 1.0, 4.9]])
    out = Sampler()(logits, [1], [SamplingParams(temperature=1.0, top_p=1e-300)])
    assert out.tokens == [1]


def test_sampler_failure_of_one_row_spares_the_others():
    import torch

    from cloud_server.layers.sampler import Sampler

    logits = torch.tensor([[0.0, 5.0, 1.0], [2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    bad = SamplingParams(temperature=1.0)
    bad.temperature = float("nan")  # slipped past validation: this row alone must fail
    params = [SamplingParams(temperature=0), bad, SamplingParams(temperature=1.0, top_k=1)]
    out = Sampler()(logits, [1, 2, 3], params)
    assert out.tokens[0] == 1 and out.tokens[2] == 2
    assert isinstance(out.tokens[1], ValueError)


@pytest.mark.parametrize(
    "kwargs", [{"seed": 2**70}, {"seed": -(2**64)}, {"temperature": float("nan")},
               {"temperature": float("inf")}, {"top_p": float("nan")}, {"top_p": 0.0}],
)
def test_sampling_params_reject_what_the_engine_cannot_honour(kwargs):
    from cloud_server.exceptions import InvalidRequestError

    with pytest.raises(InvalidRequestError):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [({"stop_token_ids": [-1]}, "stop_token_ids"), ({"stop": [""]}, "stop"), ({"top_k": -2}, "top_k")],
)
def test_sampling_params_errors_name_the_field(kwargs, param):
    from cloud_server.exceptions import InvalidRequestError

    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**kwargs)
    assert info.value.param == param  # the HTTP error's "param"
