"""`hybridllm ask --json` prints valid JSON when a number of the Completion is not finite (a custom
router's NaN score, a custom backend's NaN log-probability): null, as the proxy answers. Before, it
printed a bare ``NaN`` (``Infinity``) that no JSON parser but Python's reads. Fakes only: fast."""

from __future__ import annotations

import json
import math

import pytest

from hybridllm import Decision, HybridLLM, cli
from hybridllm.backends.base import Delta
from hybridllm.backends.fake import FakeBackend


class Router:  # a custom routing policy whose score is not a number
    def __init__(self, score: float) -> None:
        self.score = score

    def decide(self, messages, *, force=None, prompt_tokens=None, embedding=None):
        return Decision("edge", "custom score", self.score, messages)


class NaNLogprobs(FakeBackend):  # a custom edge whose log-probabilities are NaN
    def stream(self, messages, params):
        for delta in super().stream(messages, params):
            yield Delta(delta.text, delta.finish_reason, delta.usage, math.nan, delta.model)


def strict(text: str) -> dict:
    def refuse(token: str) -> object:
        raise ValueError(f"not JSON: {token}")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("score", [math.nan, math.inf])
def test_ask_json_writes_a_non_finite_number_as_null(score, monkeypatch, capsys):
    def client(**_settings):  # what the CLI builds, with the custom router and edge
        return HybridLLM(edge=NaNLogprobs(reply=lambda m: "one two"), policy=Router(score), cache=False)

    monkeypatch.setattr("hybridllm._client.HybridLLM", client)
    assert cli.main(["ask", "hi", "--json"]) == 0
    body = strict(capsys.readouterr().out)  # before: "score": NaN, not JSON
    assert body["text"] == "one two" and body["route"] == "edge"
    assert body["score"] is None and body["mean_logprob"] is None
    assert body["latency_ms"] >= 0  # the finite numbers are kept
