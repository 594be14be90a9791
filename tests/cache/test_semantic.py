"""SemanticCache behaviour on a fake embedder: keying, isolation, TTL, eviction, PII, threads."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from hybridllm._exceptions import ConfigError, InvalidRequestError
from hybridllm.cache import SemanticCache
from hybridllm.cache.semantic import split_messages

from .fakes import FakeEmbedder


def user(text: str, *, system: str | None = None, history: list[dict] | None = None) -> list[dict]:
    msgs = [{"role": "system", "content": system}] if system else []
    return msgs + (history or []) + [{"role": "user", "content": text}]


@pytest.fixture
def cache(tmp_path: Path):
    c = SemanticCache(tmp_path / "c.sqlite3", verifier=None, min_similarity=0.9, embedder=FakeEmbedder())
    yield c
    c.close()


KW = {"model": "m", "params_key": {"temperature": 0}}


def test_put_then_get_exact_and_paraphrase(cache: SemanticCache) -> None:
    entry_id = cache.put(user("How do I learn Python?"), "Practice daily.", **KW)
    hit = cache.get(user("  How do I   learn Python?"), **KW)  # whitespace-normalized exact repeat
    assert hit is not None and hit.text == "Practice daily." and hit.entry_id == entry_id
    assert hit.similarity == 1.0
    hit = cache.get(user("how do i learn python"), **KW)  # same words: cosine 1 under the fake
    assert hit is not None and hit.similarity > 0.99
    assert cache.get(user("What is the capital of France?"), **KW) is None
    assert cache.stats()["hits"] == 2 and cache.stats()["misses"] == 1


def test_same_question_twice_is_one_entry(cache: SemanticCache) -> None:
    first = cache.put(user("Q one?"), "a1", **KW)
    second = cache.put(user("Q one?"), "a2", **KW)
    assert first == second and cache.stats()["entries"] == 1
    assert cache.get(user("Q one?"), **KW).text == "a2"


def test_namespaces_never_cross(cache: SemanticCache) -> None:
    cache.put(user("What is my balance?"), "alice: 10", namespace="alice", **KW)
    assert cache.get(user("What is my balance?"), namespace="bob", **KW) is None
    assert cache.get(user("What is my balance?"), **KW) is None  # the default namespace
    assert cache.get(user("What is my balance?"), namespace="alice", **KW).text == "alice: 10"
    assert cache.clear(namespace="alice") == 1
    assert cache.get(user("What is my balance?"), namespace="alice", **KW) is None


def test_context_model_and_params_key_the_entry(cache: SemanticCache) -> None:
    conv_a = [
        {"role": "user", "content": "Tell me about Marie Curie"},
        {"role": "assistant", "content": "..."},
    ]
    conv_b = [
        {"role": "user", "content": "Tell me about Ada Lovelace"},
        {"role": "assistant", "content": "..."},
    ]
    cache.put(user("How old is she?", history=conv_a), "66", **KW)
    assert cache.get(user("How old is she?", history=conv_b), **KW) is None
    assert cache.get(user("How old is she?", history=conv_a), **KW).text == "66"
    assert cache.get(user("How old is she?", history=conv_a, system="Be terse"), **KW) is None
    assert (
        cache.get(user("How old is she?", history=conv_a), model="other", params_key={"temperature": 0})
        is None
    )
    assert (
        cache.get(user("How old is she?", history=conv_a), model="m", params_key={"temperature": 1}) is None
    )


def test_ttl_expiry(tmp_path: Path) -> None:
    cache = SemanticCache(tmp_path / "t.sqlite3", ttl_s=0.2, verifier=None, embedder=FakeEmbedder())
    cache.put(user("Short lived?"), "yes", **KW)
    assert cache.get(user("Short lived?"), **KW) is not None
    time.sleep(0.3)
    assert cache.get(user("Short lived?"), **KW) is None
    cache.close()
    reopened = SemanticCache(tmp_path / "t.sqlite3", ttl_s=0.2, verifier=None, embedder=FakeEmbedder())
    assert reopened.stats()["entries"] == 0
    reopened.close()


def test_lru_eviction_order(tmp_path: Path) -> None:
    cache = SemanticCache(tmp_path / "l.sqlite3", max_entries=3, verifier=None, embedder=FakeEmbedder())
    for q in ("alpha one", "beta two", "gamma three"):
        cache.put(user(q), q.upper(), **KW)
        time.sleep(0.01)
    assert cache.get(user("alpha one"), **KW) is not None  # alpha is now the most recent
    cache.put(user("delta four"), "D", **KW)  # evicts beta, the least recently used
    assert cache.get(user("beta two"), **KW) is None
    for q in ("alpha one", "gamma three", "delta four"):
        assert cache.get(user(q), **KW) is not None
    assert cache.stats()["entries"] == 3
    cache.close()


def test_pii_not_stored_unless_configured(tmp_path: Path, cache: SemanticCache) -> None:
    assert cache.put(user("My SSN is 123-45-6789, file my taxes"), "ok", pii=True, **KW) is None
    assert cache.stats()["entries"] == 0
    keep = SemanticCache(tmp_path / "p.sqlite3", store_pii=True, verifier=None, embedder=FakeEmbedder())
    assert keep.put(user("My SSN is 123-45-6789"), "ok", pii=True, **KW) is not None
    keep.close()


def test_delete_and_persistence(tmp_path: Path) -> None:
    path = tmp_path / "d.sqlite3"
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    keep = cache.put(user("kept question"), "kept", metadata={"route": "edge"}, **KW)
    gone = cache.put(user("deleted question"), "gone", **KW)
    assert cache.delete(gone) and not cache.delete(gone)
    cache.close()
    cache = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    hit = cache.get(user("kept question"), **KW)
    assert hit.entry_id == keep and hit.metadata == {"route": "edge"}
    assert cache.get(user("deleted question"), **KW) is None
    cache.close()


def test_exact_repeat_skips_the_embedder(tmp_path: Path) -> None:
    fake = FakeEmbedder()
    cache = SemanticCache(tmp_path / "e.sqlite3", verifier=None, embedder=fake)
    cache.put(user("Repeat me"), "r", **KW)
    calls = fake.calls
    assert cache.get(user("Repeat me"), **KW) is not None and fake.calls == calls
    assert cache.get(user("Something new"), namespace="empty", **KW) is None and fake.calls == calls
    cache.close()


def test_changes_from_another_connection_are_seen(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite3"
    one = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    two = SemanticCache(path, verifier=None, embedder=FakeEmbedder())
    two.put(user("written by two"), "2", **KW)
    assert one.get(user("written by two"), **KW).text == "2"
    one.close()
    two.close()


def test_threads_share_one_cache(cache: SemanticCache) -> None:
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(30):
                cache.put(user(f"thread {n} question {i}"), f"{n}-{i}", **KW)
                hit = cache.get(user(f"thread {n} question {i}"), **KW)
                assert hit is not None and hit.text == f"{n}-{i}"
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and cache.stats()["entries"] == 120


def test_bad_input_and_settings(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError):
        split_messages([{"role": "system", "content": "no user turn"}])
    with pytest.raises(InvalidRequestError):
        split_messages([])
    with pytest.raises(ConfigError):
        SemanticCache(tmp_path / "x.sqlite3", max_entries=0, verifier=None, embedder=FakeEmbedder())
    ctx, query = split_messages(user("last", history=[{"role": "user", "content": "first"}]))
    assert query == "last" and ctx == [{"role": "user", "content": "first"}]
