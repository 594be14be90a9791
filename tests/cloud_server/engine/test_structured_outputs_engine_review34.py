"""vLLM's plain-text grammars (a regex, a choice) in the real engine on a tiny random model whose
vocabulary is JSON pieces: greedy and sampled outputs fit, a seed repeats itself batched or not,
speculation (prompt lookup, a draft model) gives the greedy text of no speculation, and an
output ends with "stop" where the pattern can end and nothing more fits."""

from __future__ import annotations

import re

import pytest

from cloud_server.engine.sampling_params import SamplingParams
from hybridllm._structured import parse_structured_outputs

from .test_structured_output_review32 import PROMPTS, json_engine, run

REGEX = r"[a-f]{2,6}-\d{1,3}( [a-z]{2,5}){0,2}"
CHOICES = ["red", "green", "blue", "é", "true"]


def _params(spec: dict, **kw) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.0, "max_tokens": 60,
                             "response_format": parse_structured_outputs(spec), **kw})


def _fits(text: str, spec: dict) -> bool:
    return bool(re.fullmatch(REGEX, text)) if "regex" in spec else text in CHOICES


@pytest.mark.parametrize("spec", [{"regex": REGEX}, {"choice": CHOICES}])
def test_greedy_and_sampled_outputs_fit(spec: dict) -> None:
    reqs = [(f"g{i}", p, _params(spec)) for i, p in enumerate(PROMPTS)]
    reqs += [(f"s{i}", p, _params(spec, temperature=1.0, seed=i)) for i, p in enumerate(PROMPTS)]
    got = run(json_engine(1.0), reqs)
    for rid, (text, _ids, finish, _lp) in got.items():
        assert finish == "stop" and _fits(text, spec), (rid, text, finish)
    # a seed repeats its output batched with others or alone
    alone = run(json_engine(1.0), [("s1", PROMPTS[1], _params(spec, temperature=1.0, seed=1))])
    assert alone["s1"][:3] == got["s1"][:3]


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculation_gives_the_greedy_text_of_no_speculation(method: str) -> None:
    def reqs(spec_method: str | None):
        return [(f"r{i}", p, _params({"regex": REGEX} if i % 2 else {"choice": CHOICES},
                                     speculative_method=spec_method, num_speculative_tokens=3))
                for i, p in enumerate(PROMPTS)]

    off = run(json_engine(1.0), reqs("none"))
    eng = json_engine(1.0, draft=method == "draft", method=method)
    assert run(eng, reqs(None)) == off
    stats = eng.spec.stats.snapshot()
    assert stats["spec_decode_num_draft_tokens"] > 0, stats  # the grammars' requests did draft


def test_ignore_eos_still_ends_where_nothing_more_fits() -> None:
    # "\d{3}" is whole after three digits: no token may follow, so the request ends there
    got = run(json_engine(1.0), [("d", PROMPTS[0], _params({"regex": r"\d{3}"}, ignore_eos=True))])
    text, _ids, finish, _lp = got["d"]
    assert re.fullmatch(r"\d{3}", text) and finish == "stop", got
