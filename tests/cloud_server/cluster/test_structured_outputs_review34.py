"""vLLM's regex and choice reach a Ray replica as the same grammar: the front end sends a Grammar's
own dict (``{"type": "regex", ...}``), which the replica's ``SamplingParams`` reads back with
``parse_grammar``. Before, the replica parsed it as a response_format and refused the type."""

from __future__ import annotations

import pytest

from cloud_server.engine.sampling_params import SamplingParams
from hybridllm._structured import parse_structured_outputs

from .test_structured_output_review32 import _sent


@pytest.mark.parametrize("spec", [{"regex": r"\d{3}-\d{4}"}, {"choice": ["yes", "no"]}])
def test_a_plain_text_grammar_reaches_the_replica_as_the_same_grammar(spec) -> None:
    grammar = parse_structured_outputs(spec)
    fields = _sent(SamplingParams(temperature=0, response_format=grammar))
    replica = SamplingParams(**fields)  # as cluster/app.py builds it
    assert replica.response_format is grammar  # the same kept grammar: its memoised masks too
    assert replica.response_format.validate("555-1234" if "regex" in spec else "no")
