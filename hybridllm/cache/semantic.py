"""SemanticCache: answers repeated and paraphrased questions without serving a wrong answer.

Keying. An entry belongs to a *bucket*: the hash of its namespace, model id, the sampling settings
that change answers (``params_key``) and the conversation context (system prompt and every turn
but the last user turn, plus that turn's ``name`` and its place when turns follow it). Only the
last user turn is embedded and compared, and only within its bucket, so a hit never crosses
tenants, models, users or conversations ("how old is she?" asked in two conversations never
shares an answer). The entry id is a hash of the bucket and the normalized
question: putting the same question twice replaces the answer instead of duplicating it, and an
exact repeat is found without running the embedder.

Sampled answers. The key holds every setting that changes an answer (temperature, top_p, top_k,
min_p, repeat_penalty, presence_penalty, frequency_penalty, seed, max_tokens, stop), so a seeded
request is only ever served its own seed's draw, and an answer drawn with penalties only a request
with the same ones. A penalty at 0 is left out of the key, so the buckets written before the
penalties existed are those of requests without them. A structured request (``response_format``)
keys its own bucket by its grammar's key, so plain and structured answers never meet, and a cached
answer its grammar does not accept (cut short by max_tokens, written by another tool) is passed
over, not served. At temperature > 0 without a seed,
HybridLLM stores the first answer the model was sure of and serves it to later asks with the same
settings: the assistant answers a question once and then repeats itself, which is what a user
asking the same thing twice expects; pass
``cache=False`` (or a seed) for a fresh draw. Unsure answers are never stored: the pipeline skips
an edge answer whose mean token log-probability is below ``cache_min_logprob`` (calibrated by
``python -m bench.cache_floor``), which is how a sampled slip such as "L'Étoile, est la cité de la
France." for "What is the capital of France?" stays out.

A hit: the top ``top_k`` cached questions by cosine in the bucket, at or above the verifier's
``min_similarity``, are scored by the verifier; the best one at or above its threshold is served.
(Expired questions and those the guards below refuse are passed over, not counted in ``top_k``.)
The default verifier is the cross-encoder reranker (:mod:`.reranker`); ``verifier="features"`` is
the lighter feature-based :class:`HitVerifier` (numpy only, no second model, lower recall);
``verifier=None`` falls back to plain cosine at ``min_similarity`` (0.95 by default). The verifier
is told the threshold (``at_least``): the reranker scores each candidate in its own graph run (its
score depends on the pair alone) and skips the run of one that cannot reach the threshold whatever
logit the graph gives, which changes no decision.

Whatever the verifier says, :mod:`.guards` refuses what the models cannot see: code and formulas
are served only on an exact repeat, different numbers, a negation on one side or a question
written in another script never hit, and a text longer than the embedder (or the reranker) reads
is matched only exactly, since its unread tail may hold the question.

Entries expire ``ttl_s`` after they were written; past ``max_entries`` the least recently used
are evicted (on a put, and on opening a file that holds more). Several threads may share one
cache; several processes may share one file (a change committed by another process is picked up
on the next call, by reading the store's change log).
An empty question is never stored nor looked up; an empty (or blank) answer is never stored.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._exceptions import CacheError, ConfigError, HybridLLMError
from .._message_text import check_namespace
from .._paths import cache_dir, setting_path
from .._types import USER_TEXT, grammar_of, is_integer, is_real, private_repr
from ._candidates import _fits
from ._keys import bucket_key, entry_id_for, split_messages
from ._mirror import _Known
from ._verifier_spec import VERIFIER_CHOICES, Verifier, load_verifier  # noqa: F401 - a public name
from ._writes import _Writes
from .embedder import Embedder
from .index import BucketIndex
from .store import CacheStore
from .verifier import is_min_similarity

DEFAULT_FILENAME = "semantic_cache.sqlite3"
COSINE_ONLY_MIN_SIMILARITY = 0.95


@dataclass(frozen=True)
class CacheHit:
    """A cached answer found for a question. Its repr shows the texts' sizes, not the texts."""

    text: str = field(metadata=USER_TEXT)
    similarity: float
    entry_id: str
    created_at: float
    verifier_prob: float | None  # None for an exact repeat or when no verifier is used
    cached_query: str = field(default="", metadata=USER_TEXT)
    metadata: dict | None = None

    __repr__ = private_repr


