"""The hit verifier runs outside the cache's lock: a slow verification (a reranker pass) does not
hold other lookups, writes or stats of the same cache behind it, and an entry deleted while it
is verified is a miss, not an error or a served deleted answer."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pytest

from hybridllm.cache.semantic import SemanticCache

from .fakes import FakeEmbedder

KEY = {"temperature": 0.0}


class BlockingVerifier:
    """Says yes to every candidate, after ``release`` is set (once ``entered`` is)."""

    kind = "blocking"
    threshold = 0.5
    min_similarity = 0.5

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def predict(self, queries: Sequence[str], cached: Sequence[str], q_vecs: np.ndarray,
                c_vecs: np.ndarray, *, at_least: float | None = None) -> np.ndarray:
        self.entered.set()
        assert self.release.wait(10), "the test never released the verifier"
        return np.ones(len(queries))


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.fixture
def cache(tmp_path):
    verifier = BlockingVerifier()
    c = SemanticCache(tmp_path / "c.db", verifier=verifier, embedder=FakeEmbedder(), ttl_s=None)  # type: ignore[arg-type]
    c.put(ask("how do I boil an egg"), "ten minutes", model="m", params_key=KEY)
    yield c, verifier
    verifier.release.set()
    c.close()


def start_lookup(c: SemanticCache, out: list) -> threading.Thread:
    # a paraphrase (not an exact repeat), so the verifier is asked
    t = threading.Thread(target=lambda: out.append(c.get(ask("how do I boil an egg please"), model="m",
                                                         params_key=KEY)))
    t.start()
    return t


def test_writes_and_stats_go_on_while_a_lookup_is_verified(cache):
    c, verifier = cache
    out: list = []
    t = start_lookup(c, out)
    assert verifier.entered.wait(10)
    done = threading.Event()

    def other_work() -> None:
        c.put(ask("what is the capital of France"), "Paris", model="m", params_key=KEY)
        c.stats()
        assert c.get_exact(ask("what is the capital of France"), model="m", params_key=KEY) is not None
        done.set()

    w = threading.Thread(target=other_work, daemon=True)
    w.start()
    # with the verifier under the lock, the other thread waits for the release: this times out
    assert done.wait(5), "a write behind a lookup being verified waited for the verifier"
    verifier.release.set()
    t.join(10)
    w.join(10)
    assert out and out[0] is not None and out[0].text == "ten minutes"


def test_an_entry_deleted_while_verified_is_a_miss(cache):
    c, verifier = cache
    out: list = []
    t = start_lookup(c, out)
    assert verifier.entered.wait(10)
    assert c.clear() == 1  # takes the lock: proves the lookup does not hold it
    verifier.release.set()
    t.join(10)
    assert out == [None]
    stats = c.stats()
    assert (stats["hits"], stats["misses"]) == (0, 1)
