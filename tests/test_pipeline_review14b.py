"""The device pipeline core, reviewed (fakes, fast): a custom policy's own error and answer, the reason of a
cascade whose cloud failed, and the device's answers in the cloud's place kept out of the cache."""

from __future__ import annotations

import pytest

from hybridllm import CloudUnavailableError, HybridLLM, RouterError
from hybridllm.backends.fake import FakeBackend
from tests._open_clients import close_clients_left_open  # noqa: F401 - an autouse fixture
from tests.test_pipeline import FakeCache, FakePolicy, FlakyCloud, make


class RaisingPolicy(FakePolicy):
    def decide(self, msgs, **kw):
        raise KeyError("tier")


class EscalateRaises(FakePolicy):
    def should_escalate(self, lp):
        raise ZeroDivisionError("floor")


class ReturnsNone(FakePolicy):
    def decide(self, msgs, **kw):
        return None


def _note(info) -> str:
    return " ".join(getattr(info.value, "__notes__", []))


def test_a_custom_policy_that_raises_keeps_its_error_and_names_the_policy():
    llm, edge, cloud = make(policy=RaisingPolicy())
    with pytest.raises(KeyError) as info:
        llm.chat("easy question")
    assert "routing policy RaisingPolicy.decide()" in _note(info)
    assert cloud.calls == [] and llm.stats()["requests"] == 0


def test_a_streamed_request_gets_the_same_named_error():
    llm, edge, cloud = make(policy=RaisingPolicy())
    with pytest.raises(KeyError) as info, llm.stream("easy question") as s:
        list(s)
    assert "RaisingPolicy.decide()" in _note(info)


def test_a_policy_whose_should_escalate_raises_is_named():
    llm, edge, cloud = make(policy=EscalateRaises())
    with pytest.raises(ZeroDivisionError) as info:
        llm.chat("unsure question")
    assert "routing policy EscalateRaises.should_escalate()" in _note(info)


def test_a_policy_that_returns_no_decision_is_a_router_error():
    llm, edge, cloud = make(policy=ReturnsNone())
    with pytest.raises(RouterError, match=r"ReturnsNone\.decide\(\) returned NoneType"):
        llm.chat("easy question")


def test_a_library_error_from_the_policy_passes_through_unwrapped():
    class Refuses(FakePolicy):
        def decide(self, msgs, **kw):
            raise CloudUnavailableError("mine")

    llm, edge, cloud = make(policy=Refuses())
    with pytest.raises(CloudUnavailableError, match="^mine$") as info:
        llm.chat("easy question")
    assert _note(info) == ""


class FailingCloud(FlakyCloud):
    """Up, but its call fails before the first token."""

    def stream(self, messages, params):
        raise CloudUnavailableError("HTTP 503 from http://h/v1")
        yield


def test_a_cascade_whose_cloud_failed_says_why_it_kept_the_draft():
    edge = FakeBackend(model="edge-model", reply=lambda m: "edge answer")
    llm = HybridLLM(edge=edge, cloud=FailingCloud(), policy=FakePolicy(), cache=FakeCache())
    c = llm.chat("unsure question")
    assert (c.route, c.text) == ("edge", "edge answer")
    assert "the cloud failed: HTTP 503 from http://h/v1" in c.reason


def test_a_cascade_whose_cloud_is_down_says_why_it_kept_the_draft():
    llm, edge, cloud = make()
    cloud.up = False
    c = llm.chat("unsure question")
    assert c.route == "edge" and "the cloud is unavailable (circuit open" in c.reason


def test_the_device_answer_for_a_down_cloud_is_not_served_once_it_is_back():
    cache = FakeCache()
    llm, edge, cloud = make(cache=cache)
    cloud.up = False
    assert llm.chat("hard question").route == "edge (cloud unavailable)"
    assert cache.puts == 0
    cloud.up = True
    again = llm.chat("hard question")
    assert (again.route, again.text) == ("cloud", "cloud answer")  # not the device's stand-in
    assert llm.chat("hard question").route == "cache"  # the cloud's answer is stored


def test_the_device_answer_for_a_failing_cloud_call_is_not_stored():
    cache = FakeCache()
    edge = FakeBackend(model="edge-model", reply=lambda m: "edge answer")
    llm = HybridLLM(edge=edge, cloud=FailingCloud(), policy=FakePolicy(), cache=cache)
    assert llm.chat("hard question").route == "edge (cloud unavailable)"
    assert cache.puts == 0


def test_an_unsure_cascade_draft_kept_for_a_down_cloud_is_not_stored():
    cache = FakeCache()
    llm, edge, cloud = make(cache=cache)
    cloud.up = False
    assert llm.chat("unsure question").route == "edge"
    assert cache.puts == 0
    cloud.up = True
    assert llm.chat("unsure question").route == "edge->cloud"
    assert cache.puts == 1


def test_a_confident_cascade_draft_is_still_stored():
    cache = FakeCache()
    llm, edge, cloud = make(policy=FakePolicy(escalate=False), cache=cache)
    assert llm.chat("unsure question").route == "edge"
    assert cache.puts == 1


def test_the_device_answer_for_a_spent_budget_is_not_stored():
    cache = FakeCache()
    llm, edge, cloud = make(cache=cache, max_cloud_calls_per_hour=0)
    c = llm.chat("hard question")
    assert c.route == "edge" and "score 0.9" in c.reason
    assert cache.puts == 0


def test_edge_answers_and_device_only_clients_are_still_stored():
    cache = FakeCache()
    llm, edge, cloud = make(cache=cache)
    assert llm.chat("easy question").route == "edge"
    assert cache.puts == 1
    c2 = FakeCache()
    solo = HybridLLM(edge=FakeBackend(model="edge-model", reply=lambda m: "edge answer"), cache=c2)
    solo.chat("anything")
    assert c2.puts == 1
