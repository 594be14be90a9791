"""The routing pipeline on fakes (fast): cache, policy decisions, cloud fallback, cascade, stats.
The same behaviour with the real edge model and a real cloud server is in e2e/."""

from __future__ import annotations

import asyncio

import pytest

from hybridllm import (
    AsyncHybridLLM,
    CloudUnavailableError,
    ConfigError,
    Decision,
    HybridLLM,
    InvalidRequestError,
)
from hybridllm._types import last_user_text
from hybridllm.backends.fake import FakeBackend
from tests._open_clients import close_clients_left_open  # noqa: F401 - an autouse fixture


class FakeCache:
    """Exact-match cache with the SemanticCache interface (the pipeline's CachePort)."""

    def __init__(self):
        self.entries: dict = {}
        self.puts = 0
        self.gets = 0

    def _key(self, msgs, model, params_key, namespace):
        return (namespace, model, repr(sorted(params_key.items())), repr(msgs))

    def embed_query(self, msgs):
        return None

    def get(self, msgs, *, model, params_key, namespace=None, embedding=None):
        self.gets += 1
        text, metadata = self.entries.get(self._key(msgs, model, params_key, namespace), (None, None))
        return None if text is None else type("Hit", (), {"text": text, "similarity": 1.0,
                                                          "verifier_prob": None, "metadata": metadata})()

    def put(self, msgs, text, *, model, params_key, namespace=None, pii=False, metadata=None,
            embedding=None):
        if pii:
            return None
        self.puts += 1
        self.entries[self._key(msgs, model, params_key, namespace)] = (text, metadata)
        return "id"

    def close(self):
        pass


class FakePolicy:
    """'hard' in the prompt -> cloud; 'unsure' -> cascade; an '@' -> private, kept on device."""

    def __init__(self, escalate=True):
        self.escalate = escalate
        self.scored = 0

    def decide(self, msgs, *, force=None, prompt_tokens=None, embedding=None):
        text = last_user_text(msgs)
        if "@" in text:
            return Decision("edge", "privacy: email", None, msgs, ["email"])
        if force:
            return Decision(force, f"forced {force}", None, msgs, forced=True)
        self.scored += 1
        if "unsure" in text:
            return Decision("edge", "borderline", 0.5, msgs, cascade=True)
        score = 0.9 if "hard" in text else 0.1
        return Decision("cloud" if score > 0.5 else "edge", f"score {score}", score, msgs)

    def should_escalate(self, lp):
        return self.escalate


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


def make(policy=None, cache=None, **settings):
    edge = FakeBackend(model="edge-model", reply=lambda m: "edge answer")
    cloud = FlakyCloud()
    llm = HybridLLM(edge=edge, cloud=cloud, policy=policy or FakePolicy(),
                    cache=cache if cache is not None else FakeCache(), price_per_1k_tokens=1.0,
                    **settings)
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
    cache, policy = FakeCache(), FakePolicy()
    llm, edge, cloud = make(cache=cache, policy=policy)
    to_cloud = llm.chat("easy", route="cloud")
    to_edge = llm.chat("hard", route="edge")
    assert (to_cloud.route, to_cloud.score, to_edge.route, to_edge.score) == \
        ("cloud", None, "edge", None)
    assert "forced" in to_cloud.reason and len(cloud.calls) == 1 and len(edge.calls) == 1
    assert (cache.gets, cache.puts, policy.scored) == (0, 0, 0)  # neither consulted
    with pytest.raises(InvalidRequestError, match="route must be 'edge', 'cloud'"):
        llm.stream("x", route="moon")  # at the call


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
    answers = [llm.chat("easy one"), llm.chat("hard one"), llm.chat("hard one")]
    s = llm.stats()
    assert s["requests"] == 3
    assert set(s["routes"]) == {"edge", "cloud", "cache"}
    assert s["cache_hit_rate"] == pytest.approx(1 / 3)
    assert s["cloud_fraction"] == pytest.approx(1 / 3)
    # recomputed from the answers: cloud tokens are the cloud answer's; the saving prices every
    # answer the cloud did not produce at the cloud's rate (1.0 per 1k tokens here): the edge
    # answer's tokens, and for the cache hit (0 tokens of its own) those of the cloud call whose
    # answer it replays
    edge, cloud, hit = answers
    assert (edge.route, cloud.route, hit.route) == ("edge", "cloud", "cache")
    assert cloud.usage.total_tokens > 0 and hit.usage.total_tokens == 0 and hit.text == cloud.text
    assert s["cloud_tokens"] == cloud.usage.total_tokens
    assert s["cloud_cost_usd"] == pytest.approx(cloud.usage.total_tokens / 1000)
    saved = (edge.usage.total_tokens + cloud.usage.total_tokens) / 1000
    assert edge.usage.total_tokens > 0 and s["cost_saved_vs_cloud_only_usd"] == pytest.approx(saved)


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
    llm = HybridLLM(edge=edge, cloud=cloud, policy=policy, cache=cache, max_cloud_calls_per_hour=9)
    stream = llm.stream("hard question")
    chunks = [c for c in stream if c.text]
    c = stream.completion
    assert [ch.route for ch in chunks] == ["cloud", "cloud", "cloud->edge", "cloud->edge", "cloud->edge"]
    assert c.text == "the cloud and the rest" == "".join(ch.text for ch in chunks)
    assert c.route == "cloud->edge" and "broke after 9 characters" in c.reason
    assert edge.continued == ["the cloud"]  # the device saw what the user already has
    assert llm.stats()["budget"]["calls_hour"] == 1  # the broken call still counts
    assert llm.stats()["budget"]["tokens_hour"] > 0
    # the device finished it in the cloud's place: not stored (the cloud's own answer is, later)
    assert cache.puts == 0


