"""OpenAI's presence_penalty and frequency_penalty in the library (review 31): the request's settings
check them, the CLI takes --presence-penalty / --frequency-penalty, and `hybridllm serve` accepts
them (tests/test_proxy_penalties_review31.py; before: unknown to GenerationParams). Fast: fakes,
no model."""

from __future__ import annotations

import pytest

from hybridllm import GenerationParams, HybridLLM, InvalidRequestError
from hybridllm._cli_sampling import _sampling
from hybridllm.backends.fake import FakeBackend
from hybridllm.cli import build_parser

MSGS = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("name", ["presence_penalty", "frequency_penalty"])
def test_params_take_the_penalties_in_range_and_name_a_bad_one(name: str) -> None:
    assert getattr(GenerationParams(), name) == 0.0  # off by default
    for ok in (-2, -2.0, -0.5, 0, 1.25, 2):
        value = getattr(GenerationParams(**{name: ok}), name)
        assert value == float(ok) and type(value) is float  # kept as a float: one cache bucket
    for bad in (2.01, -2.5, float("nan"), float("inf"), "1", True, [1]):
        with pytest.raises(InvalidRequestError, match=name):
            GenerationParams(**{name: bad})
    assert getattr(GenerationParams.from_kwargs(**{name: 1}), name) == 1.0


def test_the_penalties_key_the_cache_and_zero_keys_as_before() -> None:
    plain = GenerationParams(temperature=0.0).cache_key()
    # a request without penalties keys what it keyed before they existed (old cache files hit)
    assert set(plain) == {"max_tokens", "temperature", "top_p", "top_k", "min_p", "repeat_penalty",
                          "seed", "stop"}
    assert GenerationParams(temperature=0.0, presence_penalty=-0.0).cache_key() == plain
    keys = [GenerationParams(temperature=0.0, **kw).cache_key() for kw in (
        {"presence_penalty": 0.5}, {"frequency_penalty": 0.5}, {"frequency_penalty": 1.0},
        {"presence_penalty": 0.5, "frequency_penalty": 0.5})]
    assert all(k != plain for k in keys)
    assert len({str(sorted(k.items())) for k in keys}) == len(keys)  # each its own bucket
    assert GenerationParams(frequency_penalty=1).cache_key() == GenerationParams(
        frequency_penalty=1.0).cache_key()


def test_the_cli_options_parse_check_and_reach_the_request(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["ask", "--presence-penalty", "0.75", "--frequency-penalty", "-1",
                                      "hi"])
    options = _sampling(args)
    assert options["presence_penalty"] == 0.75 and options["frequency_penalty"] == -1.0
    left_out = _sampling(build_parser().parse_args(["ask", "hi"]))
    assert left_out["presence_penalty"] is None and left_out["frequency_penalty"] is None  # the default
    for option in ("--presence-penalty", "--frequency-penalty"):
        with pytest.raises(SystemExit) as info:
            build_parser().parse_args(["chat", option, "3"])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert option in err and "[-2, 2]" in err, err


class Recording(FakeBackend):
    """A fake device model that records the settings of each request."""

    def __init__(self) -> None:
        super().__init__(model="tiny-edge", reply=lambda m: "one two three")
        self.params: list[GenerationParams] = []

    def stream(self, messages, params):  # type: ignore[no-untyped-def]
        self.params.append(params)
        return super().stream(messages, params)


def test_the_library_passes_the_penalties_to_the_device() -> None:
    edge = Recording()
    with HybridLLM(edge=edge, cache=False) as llm:
        llm.chat("hi", presence_penalty=0.5, frequency_penalty=-0.25)
        assert (edge.params[-1].presence_penalty, edge.params[-1].frequency_penalty) == (0.5, -0.25)
        assert "".join(c.text for c in llm.stream("hi", frequency_penalty=2)) == "one two three"
        assert edge.params[-1].frequency_penalty == 2.0
        with pytest.raises(InvalidRequestError, match="presence_penalty"):
            llm.chat("hi", presence_penalty=3)
