"""The routing pipeline on fakes (fast): cache, policy decisions, cloud fallback, cascade, stats.
The same behaviour with the real edge model and a real cloud server is in e2e/."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from hybridllm import AsyncHybridLLM, CloudUnavailableError, ConfigError, HybridLLM
from hybridllm._types import last_user_text
from hybridllm.backends.fake import FakeBackend


class FakeCache:
    """Exact-match cache with the SemanticCache interface."""

    def __init__(self):
        self.entries: dict = {}
        self.puts = 0

    def _key(self, msgs, model, params_key, namespace):
        return (namespace, model, repr(sorted(params_key.items())), repr(msgs))

    def get(self, msgs, *, model, params_key, namespace=None):
        text = self.entries.get(self._key(msgs, model, params_key, namespace))
        return None if text is None else type("Hit", (), {"text": text, "similarity": 1.0,
                                                          "verifier_prob": None})()

    def put(self, msgs, text, *, model, params_key, namespace=None, pii=False, metadata=None):
        if pii:
            return None
        self.puts += 1
        self.entries[self._key(msgs, model, params_key, namespace)] = text
        return "id"

    def close(self):
        pass


@dataclass
class FakeDecision:
    route: str
    reason: str
    score: float | None
    messages_for_cloud: list
    pii_kinds: list = field(default_factory=list)
    cascade: bool = False


class FakePolicy:
    """'hard' in the prompt -> cloud; 'unsure' -> cascade; an '@' -> private, kept on device."""

    def __init__(self, escalate=True):
        self.escalate = escalate
        self.cloud_tokens = 0

    def decide(self, msgs, *, force=None, prompt_tokens=None):
        text = last_user_text(msgs)
        if "@" in text:
            return FakeDecision("edge", "privacy: email", None, msgs, ["email"])
        if force:
            return FakeDecision(force, f"forced {force}", None, msgs)
        if "unsure" in text:
            return FakeDecision("edge", "borderline", 0.5, msgs, cascade=True)
        score = 0.9 if "hard" in text else 0.1
        return FakeDecision("cloud" if score > 0.5 else "edge", f"score {score}", score, msgs)

    def should_escalate(self, lp):
        return self.escalate

    def record_cloud_usage(self, tokens):
        self.cloud_tokens += tokens


class FlakyCloud(FakeBackend):
    def __init__(self):
        super().__init__(model="cloud-model", reply=lambda m: "cloud answer")
        self.up = True

    def is_available(self):
        return self.up

    def stream(self, messages, params):
        if not self.up:
            raise CloudUnavailableError("down")
        yield from super().stream(messages, params)


def make(policy=None, cache=None):
    edge = FakeBackend(model="edge-model", reply=lambda m: "edge answer")
    cloud = FlakyCloud()
    llm = HybridLLM(edge=edge, cloud=cloud, policy=policy or FakePolicy(),
                    cache=cache if cache is not None else FakeCache(), price_per_1k_tokens=1.0)
    return llm, edge, cloud


def test_each_route_is_reported():
    llm, edge, cloud = make()
    easy = llm.chat("easy question")
    assert (easy.route, easy.text, easy.score) == ("edge", "edge answer", 0.1)
    hard = llm.chat("hard question")
    assert (hard.route, hard.text, hard.model) == ("cloud", "cloud answer", "cloud-model")
    assert hard.cost_usd == pytest.approx(hard.usage.total_tokens / 1000)
    again = llm.chat("hard question")
    assert (again.route, again.text, again.cache_similarity) == ("cache", "cloud answer", 1.0)
    assert len(cloud.calls) == 1  # the repeat never reached the cloud


def test_cloud_down_falls_back_to_device_and_says_so():
    llm, edge, cloud = make()
    cloud.up = False
    c = llm.chat("hard question", cache=False)
    assert c.route == "edge (cloud unavailable)" and c.text == "edge answer"


def test_cloud_failing_at_call_time_falls_back():
    llm, edge, cloud = make()
    cloud.is_available = lambda: True
    cloud.up = False
    c = llm.chat("hard question two")
    assert c.route == "edge (cloud unavailable)" and "cloud failed" in c.reason


def test_cascade_escalates_or_keeps_the_draft():
    llm, edge, cloud = make(policy=FakePolicy(escalate=True))
    c = llm.chat("unsure question")
    assert c.route == "edge->cloud" and c.text == "cloud answer"
    llm2, _, cloud2 = make(policy=FakePolicy(escalate=False))
    c2 = llm2.chat("unsure question")
    assert c2.route == "edge" and c2.text == "edge answer" and not cloud2.calls


def test_private_prompt_stays_on_device_and_is_not_cached():
    cache = FakeCache()
    llm, edge, cloud = make(cache=cache)
    c = llm.chat("hard question from bob@example.com")
    assert c.route == "edge" and "privacy" in c.reason and not cloud.calls
    assert cache.puts == 0


def test_forced_route_skips_cache_and_router():
    llm, edge, cloud = make()
    assert llm.chat("easy", route="cloud").route == "cloud"
    assert llm.chat("hard", route="edge").route == "edge"
    with pytest.raises(Exception, match="route"):
        llm.chat("x", route="moon")


def test_cache_hits_stream_too():
    llm, *_ = make()
    llm.chat("easy streaming question")
    stream = llm.stream("easy streaming question")
    chunks = [c for c in stream if c.text]
    assert len(chunks) >= 2 and stream.completion.route == "cache"
    assert "".join(c.text for c in chunks) == "edge answer"


def test_a_broken_stream_is_not_cached():
    cache = FakeCache()
    llm, *_ = make(cache=cache)
    for _ in llm.stream("easy but abandoned"):
        break
    assert cache.puts == 0


def test_stats_per_route_and_savings():
    llm, *_ = make()
    llm.chat("easy one")
    llm.chat("hard one")
    llm.chat("hard one")
    s = llm.stats()
    assert s["requests"] == 3
    assert set(s["routes"]) == {"edge", "cloud", "cache"}
    assert s["cache_hit_rate"] == pytest.approx(1 / 3)
    assert s["cloud_fraction"] == pytest.approx(1 / 3)
    assert s["cloud_tokens"] > 0 and s["cost_saved_vs_cloud_only_usd"] > 0


def test_route_cloud_without_cloud_is_a_config_error():
    llm = HybridLLM(edge=FakeBackend(), cache=False)
    with pytest.raises(ConfigError, match="cloud_url"):
        llm.chat("x", route="cloud")


def test_async_gives_the_same_routes():
    llm, *_ = make()

    async def run():
        a = AsyncHybridLLM.wrap(llm)
        return [(await a.chat(p)).route for p in ("easy a", "hard a", "hard a")]

    assert asyncio.run(run()) == ["edge", "cloud", "cache"]


class BreakingCloud(FlakyCloud):
    """Streams two words, then the connection drops."""

    def stream(self, messages, params):
        for i, delta in enumerate(super().stream(messages, params)):
            if i == 2:
                raise CloudUnavailableError("connection reset mid-stream")
            yield delta


def test_cloud_stream_breaking_mid_answer_is_finished_on_the_device():
    edge = FakeBackend(model="edge-model", reply=lambda m: "and the rest")
    cloud = BreakingCloud()
    cloud.reply = lambda m: "the cloud begins here and goes on"
    policy = FakePolicy()
    cache = FakeCache()
    llm = HybridLLM(edge=edge, cloud=cloud, policy=policy, cache=cache)
    stream = llm.stream("hard question")
    chunks = [c for c in stream if c.text]
    c = stream.completion
    assert [ch.route for ch in chunks] == ["cloud", "cloud", "cloud->edge", "cloud->edge", "cloud->edge"]
    assert c.text == "the cloud and the rest" == "".join(ch.text for ch in chunks)
    assert c.route == "cloud->edge" and "broke after 9 characters" in c.reason
    assert edge.continued == ["the cloud"]  # the device saw what the user already has
    assert policy.cloud_tokens > 0  # the broken call still counts against the budget
    assert cache.puts == 1  # a finished answer is cached like any other


def test_cloud_stream_breaking_without_a_continuing_edge_is_a_clear_error():
    class NoContinue(FakeBackend):
        def stream_continuation(self, messages, prefix, params):
            return Backend.stream_continuation(self, messages, prefix, params)

    from hybridllm.backends.base import Backend

    llm = HybridLLM(edge=NoContinue(model="edge-model"), cloud=BreakingCloud(), policy=FakePolicy(),
                    cache=False)
    with pytest.raises(CloudUnavailableError, match="broke mid-answer.*cannot continue"):
        llm.chat("hard question")