def test_cloud_stream_breaking_without_a_continuing_edge_is_a_clear_error():
    class NoContinue(FakeBackend):
        def stream_continuation(self, messages, prefix, params):
            return Backend.stream_continuation(self, messages, prefix, params)

    from hybridllm.backends.base import Backend

    llm = HybridLLM(edge=NoContinue(model="edge-model"), cloud=BreakingCloud(), policy=FakePolicy(),
                    cache=False)
    with pytest.raises(CloudUnavailableError, match="broke mid-answer.*cannot continue"):
        llm.chat("hard question")


def test_budget_is_a_ledger_the_pipeline_keeps():
    llm, edge, cloud = make(max_cloud_calls_per_hour=2)
    routes = [llm.chat(f"hard question {i}", cache=False).route for i in range(4)]
    assert routes == ["cloud", "cloud", "edge", "edge"] and len(cloud.calls) == 2
    c = llm.chat("hard question 9", cache=False)
    assert "budget spent: 2/2 cloud calls this hour" in c.reason
    assert llm.chat("hard but forced", route="cloud", cache=False).route == "cloud"
    assert llm.stats()["budget"]["calls_hour"] == 3


def test_a_cloud_call_abandoned_mid_stream_is_still_on_the_ledger():
    llm, edge, cloud = make(max_cloud_calls_per_hour=5)
    cloud.reply = lambda m: "a long cloud answer " * 10
    for i, _chunk in enumerate(llm.stream("hard question")):
        if i == 1:
            break
    assert llm.stats()["budget"]["calls_hour"] == 1


def test_unsure_edge_answers_are_not_cached_and_sure_ones_are():
    cache = FakeCache()
    edge = FakeBackend(model="edge-model", reply=lambda m: "L'Etoile, est la cite", logprob=-2.5)
    llm = HybridLLM(edge=edge, cache=cache, cache_min_logprob=-1.0)
    c = llm.chat("What is the capital of France?")
    assert c.mean_logprob == pytest.approx(-2.5) and cache.puts == 0
    assert llm.chat("What is the capital of France?").route == "edge"  # asked again, not replayed
    edge.logprob = -0.2
    llm.chat("What is the capital of France?")
    assert cache.puts == 1 and llm.chat("What is the capital of France?").route == "cache"


def test_a_cache_that_cannot_write_never_costs_the_answer(caplog):
    class FullDisk(FakeCache):
        def put(self, *a, **k):
            import sqlite3

            raise sqlite3.OperationalError("database or disk is full")

    llm, *_ = make(cache=FullDisk())
    answers = [llm.chat(f"easy question {i}").text for i in range(3)]
    assert answers == ["edge answer"] * 3
    assert sum("cannot store answers" in r.message for r in caplog.records) == 1  # logged once



