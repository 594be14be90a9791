"""SemanticCache behaviour on a fake embedder: keying, isolation, TTL, eviction, PII, threads."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
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


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The cache's wall clock, moved by hand (``clock[0] += s``): a TTL of a fraction of a second
    on the real clock expires early whenever a busy host pauses the test between put and get."""
    from types import SimpleNamespace

    from hybridllm.cache import _mirror, _writes, semantic

    now = [time.time()]
    for mod in (semantic, _mirror, _writes):  # the cache's modules that read the clock
        monkeypatch.setattr(mod, "time", SimpleNamespace(time=lambda: now[0]))
    return now


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


def test_ttl_expiry(tmp_path: Path, clock: list[float]) -> None:
    cache = SemanticCache(tmp_path / "t.sqlite3", ttl_s=0.2, verifier=None, embedder=FakeEmbedder())
    cache.put(user("Short lived?"), "yes", **KW)
    clock[0] += 0.1
    assert cache.get(user("Short lived?"), **KW) is not None
    clock[0] += 0.2
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


# ---------------------------------------------------------------------- hard negatives


@pytest.mark.parametrize(
    ("cached", "asked"),
    [
        ("What is 5!", "What is 5?"),  # the same words: an exact repeat before
        ("What does this print?\nfor i in range(3):\n    print(i)\nprint('done')",
         "What does this print?\nfor i in range(3):\n    print(i)\n    print('done')"),
        ("Is x = 1 or X = 1 valid Python?", "is x = 1 or x = 1 valid python?"),
        ("Flights from Paris to London", "Flights from London to Paris"),  # cosine 1.0 to the fake
        ("convert 5 km to miles", "convert 50 km to miles"),
        ("Is it safe to take ibuprofen?", "Is it not safe to take ibuprofen?"),
    ],
)
def test_a_different_question_is_never_served_even_at_cosine_one(
    tmp_path: Path, cached: str, asked: str
) -> None:
    """Before: the first three were one entry (case, all whitespace and a trailing '!' were
    normalized away), the next ones hit at plain cosine: models blind to case, layout, order or a
    single word cannot vouch for them."""
    cache = SemanticCache(tmp_path / "h.sqlite3", verifier=None, min_similarity=0.5, embedder=FakeEmbedder())
    cache.put(user(cached), "the cached answer", **KW)
    assert cache.get(user(asked), **KW) is None
    assert cache.get(user(cached), **KW).text == "the cached answer"
    cache.put(user(asked), "its own answer", **KW)  # two entries, each served its own answer
    assert cache.get(user(asked), **KW).text == "its own answer"
    assert cache.get(user(cached), **KW).text == "the cached answer"
    cache.close()


class WindowEmbedder(FakeEmbedder):
    """Reads only the first ``window`` words, as MiniLM reads only its first 256 tokens."""

    window = 8

    def embed_one(self, text: str) -> np.ndarray:
        return super().embed_one(" ".join(text.split()[: self.window]))

    def fits(self, *texts: str) -> bool:
        return all(len(t.split()) <= self.window for t in texts)


def test_a_long_prompt_is_matched_only_exactly(tmp_path: Path) -> None:
    """Before: two prompts that share their head (a document, then two different questions)
    embedded to cosine 1.0 and the first one's answer was served for the second."""
    doc = "Here is our quarterly report on revenue costs and hiring."
    cache = SemanticCache(tmp_path / "w.sqlite3", verifier=None, embedder=WindowEmbedder())
    cache.put(user(doc + " Who wrote it?"), "Ada", **KW)
    assert cache.get(user(doc + " How much did revenue grow?"), **KW) is None
    assert cache.get(user(doc + " Who wrote it?"), **KW).text == "Ada"  # an exact repeat
    cache.put(user("short question here"), "short", **KW)  # texts the model reads whole still match
    assert cache.get(user("Short question here!"), **KW).text == "short"
    assert cache.get(user("question short here"), **KW).text == "short"  # cosine 1.0, not exact
    cache.close()


def test_the_reranker_refuses_pairs_longer_than_it_reads() -> None:
    from hybridllm.cache.reranker import RerankVerifier

    class Reranker:
        info = None

        def logits_and_fits(self, queries, cached, batch_size=1):
            fits = np.array([len(a) + len(b) < 40 for a, b in zip(queries, cached, strict=True)])
            return np.full(len(queries), 10.0), fits

    verifier = RerankVerifier.__new__(RerankVerifier)
    verifier._reranker, verifier._fallback, verifier.stack, verifier.features = Reranker(), None, None, None
    vecs = np.ones((2, 4), dtype=np.float32) / 2
    probs = verifier.predict(["short one", "x" * 30], ["short two", "y" * 30], vecs, vecs)
    assert probs[0] > 0.99 and probs[1] == 0.0


# ---------------------------------------------------------------------- input checks


