"""The Ray front end passes ``response_format`` on to its replicas: a request's Grammar travels as
its normalized OpenAI dict, which the replica's ``SamplingParams(**fields)`` parses back to the same
grammar (the replica's own, one per format, whose memoised masks its earlier requests warmed).
Before, ``dataclasses.asdict`` sent a deep copy of the front end's Grammar object: nodes compared
by identity, so no state of it ever met a memoised mask on the replica."""

from __future__ import annotations

from typing import Any

from cloud_server.cluster.remote_engine import RemoteEngine
from cloud_server.engine.sampling_params import SamplingParams

SCHEMA = {"type": "json_schema", "json_schema": {"name": "p", "schema": {
    "type": "object", "properties": {"b": {"type": "integer"}, "a": {"enum": ["x", "y"]}},
    "required": ["b"]}}}


def _sent(params: SamplingParams) -> dict[str, Any]:
    engine = RemoteEngine(None, "m")
    engine._ready = True
    sent: list[dict[str, Any]] = []
    engine._stream = lambda rid, ids, fields, on=None: sent.append(fields)  # type: ignore[method-assign]
    engine.generate("r", [1, 2, 3], params)
    return sent[0]


def test_a_grammar_reaches_the_replica_as_the_same_grammar() -> None:
    params = SamplingParams(temperature=0.5, seed=3, response_format=SCHEMA)
    fields = _sent(params)
    assert fields["response_format"] == params.response_format.response_format  # a plain dict
    replica = SamplingParams(**fields)  # as cluster/app.py builds it
    assert replica.response_format.key == params.response_format.key
    assert (replica.temperature, replica.seed) == (0.5, 3)
    # the property order is the grammar's: kept through the trip
    assert list(fields["response_format"]["json_schema"]["schema"]["properties"]) == ["b", "a"]


def test_no_format_is_none() -> None:
    fields = _sent(SamplingParams(max_tokens=4))
    assert fields["response_format"] is None and SamplingParams(**fields).response_format is None