def test_an_embedder_that_cannot_load_costs_no_answer_and_is_logged_once(caplog):
    from hybridllm import HybridLLMError

    class NoEmbedder(FakeCache):
        def embed_query(self, msgs):
            raise HybridLLMError("the embedder is not prepared")

    llm, *_ = make(cache=NoEmbedder())
    answers = [llm.chat(f"easy question {i}").text for i in range(3)]
    assert answers == ["edge answer"] * 3
    assert sum("embedding failed" in r.message for r in caplog.records) == 1

def test_a_caller_that_stops_at_the_finish_chunk_leaves_stats_and_cache_complete():
    cache = FakeCache()
    llm, *_ = make(cache=cache)
    for prompt in ("easy one", "easy one"):  # an answer, then a cache hit
        for chunk in llm.stream(prompt):
            if chunk.finish_reason:
                break
    assert cache.puts == 1 and llm.stats()["requests"] == 2
    assert set(llm.stats()["routes"]) == {"edge", "cache"}


def test_a_cloud_that_learns_its_model_name_while_answering_reports_it():
    class Discovering(FlakyCloud):
        @property
        def model(self):
            return self._name

        @model.setter
        def model(self, value):
            self._name = value

        def stream(self, messages, params):
            self._name = "served-model"  # learned from the endpoint's /v1/models
            yield from super().stream(messages, params)

    cloud = Discovering()
    cloud.model = "cloud"
    llm = HybridLLM(edge=FakeBackend(), cloud=cloud, policy=FakePolicy(), cache=False)
    c = llm.chat("hard question")
    assert (c.route, c.model) == ("cloud", "served-model")


def _real_cache(path):
    from hybridllm.cache import SemanticCache
    from tests.cache.fakes import FakeEmbedder

    embedder = FakeEmbedder()
    return SemanticCache(path, verifier=None, embedder=embedder), embedder


def test_an_exact_repeat_is_served_before_and_without_the_embedder(tmp_path):
    """Before: HybridLLM embedded every question before its cache lookup, so an exact repeat
    cost an embedding, and one whose embedder failed went unanswered by the cache."""
    cache, embedder = _real_cache(tmp_path / "c.sqlite3")
    llm, edge, _ = make(cache=cache)
    first = llm.chat("easy question")
    calls = embedder.calls
    again = llm.chat("easy question")
    assert (first.route, again.route, again.text) == ("edge", "cache", "edge answer")
    assert embedder.calls == calls

    def broken(text):
        raise RuntimeError("the embedder cannot load")

    embedder.embed_one = broken
    assert llm.chat("easy question").route == "cache"
    llm.close()


def test_answers_of_another_cloud_model_are_not_served(tmp_path):
    """Before: the cache key named the edge model and '|cloud' only, so after cloud_model changed
    the previous cloud model's answers were served as the new one's."""
    path = tmp_path / "c.sqlite3"
    for model, expect in (("cloud-a", "cloud"), ("cloud-a", "cache"), ("cloud-b", "cloud")):
        cache, _ = _real_cache(path)
        cloud = FlakyCloud()
        cloud.model = model
        llm = HybridLLM(edge=FakeBackend(model="edge-model"), cloud=cloud, policy=FakePolicy(),
                        cache=cache)
        assert llm.chat("hard question").route == expect, model
        llm.close()


def test_an_empty_namespace_is_refused_not_read_as_the_default(tmp_path):
    """Before: namespace='' on a call fell back to the default namespace: a tenant named '' read
    (and wrote) the default tenant's answers."""
    cache, _ = _real_cache(tmp_path / "c.sqlite3")
    llm, *_ = make(cache=cache)
    llm.chat("easy question")
    with pytest.raises(InvalidRequestError, match="namespace"):
        llm.chat("easy question", namespace="")
    assert llm.chat("easy question", namespace="t1").route == "edge"
    llm.close()
    with pytest.raises(ConfigError, match="namespace"):
        HybridLLM(edge=FakeBackend(), cache=False, namespace="")
