"""``pattern`` and ``format`` through the engine (review 33): on the tiny random model of a JSON
vocabulary every output, greedy and sampled, with and without speculative decoding, is an object
whose date parses, whose code fits its pattern and whose tag has its length bounds. Before, such a
schema was refused (InvalidRequestError naming the pattern / format field)."""

from __future__ import annotations

import datetime
import json
import re

import pytest

from cloud_server.engine.sampling_params import SamplingParams

from .test_structured_output_review32 import PROMPTS, json_engine, run

EVENT = {"type": "json_schema", "json_schema": {"name": "event", "schema": {
    "type": "object",
    "properties": {
        "day": {"type": "string", "format": "date"},
        "code": {"type": "string", "pattern": "^[a-c]{2}-\\d{1,3}$"},
        "tag": {"type": "string", "pattern": "^(red|green|blue)[0-9]*$", "maxLength": 6},
        "n": {"type": "integer", "minimum": -5, "maximum": 300},
    },
    "required": ["day", "code", "tag", "n"], "additionalProperties": False}}}


def _check(text: str) -> None:
    value = json.loads(text)
    assert list(value) == ["day", "code", "tag", "n"], text
    assert isinstance(value["n"], int) and -5 <= value["n"] <= 300, text
    assert len(value["day"]) == 10 and datetime.date.fromisoformat(value["day"]), text
    assert re.fullmatch(r"[a-c]{2}-\d{1,3}", value["code"]), text
    assert re.fullmatch(r"(red|green|blue)[0-9]*", value["tag"]) and len(value["tag"]) <= 6, text


@pytest.mark.parametrize("method", [None, "ngram"])
def test_pattern_and_format_outputs_fit_greedy_and_sampled(method: str | None) -> None:
    eng = json_engine(1.0, method=method)
    reqs = [(f"g{i}", p, SamplingParams(temperature=0.0, max_tokens=280, response_format=EVENT))
            for i, p in enumerate(PROMPTS)]
    reqs += [(f"s{seed}", PROMPTS[seed % len(PROMPTS)],
              SamplingParams(temperature=1.0, seed=seed, max_tokens=280, response_format=EVENT))
             for seed in range(6)]
    got = run(eng, reqs)
    for rid, (text, _ids, reason, _lp) in got.items():
        assert reason == "stop", (rid, text)
        _check(text)
