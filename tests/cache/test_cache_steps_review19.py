"""Personal data stays out of the cache file whatever the routing policy scanned."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hybridllm import Decision, HybridLLM
from hybridllm.backends.fake import FakeBackend
from hybridllm.cache import SemanticCache
from hybridllm.router.policy import RoutingPolicy

from .fakes import FakeEmbedder

EMAIL = "jane.doe@example.com"


class _EasyRouter:
    """Every prompt scores easy: the device answers."""

    threshold = 0.5

    def score_text(self, text: str, embedding=None) -> float:
        return 0.1

    def should_escalate(self, mean_logprob) -> bool:
        return False


class _OwnPolicy:
    """A caller's own policy: routes, and scans nothing for personal data."""

    def decide(self, msgs, *, force=None, prompt_tokens=None, embedding=None):
        return Decision("edge", "my rule", 0.1, msgs)

    def should_escalate(self, lp) -> bool:
        return False


def _rows(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [r[0] for r in conn.execute("SELECT query FROM entries")]


@pytest.mark.parametrize("policy", [RoutingPolicy(router=_EasyRouter(), privacy="off"), _OwnPolicy()],
                         ids=["privacy-off", "own-policy"])
def test_personal_data_is_not_stored_when_the_policy_ran_no_scan(tmp_path: Path, policy) -> None:
    """Before: with privacy="off" (or a policy of the caller's own) the plan found no personal
    data, so the prompt and its answer were written to the cache file in clear although the
    cache's store_pii is off."""
    path = tmp_path / "c.sqlite3"
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    llm = HybridLLM(edge=FakeBackend(model="edge"), cloud=FakeBackend(model="cloud"), policy=policy,
                    cache=cache)
    private = llm.chat(f"Write a short note to {EMAIL} about lunch")  # the fake echoes it
    assert private.route == "edge"
    assert _rows(path) == []
    assert EMAIL not in path.read_bytes().decode("latin-1")
    llm.chat("What is a lunch note?")  # no personal data: stored as before
    assert _rows(path) == ["What is a lunch note?"]
    llm.close()


def test_store_pii_still_stores_it(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder(), store_pii=True)
    llm = HybridLLM(edge=FakeBackend(model="edge"), cloud=FakeBackend(model="cloud"),
                    policy=RoutingPolicy(router=_EasyRouter(), privacy="off"), cache=cache)
    llm.chat(f"Write a short note to {EMAIL}")
    assert llm.chat(f"Write a short note to {EMAIL}").route == "cache"
    llm.close()
