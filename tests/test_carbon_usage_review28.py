"""Energy and carbon of a cloud answer whose server sends no token count (review 28).

Before: the placer estimated the energy from the stream's empty count, 0 tokens, so a whole answer
was reported as 0.0 J (``energy_source="estimate"``), 0.0 g of CO2, 0.0 J per token, while its
usage and cost were estimated from the text. Now its energy and CO2 are unknown (None), as for an
unknown grid intensity; an answer with a count is still estimated from it."""

from __future__ import annotations

import httpx
import pytest

from hybridllm import HybridLLM
from hybridllm.backends.cloud import CloudBackend
from hybridllm.backends.fake import FakeBackend
from hybridllm.carbon import J_PER_KWH

NO_USAGE = 'data: {"choices":[{"delta":{"content":"a whole answer of words"},"finish_reason":"stop"}]}\n\n'
COUNTED = ('data: {"choices":[{"delta":{"content":"a whole answer of words"},"finish_reason":"stop"}],'
           '"usage":{"prompt_tokens":6,"completion_tokens":5}}\n\n')


def _llm(sse: str) -> HybridLLM:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        return httpx.Response(200, text=sse + "data: [DONE]\n\n",
                              headers={"content-type": "text/event-stream"})

    cloud = CloudBackend(base_url=[], transport=httpx.MockTransport(handler), model="m",
                         max_retries=0, remember_refusals=False, joules_per_token=2.0,
                         carbon=[{"url": "http://a.test/v1", "region": "eu", "carbon_intensity": 100}])
    return HybridLLM(edge=FakeBackend(), cloud=cloud, cache=False)


def test_an_answer_without_a_count_has_no_energy_figure_not_zero_joules():
    with _llm(NO_USAGE) as llm:
        c = llm.chat("say something", route="cloud")
        assert c.route == "cloud" and c.usage.completion_tokens > 0  # the pipeline's estimate
        assert c.region == "eu"
        assert (c.energy_j, c.energy_source, c.co2_g, c.co2_saved_g) == (None, None, None, None)
        assert c.energy_j_per_token is None
        stats = llm.stats()
        assert stats["cloud_energy_j"] == 0 and stats["co2_g"] == 0


def test_an_answer_with_a_count_is_still_estimated_from_it():
    with _llm(COUNTED) as llm:
        c = llm.chat("say something", route="cloud")
        assert (c.energy_j, c.energy_source) == (22.0, "estimate")  # 11 tokens at 2 J
        assert c.co2_g == pytest.approx(22.0 / J_PER_KWH * 100)
        assert llm.stats()["cloud_energy_j"] == 22.0
