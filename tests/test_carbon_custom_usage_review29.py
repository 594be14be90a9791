"""A custom cloud backend (``cloud=``) whose usage holds a NaN, infinite or negative figure (review 29).

Before: its energy (or CO2) went into ``stats()``'s totals as it came, so one NaN made
``cloud_energy_j`` (or ``co2_g``) NaN for good, every later request's figure lost in the sum; a
NaN, infinite or negative token count failed the request with the budget's ConfigError. Now such a
figure is unknown for that request (None, as from a server that reports no energy; a bad token
count is estimated, as from a server that sends none), one warning names the backend, the totals
keep the other requests' figures, and the request succeeds."""

from __future__ import annotations

import asyncio
import logging
import math

import pytest

from hybridllm import AsyncHybridLLM, HybridLLM
from hybridllm._types import Usage
from hybridllm.backends.base import Delta
from hybridllm.backends.fake import FakeBackend


class _Reporting(FakeBackend):
    """A custom cloud whose final usage carries the figures it is given (the next request's)."""

    name = "metered"

    def __init__(self) -> None:
        super().__init__(model="custom-cloud", reply=lambda m: "a cloud answer")
        self.figures: list[dict] = []

    def stream(self, messages, params):
        figures = self.figures.pop(0)
        for delta in super().stream(messages, params):
            if delta.usage is not None:
                counts = {"prompt_tokens": delta.usage.prompt_tokens,
                          "completion_tokens": delta.usage.completion_tokens}
                delta = Delta("", delta.finish_reason, Usage(**{**counts, **figures}))
            yield delta


GOOD = {"energy_j": 10.0, "energy_source": "meter", "co2_g": 2.0, "co2_saved_g": -1.0}
BAD = [
    {"energy_j": math.nan, "energy_source": "meter"},
    {"energy_j": math.inf, "energy_source": "meter"},
    {"energy_j": -5.0, "energy_source": "meter"},
    {"co2_g": math.nan},
    {"co2_g": -0.5},
    {"co2_saved_g": -math.inf},
]


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


IDS = [f"{k}={v}" for b in BAD for k, v in b.items() if k != "energy_source"]


@pytest.mark.parametrize("bad", BAD, ids=IDS)
def test_a_bad_energy_or_co2_figure_is_unknown_and_the_totals_keep_the_others(bad, caplog):
    cloud = _Reporting()
    cloud.figures = [GOOD, bad, GOOD]
    with HybridLLM(edge=FakeBackend(), cloud=cloud, cache=False) as llm, \
            caplog.at_level(logging.WARNING, logger="hybridllm"):
        first = llm.chat("one", route="cloud")
        caplog.clear()
        c = llm.chat("two", route="cloud")
        said = _warnings(caplog)
        assert c.route == "cloud" and c.text == "a cloud answer"  # the request succeeds
        for key in bad:  # the bad figure is unknown, as from a server that sends none
            assert getattr(c, key) is None and getattr(c.usage, key) is None, key
        if "energy_j" in bad:
            assert c.energy_j_per_token is None
        for key in {"energy_j", "co2_g", "co2_saved_g"} - set(bad):
            assert getattr(c, key) is None  # (not reported by this request)
        assert len(said) == 1 and "'metered' (_Reporting)" in said[0], said
        caplog.clear()
        llm.chat("three", route="cloud")
        assert _warnings(caplog) == []  # good figures again: nothing to say
        stats = llm.stats()
    assert first.energy_j == 10.0 and first.co2_saved_g == -1.0  # a negative saving is a figure
    assert stats["cloud_energy_j"] == 20.0
    assert stats["co2_g"] == 4.0
    assert stats["co2_saved_g"] == -2.0
    assert stats["cloud_cost_usd"] == pytest.approx(3 * first.cost_usd)


@pytest.mark.parametrize("counts", [(math.nan, 3), (2, math.inf), (-50, 3), (3, -2), (2.0**63, 1)])
def test_a_bad_token_count_is_estimated_and_the_request_succeeds(counts, caplog):
    cloud = _Reporting()
    cloud.figures = [dict(zip(("prompt_tokens", "completion_tokens"), counts, strict=True))]
    with HybridLLM(edge=FakeBackend(), cloud=cloud, cache=False) as llm, \
            caplog.at_level(logging.WARNING, logger="hybridllm"):
        c = llm.chat("how many", route="cloud")
        said = _warnings(caplog)
        stats = llm.stats()
    assert c.route == "cloud" and c.text == "a cloud answer"
    # the pipeline's estimate, as for a cloud that sends no count: whole numbers, not the bad ones
    assert c.usage.prompt_tokens > 0 and c.usage.completion_tokens > 0
    assert all(type(n) is int for n in (c.usage.prompt_tokens, c.usage.completion_tokens))
    assert stats["cloud_tokens"] == c.usage.total_tokens and math.isfinite(stats["cloud_cost_usd"])
    assert len(said) == 1 and "'metered' (_Reporting)" in said[0], said


def test_the_async_client_drops_a_bad_figure_too():
    cloud = _Reporting()
    cloud.figures = [{"energy_j": math.nan}, GOOD]

    async def main() -> dict:
        async with AsyncHybridLLM(edge=FakeBackend(), cloud=cloud, cache=False) as llm:
            c = await llm.chat("one", route="cloud")
            assert c.energy_j is None
            await llm.chat("two", route="cloud")
            return llm.stats()

    assert asyncio.run(main())["cloud_energy_j"] == 10.0