def test_namespaces_must_be_named(cache: SemanticCache) -> None:
    """Before: namespace="" meant the default namespace, so a tenant whose id was empty read the
    default tenant's answers; a number was silently turned into a name."""
    cache.put(user("What is my balance?"), "default: 10", **KW)
    for bad in ("", 5):
        with pytest.raises(InvalidRequestError, match="namespace"):
            cache.get(user("What is my balance?"), namespace=bad, **KW)
        with pytest.raises(InvalidRequestError, match="namespace"):
            cache.put(user("What is my balance?"), "x", namespace=bad, **KW)
    with pytest.raises(InvalidRequestError, match="namespace"):
        cache.clear(namespace="")
    with pytest.raises(ConfigError, match="namespace"):
        SemanticCache(cache.path, namespace="", verifier=None, embedder=FakeEmbedder())
    assert cache.get(user("What is my balance?"), **KW).text == "default: 10"


def test_answers_and_metadata_are_checked(cache: SemanticCache) -> None:
    """Before: put(..., None) cached the answer "None"; bad metadata raised a bare TypeError."""
    with pytest.raises(InvalidRequestError, match="string"):
        cache.put(user("Q?"), None, **KW)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="JSON"):
        cache.put(user("Q?"), "a", metadata={"when": object()}, **KW)
    with pytest.raises(InvalidRequestError, match="384"):
        cache.put(user("Q?"), "a", embedding=np.ones(3), **KW)
    assert cache.stats()["entries"] == 0


def test_an_empty_question_is_neither_stored_nor_looked_up(cache: SemanticCache) -> None:
    """Before: "" was stored, and "?" or "   " were then served its answer as exact repeats."""
    assert cache.put(user(""), "an answer to nothing", **KW) is None
    assert cache.get(user("   "), **KW) is None and cache.get(user("?"), **KW) is None
    assert cache.stats()["entries"] == 0


def test_an_earlier_turn_with_half_an_emoji_keys_its_own_bucket(cache: SemanticCache) -> None:
    """Before: UnicodeEncodeError from hashing the context (only the last turn was checked)."""
    broken = [{"role": "system", "content": "be brief \ud83d"}]
    cache.put(user("Hello there", history=broken), "hi", **KW)
    assert cache.get(user("Hello there", history=broken), **KW).text == "hi"
    assert cache.get(user("Hello there", history=[{"role": "system", "content": "be brief"}]), **KW) is None


# ---------------------------------------------------------------------- stats and bounds


def test_stats_count_live_entries_and_every_lookup_of_the_file(tmp_path: Path, clock: list[float]) -> None:
    """Before: expired entries counted in 'entries' until a put purged them (and 'namespaces'
    disagreed with it), and hits and misses lived only as long as the object, so `hybridllm cache
    stats` (a new process) always said 0 of each."""
    path = tmp_path / "s.sqlite3"
    cache = SemanticCache(path, ttl_s=0.3, verifier=None, embedder=FakeEmbedder())
    cache.put(user("short lived"), "a", **KW)
    cache.put(user("also short lived"), "b", namespace="other", **KW)
    assert cache.get(user("short lived"), **KW) is not None
    assert cache.get(user("never cached"), **KW) is None
    clock[0] += 0.4
    stats = cache.stats()
    assert stats["entries"] == 0 and stats["namespaces"] == {}
    assert (stats["hits"], stats["misses"], stats["total_hits"], stats["total_misses"]) == (1, 1, 1, 1)
    cache.close()
    again = SemanticCache(path, ttl_s=None, verifier=None, embedder=FakeEmbedder())
    assert again.get(user("short lived"), **KW) is not None
    stats = again.stats()
    assert stats["entries"] == 2 and (stats["hits"], stats["total_hits"], stats["total_misses"]) == (1, 2, 1)
    assert again.clear() == 2 and again.stats()["total_hits"] == 0  # a full clear starts over
    again.close()


def test_max_entries_counts_what_other_processes_wrote(tmp_path: Path) -> None:
    path = tmp_path / "m.sqlite3"
    big = SemanticCache(path, max_entries=100, verifier=None, embedder=FakeEmbedder())
    small = SemanticCache(path, max_entries=3, verifier=None, embedder=FakeEmbedder())
    for i in range(5):
        big.put(user(f"question {i} from big"), "b", **KW)
    small.put(user("from small"), "s", **KW)
    assert small.stats()["entries"] == 3 and big.stats()["entries"] == 3
    assert small.get(user("from small"), **KW) is not None
    big.close()
    small.close()


def test_an_answer_with_half_an_emoji_is_stored(cache: SemanticCache) -> None:
    """Before: UnicodeEncodeError from SQLite, so the answer was lost to the cache."""
    cache.put(user("Party?"), "yes \ud83c", **KW)
    assert cache.get(user("Party?"), **KW).text == "yes \ufffd"
