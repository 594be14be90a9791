"""A cloud error says how long to wait before a retry can be served (``retry_after_s``), where that
is known: the cloud's Retry-After, the budget's sliding window. An app that retries (a job queue,
a web handler answering 429) had to parse the message for it."""

from __future__ import annotations

import pickle

import pytest

from hybridllm import CloudBudgetSpentError, CloudRateLimitError, GenerationParams
from hybridllm.backends.cloud import CloudBackend

from .backends.test_cloud_http import (
    _url,
    server,  # noqa: F401 (the fixture)
)
from .test_context_window import LONG, SHORT, Cloud, client


def test_a_429_with_retry_after_is_raised_with_its_wait(server, monkeypatch):  # noqa: F811
    from hybridllm.backends import cloud_retry

    async def no_sleep(seconds: float) -> None:
        pass

    monkeypatch.setattr(cloud_retry, "_sleep", no_sleep)
    cloud = CloudBackend(base_url=_url(server, "429-120"), model="m", max_retries=0)
    with pytest.raises(CloudRateLimitError) as err:
        list(cloud.stream([{"role": "user", "content": "hi"}], GenerationParams(max_tokens=4)))
    assert err.value.status_code == 429 and err.value.retry_after_s == pytest.approx(120)
    # the next request is told what is left of it without asking the cloud again
    with pytest.raises(CloudRateLimitError) as again:
        list(cloud.stream([{"role": "user", "content": "hi"}], GenerationParams(max_tokens=4)))
    assert 100 < again.value.retry_after_s <= 120
    assert pickle.loads(pickle.dumps(again.value)).retry_after_s == again.value.retry_after_s


def test_a_spent_budget_says_when_it_has_room_again():
    llm, _ = client(Cloud(), max_cloud_calls_per_hour=1)
    with llm:
        assert llm.chat(LONG).route == "cloud"  # the hour's one call
        with pytest.raises(CloudBudgetSpentError) as err:
            llm.chat(LONG)  # past the device's context: only the cloud could answer it
        assert 3590 < err.value.retry_after_s <= 3600
        assert llm.chat(SHORT).route.startswith("edge")  # what fits the device still gets answered


def test_a_limit_of_zero_has_no_wait_to_give():
    llm, _ = client(Cloud(), max_cloud_calls_per_hour=0)
    with llm, pytest.raises(CloudBudgetSpentError) as err:
        llm.chat(LONG)
    assert err.value.retry_after_s is None