def _format_check(params_key: dict) -> Callable[[str], bool] | None:
    """A structured request's check of a cached answer (its grammar's ``validate``), None for
    plain text. The key holds the grammar's own key: the normalized format as canonical JSON."""
    key = params_key.get("response_format")
    if not isinstance(key, str):
        return None
    try:
        grammar = grammar_of(json.loads(key))
    except (ValueError, HybridLLMError):  # a key that is no format this core takes: serve nothing
        return lambda text: False
    return (lambda text: False) if grammar is None else grammar.validate  # type: ignore[no-any-return]


def _is_count(x: object) -> bool:
    """An integer >= 1 (a float such as 2.5 would fail later, inside a search)."""
    return is_integer(x) and int(x) >= 1


class SemanticCache(_Writes):
    def __init__(
        self,
        path: str | Path | None = None,
        *,
        namespace: str = "default",
        ttl_s: float | None = 7 * 86400,
        max_entries: int = 10000,
        verifier: Verifier | None | str = "default",
        store_pii: bool = False,
        embedder: Embedder | None = None,
        top_k: int = 5,
        min_similarity: float | None = None,
    ) -> None:
        # "not > 0" refuses NaN too (HYBRIDLLM_CACHE_TTL_S=nan): every entry would read as
        # expired and the cache would silently never hit
        if ttl_s is not None and (not is_real(ttl_s) or not ttl_s > 0):
            raise ConfigError(
                f"ttl_s must be a positive number of seconds or None (no expiry), got {ttl_s!r}"
            )
        if not _is_count(max_entries):
            raise ConfigError(f"max_entries must be an integer of at least 1, got {max_entries!r}")
        if not _is_count(top_k):
            raise ConfigError(f"top_k must be an integer of at least 1, got {top_k!r}")
        check_namespace(namespace, ConfigError)
        if isinstance(verifier, str | Path):
            verifier = load_verifier(verifier)
        self.verifier = verifier
        given = min_similarity is not None  # else the verifier's own, read from its file
        if min_similarity is None:
            min_similarity = verifier.min_similarity if verifier is not None else COSINE_ONLY_MIN_SIMILARITY
        # a cosine lies in [-1, 1]: a value above 1 would silently never hit, NaN let every
        # candidate through (a verifier's own from a damaged file too), and a string raised a
        # bare ValueError
        if not is_min_similarity(min_similarity):
            if given:
                raise ConfigError(
                    f"min_similarity must be a cosine in [-1, 1] or None, got {min_similarity!r}"
                )
            raise ConfigError(
                f"the verifier's min_similarity ({type(verifier).__name__}) must be a cosine in [-1, 1], "
                f"got {min_similarity!r}: train or copy the verifier file again"
            )
        self.min_similarity = float(min_similarity)
        # "~/..." from a config file means the home folder, as `hybridllm cache` reads it; a
        # relative one is made absolute once (the stats and a later client after an os.chdir name
        # this file, not one in the new working folder); a blank one is no path
        self.path = setting_path(path, "cache_path") or cache_dir() / DEFAULT_FILENAME
        self.namespace = namespace
        # plain Python numbers: SQLite binds no numpy integer (np.int64 reached `LIMIT ?`)
        self.ttl_s = float(ttl_s) if ttl_s is not None else None
        self.max_entries = int(max_entries)
        self.store_pii = store_pii
        self.top_k = int(top_k)
        self._embedder = embedder
        self._lock = threading.RLock()
        self._closed = False
        self._store = CacheStore(self.path, dim=embedder.dim if embedder else 384)
        self._index = BucketIndex(self._store.dim)
        self._entries: dict[str, _Known] = {}
        self._hits = self._misses = 0
        self._unsaved = [0, 0]  # hits and misses not yet added to the file's counters
        self._last_purge = 0.0
        self._seq = 0  # the last change of the store's log reflected in the index
        self._seen_version = -1
        self._reload()
        # a file written under a larger max_entries is brought down to this one now, as a put
        # would (expired first, then least recently used): before, the extra entries were served
        # until the next put
        if self._store.count() > self.max_entries:
            try:
                self._enforce_bounds(time.time())
            except CacheError:  # a full or busy file: left as it is, bounded at the next put
                pass

    # ------------------------------------------------------------------ public API

    def get(
        self, messages: list[dict], *, model: str, params_key: dict, namespace: str | None = None,
        embedding: np.ndarray | None = None, exact_checked: bool = False,
    ) -> CacheHit | None:
        """The cached answer for ``messages``, or None (a miss, counted). An exact repeat first,
        then the nearest cached questions, verified. ``embedding``: the question's vector from
        :meth:`embed_query`, when the caller has it. ``exact_checked=True``: the caller has just
        asked :meth:`get_exact` for the same messages and got None, so the exact repeat is not
        looked up a second time (an exact repeat written by another thread or process in between
        is still found among the nearest questions, and verified as any other)."""
        context, query = split_messages(messages)
        bucket = bucket_key(self._namespace(namespace), model, params_key, context)
        valid = _format_check(params_key)
        # a caller's vector is checked as put checks it (put stores no blank question): before, an
        # empty bucket or an exact repeat answered without a look at it, and the next put refused it
        vec = self._vector(query, embedding) if embedding is not None and query.strip() else None
        with self._lock:
            self._check_open()
            if not exact_checked and (hit := self._exact_hit(bucket, query, valid)) is not None:
                return hit
            # nothing to compare, or nothing to ask: skip the embedder
            if not self._index.bucket_size(bucket) or not query.strip():
                return self._miss()
        if vec is None:
            vec = self._vector(query, None)  # outside the lock: the slow part
        with self._lock:
            self._sync()
            # a text longer than the embedder reads was compared by its head only: such a query
            # or cached question is served on an exact repeat only (above)
            found = self._candidates(bucket, query, vec)
            if found and not _fits(self._embedder, query):
                found = []
            if not found:
                return self._miss()
            verifier = self.verifier
            if verifier is None:
                return self._serve(found[0][0], found[0][1], None, valid) or self._miss()
            cached = [self._entries[eid].query for eid, _ in found]
            c_vecs = np.stack([self._index.vector(eid) for eid, _ in found])  # [k, dim]
        # the verifier runs outside the lock, as the embedder does: a reranker pass (tens of ms)
        # would hold every other lookup and write of this cache behind it. What it was given is
        # a copy; an entry deleted or evicted meanwhile is found gone by _serve (a miss), and one
        # written again meanwhile holds the same question (its id is the question's hash)
        q_vecs = np.broadcast_to(vec, c_vecs.shape)
        # at_least: candidates that provably score below the threshold skip the reranker graph
        probs = verifier.predict(
            [query] * len(found), cached, q_vecs, c_vecs, at_least=verifier.threshold
        )
        # a NaN probability is no score (argmax would pick it over a real one), and a hit needs
        # "prob >= threshold" to hold: a NaN threshold (a damaged verifier file) served before
        probs = np.nan_to_num(np.asarray(probs, dtype=np.float64), nan=0.0)
        best = int(np.argmax(probs))
        with self._lock:
            if not probs[best] >= verifier.threshold:
                return self._miss()
            return self._serve(found[best][0], found[best][1], float(probs[best]), valid) or self._miss()

    def get_exact(
        self, messages: list[dict], *, model: str, params_key: dict, namespace: str | None = None
    ) -> CacheHit | None:
        """Only an exact repeat, what :meth:`get` serves first, without the embedder; a miss is
        not counted (the caller goes on to :meth:`get`). ``HybridLLM`` asks this first, so an exact
        repeat is served before the question is embedded, and even when the embedder fails."""
        context, query = split_messages(messages)
        bucket = bucket_key(self._namespace(namespace), model, params_key, context)
        with self._lock:
            return self._exact_hit(bucket, query, _format_check(params_key))

    def _exact_hit(self, bucket: str, query: str,
                   valid: Callable[[str], bool] | None = None) -> CacheHit | None:
        """The entry of this very question, served; None when there is none (no miss counted).
        The caller holds the lock."""
        self._sync()
        exact = entry_id_for(bucket, query)
        if exact in self._entries and self._alive(exact):
            # gone from the file (an older hybridllm, which logs no change, deleted it): not
            # counted here, the caller's lookup goes on and counts one miss, not two
            return self._serve(exact, 1.0, None, valid)
        return None

    def stats(self) -> dict:
        """Live entries (expired ones not counted) per namespace, file size, and lookups: ``hits``
        and ``misses`` of this object, ``total_hits``, ``total_misses`` and ``damaged_entries``
        (rows found damaged and removed) of every process that used the file since it was
        created or cleared."""
        with self._lock:
            self._sync()
            size = sum(p.stat().st_size for p in (self.path, Path(f"{self.path}-wal")) if p.exists())
            lookups = self._hits + self._misses
            not_before = time.time() - self.ttl_s if self.ttl_s is not None else None
            namespaces = self._store.namespaces(not_before=not_before)
            saved_hits, saved_misses = self._store.lookup_counts()
            total_hits, total_misses = saved_hits + self._unsaved[0], saved_misses + self._unsaved[1]
            total = total_hits + total_misses
            return {
                "path": str(self.path),
                "entries": sum(namespaces.values()),
                "namespaces": namespaces,
                "max_entries": self.max_entries,
                "ttl_s": self.ttl_s,
                "size_bytes": size,
                "hits": self._hits,
                "misses": self._misses,
                "hit_rate": self._hits / lookups if lookups else 0.0,
                "total_hits": total_hits,
                "total_misses": total_misses,
                "total_hit_rate": total_hits / total if total else 0.0,
                # rows this object found failing their checksum: each a miss, removed, logged once
                "checksum_failures": self._store.checksum_failures,
                # rows found damaged and removed by every process (the file's count, as total_hits)
                "damaged_entries": self._store.damaged_count(),
                "verifier": "cosine" if self.verifier is None else self.verifier.kind,
                "threshold": None if self.verifier is None else self.verifier.threshold,
                "min_similarity": self.min_similarity,
            }

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if any(self._unsaved):
                try:
                    self._store.add_counts(*self._take_counts())
                except CacheError:  # a read-only or full file: the counts are only statistics
                    pass
            self._store.close()

    def __enter__(self) -> SemanticCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def embed_query(self, messages: list[dict]) -> np.ndarray:
        """The vector of the last user turn, as get/put compute it: pass it back to them (and to
        the router) as ``embedding=`` so one request embeds its question once."""
        return self._embed(split_messages(messages)[1])

    def _miss(self) -> CacheHit | None:
        """Count a miss; returns None, what ``get`` returns for one."""
        self._misses += 1
        self._unsaved[1] += 1
        return None

    def _serve(self, entry_id: str, similarity: float, prob: float | None,
               valid: Callable[[str], bool] | None = None) -> CacheHit | None:
        """The hit, counted; None (no miss counted: the caller's) when the entry is gone, or when
        ``valid`` (a structured request's grammar) refuses its answer."""
        self._check_open()  # closed by another thread while the verifier ran
        entry = self._store.get(entry_id)
        if entry is None:  # deleted since the last sync (by another process, or while verified) or unreadable
            self._forget([entry_id])
            self._drop_unreadable()
            return None
        if valid is not None and not valid(entry.response):  # (cut short, or written by another tool)
            return None
        now = time.time()
        self._hits += 1
        self._unsaved[0] += 1
        try:  # recency for eviction, and the lookup counts; a hit does not need either
            self._store.touch(entry_id, now, counts=self._take_counts())
        except CacheError:
            pass
        return CacheHit(
            text=entry.response,
            similarity=similarity,
            entry_id=entry_id,
            created_at=entry.created_at,
            verifier_prob=prob,
            cached_query=entry.query,
            metadata=entry.metadata,
        )
