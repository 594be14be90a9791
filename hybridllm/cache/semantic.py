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
min_p, repeat_penalty, seed, max_tokens, stop), so a seeded request is only ever served its own
seed's draw. At temperature > 0 without a seed, HybridLLM stores the first answer the model was
sure of and serves it to later asks with the same settings: the assistant answers a question once
and then repeats itself, which is what a user asking the same thing twice expects; pass
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
are served only on an exact repeat, different numbers or a negation on one side never hit, and
a text longer than the embedder (or the reranker) reads is matched only exactly, since its unread
tail may hold the question.

Entries expire ``ttl_s`` after they were written; past ``max_entries`` the least recently used
are evicted (on a put, and on opening a file that holds more). Several threads may share one
cache; several processes may share one file (a change committed by another process is picked up
on the next call, by reading the store's change log).
An empty question is never stored nor looked up; an empty (or blank) answer is never stored.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import warnings
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._exceptions import CacheError, ConfigError, InvalidRequestError
from .._paths import cache_dir
from .._types import USER_TEXT, is_integer, is_real, private_repr
from ..prompts import text_of_content, valid_text
from .embedder import Embedder, get_embedder
from .guards import conflict, exact_key
from .index import BucketIndex
from .reranker import FORMAT as RERANKER_FORMAT
from .reranker import RerankVerifier, get_rerank_verifier
from .store import CacheStore, Entry
from .verifier import HitVerifier, is_min_similarity

log = logging.getLogger("hybridllm.cache")

Verifier = HitVerifier | RerankVerifier
VERIFIER_CHOICES = ("default", "reranker", "features", "cosine")

DEFAULT_FILENAME = "semantic_cache.sqlite3"
COSINE_ONLY_MIN_SIMILARITY = 0.95
_PURGE_EVERY_S = 60.0
_MAX_SCANNED = 64  # rows a lookup ranks at most, skipping expired and refused ones (see _candidates)


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


def load_verifier(spec: str | Path) -> Verifier | None:
    """``"default"``/``"reranker"`` (the shipped cross-encoder), ``"features"`` (the shipped
    feature verifier), ``"cosine"`` (none), or the path of a reranker or feature-verifier file."""
    if spec in ("default", "reranker"):
        return get_rerank_verifier()
    if spec == "features":
        return HitVerifier.load()
    if spec == "cosine":
        return None
    path = Path(spec)
    # a truncated or damaged .npz is a zip error (BadZipFile, zlib's): the file's fault, not ours
    damaged = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)
    try:
        with np.load(path, allow_pickle=False) as data:
            kind = str(data["format"]) if "format" in data.files else ""
    except damaged as exc:
        raise ConfigError(
            f"Cache verifier {spec!r} is neither one of {VERIFIER_CHOICES} nor a readable file: {exc}"
        ) from exc
    if kind == RERANKER_FORMAT:
        return get_rerank_verifier(path)
    try:
        return HitVerifier.load(path)
    except CacheError as exc:
        # a member past the header damaged (HitVerifier.load says CacheError, naming the file): a
        # setting's fault here, as an unreadable file is above
        if isinstance(exc.__cause__, zipfile.BadZipFile | zlib.error | EOFError):
            raise ConfigError(
                f"Cache verifier {spec!r} is damaged ({exc.__cause__}): copy or train it again"
            ) from exc
        raise


def split_messages(messages: list[dict]) -> tuple[list[dict], str]:
    """(context: every message but the last user turn, the last user turn's text)."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages must be a non-empty list of {'role', 'content'} dicts")
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if not isinstance(msg, dict) or "role" not in msg:
            raise InvalidRequestError(f"messages[{i}] must be a dict with a 'role'")
        if msg["role"] == "user":
            context = [_canonical(m) for j, m in enumerate(messages) if j != i]
            if (turn := _turn_key(msg, i, len(messages))) is not None:
                context.append(turn)
            return context, _text_of(msg.get("content"))
    raise InvalidRequestError("messages hold no user turn to look up")


def _turn_key(msg: dict, at: int, total: int) -> dict | None:
    """What the model sees of the last user turn besides its text: its ``name`` ("what is my
    name?" asked by two users) and its place when turns follow it (a greeting before the question
    or an assistant prefill after it). None in the usual case, the question last and unnamed, so
    the buckets of entries written before this key existed stay the same."""
    turn: dict[str, Any] = {}
    if msg.get("name") is not None:
        turn["name"] = msg["name"]
    if at != total - 1:
        turn["at"] = at
    # a key no message holds (those keep role, name and content only): never equal to a turn
    return {"last_user_turn": turn} if turn else None


def _canonical(msg: dict) -> dict:
    return {k: msg[k] for k in ("role", "name", "content") if k in msg}


def _text_of(content: Any) -> str:
    return text_of_content(content, where="the last user turn's content")


def bucket_key(namespace: str, model: str, params_key: dict, context: list[dict]) -> str:
    blob = json.dumps(
        {"ns": namespace, "model": model, "params": params_key, "context": context},
        sort_keys=True,
        ensure_ascii=False,
        default=str,
    )
    # surrogatepass: an earlier turn holding half an emoji keys its own bucket instead of raising
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


def entry_id_for(bucket: str, query: str) -> str:
    key = f"{bucket}\x00{exact_key(query)}"
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]


@dataclass(slots=True)
class _Known:
    """What the index side keeps of an entry (its answer stays in the file)."""

    bucket: str
    query: str
    created_at: float
    # whether the embedder reads the question whole: asked on the entry's first lookup as a
    # candidate, then kept (None until then); a replaced or re-read entry is a new _Known
    fits: bool | None = None


def _is_count(x: object) -> bool:
    """An integer >= 1 (a float such as 2.5 would fail later, inside a search)."""
    return is_integer(x) and int(x) >= 1


def _fits(model: object, *texts: str) -> bool:
    """Whether the embedder reads ``texts`` whole; True for one that cannot tell (a caller's own)."""
    fits = getattr(model, "fits", None)
    return True if fits is None else bool(fits(*texts))


class SemanticCache:
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
        if not isinstance(namespace, str) or not namespace:
            raise ConfigError(f"namespace must be a non-empty string, got {namespace!r}")
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
        # "~/..." from a config file means the home folder, as `hybridllm cache` reads it
        self.path = Path(path).expanduser() if path is not None else cache_dir() / DEFAULT_FILENAME
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
        # a caller's vector is checked as put checks it (put stores no blank question): before, an
        # empty bucket or an exact repeat answered without a look at it, and the next put refused it
        vec = self._vector(query, embedding) if embedding is not None and query.strip() else None
        with self._lock:
            self._check_open()
            if not exact_checked and (hit := self._exact_hit(bucket, query)) is not None:
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
                return self._serve(found[0][0], found[0][1], None) or self._miss()
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
            return self._serve(found[best][0], found[best][1], float(probs[best])) or self._miss()

    def get_exact(
        self, messages: list[dict], *, model: str, params_key: dict, namespace: str | None = None
    ) -> CacheHit | None:
        """Only an exact repeat, what :meth:`get` serves first, without the embedder; a miss is
        not counted (the caller goes on to :meth:`get`). ``HybridLLM`` asks this first, so an exact
        repeat is served before the question is embedded, and even when the embedder fails."""
        context, query = split_messages(messages)
        bucket = bucket_key(self._namespace(namespace), model, params_key, context)
        with self._lock:
            return self._exact_hit(bucket, query)

    def _exact_hit(self, bucket: str, query: str) -> CacheHit | None:
        """The entry of this very question, served; None when there is none (no miss counted).
        The caller holds the lock."""
        self._sync()
        exact = entry_id_for(bucket, query)
        if exact in self._entries and self._alive(exact):
            # gone from the file (an older hybridllm, which logs no change, deleted it): not
            # counted here, the caller's lookup goes on and counts one miss, not two
            return self._serve(exact, 1.0, None)
        return None

    def put(
        self,
        messages: list[dict],
        text: str,
        *,
        model: str,
        params_key: dict,
        namespace: str | None = None,
        pii: bool = False,
        metadata: dict | None = None,
        embedding: np.ndarray | None = None,
    ) -> str | None:
        """Cache ``text`` as the answer; returns the entry id, or None when not stored (PII, an
        empty question, or an empty answer)."""
        if not isinstance(text, str):
            raise InvalidRequestError(f"the answer to cache must be a string, got {type(text).__name__}")
        ns = self._namespace(namespace)
        context, query = split_messages(messages)
        # an empty or blank answer is not stored, as HybridLLM stores none: before, a direct
        # put("") was served as a hit for the question (and its paraphrases) until it expired
        if (pii and not self.store_pii) or not query.strip() or not text.strip():
            return None
        bucket = bucket_key(ns, model, params_key, context)
        entry_id = entry_id_for(bucket, query)
        vec = self._vector(query, embedding)
        try:
            json.dumps(metadata)
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(f"metadata must be JSON-serializable: {exc}") from exc
        now = time.time()
        # an answer holding half an emoji (a stream cut between the two halves of a surrogate
        # pair) cannot be stored as UTF-8: U+FFFD in its place, as a decoder would write
        entry = Entry(entry_id, ns, bucket, query, valid_text(text), vec, now, now, metadata)
        with self._lock:
            self._sync()
            self._store.upsert(entry, counts=self._take_counts())
            self._seen()
            self._index.add(bucket, entry_id, vec)
            self._entries[entry_id] = _Known(bucket, query, now)
            # the entry is committed: a failed eviction (a full disk) must not raise as if it were
            # not (before, put raised and the answer was served anyway); the file stays over
            # max_entries until a later write evicts
            try:
                self._enforce_bounds(now)
            except CacheError as exc:
                log.warning("Stored the answer, but evicting old entries from the cache failed: %s", exc)
        return entry_id

    def delete(self, entry_id: str) -> bool:
        if not isinstance(entry_id, str):  # before: a CacheError "Writing the cache failed: ..."
            raise InvalidRequestError(f"entry_id must be a string, got {type(entry_id).__name__}")
        with self._lock:
            self._sync()
            removed = self._store.delete([entry_id]) > 0
            self._seen()
            self._forget([entry_id])
            return removed

    def clear(self, namespace: str | None = None) -> int:
        """Delete every entry of ``namespace`` (all namespaces, and the file's hit and miss
        counts, when None); returns the count."""
        if namespace is not None:
            namespace = self._namespace(namespace)
        with self._lock:
            self._sync()
            ids = self._store.clear(namespace)
            self._seen()
            self._forget(ids)
            if namespace is None:
                self._unsaved = [0, 0]
            return len(ids)

    def stats(self) -> dict:
        """Live entries (expired ones not counted) per namespace, file size, and lookups: ``hits``
        and ``misses`` of this object, ``total_hits`` and ``total_misses`` of every process that
        used the file since it was created or cleared."""
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

    def _vector(self, query: str, embedding: np.ndarray | None) -> np.ndarray:
        """The question's unit vector: the index compares dot products with ``min_similarity``
        as cosines, so a vector of another length (a caller's own embedder or ``embedding=``
        without normalization) would make unrelated questions pass it."""
        if embedding is None:
            vec = self._embed(query)
        else:
            try:
                raw = np.asarray(embedding)
                # complex values lost their imaginary part in the cast (a warning only), and texts
                # ("0.1", ...) were parsed: neither is a vector of real numbers
                if raw.dtype.kind in "cSU":
                    raise TypeError(f"got dtype {raw.dtype}, not real numbers")
                # squeeze, not reshape(-1): a [1, dim] row is one vector, a [2, dim/2] matrix is not
                vec = np.asarray(raw, dtype=np.float32).squeeze()
            except (TypeError, ValueError) as exc:  # ["a", ...] or a dict: a bare numpy error before
                raise InvalidRequestError(f"the embedding must be a vector of numbers: {exc}") from exc
        if vec.shape != (self._store.dim,):
            raise InvalidRequestError(
                f"the embedding has shape {vec.shape}; this cache holds {self._store.dim}-dim vectors"
            )
        # in float64: a float32 sum of squares overflows (components of 1e20) or underflows to 0
        norm = float(np.linalg.norm(vec.astype(np.float64)))
        if not np.isfinite(norm) or norm == 0.0:
            raise InvalidRequestError("the embedding must be a finite, non-zero vector")
        # the shipped embedder's vectors are unit already: left bit for bit as they are
        return vec if abs(norm - 1.0) <= 1e-3 else vec / np.float32(norm)

    def _embed(self, query: str) -> np.ndarray:
        if self._embedder is None:
            self._embedder = get_embedder()
        return self._embedder.embed_one(query)

    def _namespace(self, namespace: str | None) -> str:
        if namespace is None:
            return self.namespace
        if not isinstance(namespace, str) or not namespace:
            # "" must not mean the default namespace: a tenant named "" would read its answers
            raise InvalidRequestError(f"namespace must be a non-empty string, got {namespace!r}")
        return namespace

    def _miss(self) -> CacheHit | None:
        """Count a miss; returns None, what ``get`` returns for one."""
        self._misses += 1
        self._unsaved[1] += 1
        return None

    def _take_counts(self) -> tuple[int, int]:
        """The unsaved hit and miss counts, handed to a write that adds them to the file. They
        are taken before the write: a write that fails loses them, which only statistics notice."""
        counts = (self._unsaved[0], self._unsaved[1])
        self._unsaved = [0, 0]
        return counts

    def _seen(self) -> None:
        """After our own write: when its changes directly follow the last one we reflect, no
        other process wrote in between, and the log need not be read back (else it is, later)."""
        first, last = self._store.last_logged
        if first == self._seq + 1:
            self._seq = last

    def _fits_whole(self, known: _Known) -> bool:
        """Whether the embedder reads a cached question whole, found out once per entry: a long
        question is tokenized on its first lookup as a candidate, not on every one."""
        if known.fits is None:
            if getattr(self._embedder, "fits", None) is None:
                return True  # no embedder yet (the caller passed vectors), or one that cannot tell
            known.fits = _fits(self._embedder, known.query)
        return known.fits

    def _candidates(self, bucket: str, query: str, vec: np.ndarray) -> list[tuple[str, float]]:
        """The ``top_k`` nearest cached questions at or above ``min_similarity`` that may be
        served (alive, not refused by the guards, read whole by the embedder), best first. The
        caller holds the lock. Before, expired or refused ones took the ``top_k`` slots, so a
        servable question ranked just below them was a miss; now, when the first ``top_k`` rows
        are not enough, one wider search ranks ``_MAX_SCANNED`` (two searches at most)."""
        found: list[tuple[str, float]] = []
        looked: set[str] = set()
        k = self.top_k
        while True:
            ranked = self._index.search(bucket, vec, k)
            for eid, sim in ranked:
                if eid in looked:  # ranked by the first, narrower search
                    continue
                looked.add(eid)
                # best first: none below is close enough (nor a NaN cosine, which compares false)
                if not sim >= self.min_similarity:
                    return found
                known = self._entries[eid]
                if self._alive(eid) and conflict(query, known.query) is None and self._fits_whole(known):
                    found.append((eid, sim))
                    if len(found) == self.top_k:
                        return found
            if len(ranked) < k or k >= _MAX_SCANNED:  # the whole bucket, or enough work done
                return found
            k = _MAX_SCANNED

    def _alive(self, entry_id: str) -> bool:
        if self.ttl_s is None:
            return True
        return self._entries[entry_id].created_at >= time.time() - self.ttl_s

    def _serve(self, entry_id: str, similarity: float, prob: float | None) -> CacheHit | None:
        """The hit, counted; None (no miss counted: the caller's) when the entry is gone."""
        self._check_open()  # closed by another thread while the verifier ran
        entry = self._store.get(entry_id)
        if entry is None:  # deleted since the last sync (by another process, or while verified) or unreadable
            self._forget([entry_id])
            self._drop_unreadable()
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

    def _forget(self, ids: list[str]) -> None:
        for eid in ids:
            self._index.remove(eid)
            self._entries.pop(eid, None)

    def _enforce_bounds(self, now: float) -> None:
        if self.ttl_s is not None and now - self._last_purge >= _PURGE_EVERY_S:
            self._purge_expired(now, self.ttl_s)
        excess = self._store.count() - self.max_entries  # the file's, other processes' entries too
        if excess > 0 and self.ttl_s is not None and self._last_purge != now:
            # expired entries go before live ones: an entry hit just before it expired has a
            # later last_used than a live one never hit since, and LRU alone would evict the
            # live one and keep the dead one
            self._purge_expired(now, self.ttl_s)
            excess = self._store.count() - self.max_entries
        if excess > 0:
            victims = self._store.lru_ids(excess)
            self._store.delete(victims)
            self._seen()
            self._forget(victims)

    def _purge_expired(self, now: float, ttl_s: float) -> None:
        expired = self._store.expired_ids(now - ttl_s)
        self._store.delete(expired)
        self._seen()
        self._forget(expired)
        self._last_purge = now

    def _reload(self) -> None:
        self._seen_version = self._store.data_version()
        self._seq = self._store.last_change()  # before the entries: a change in between is re-read
        self._index.clear()
        self._entries = {}
        not_before = time.time() - self.ttl_s if self.ttl_s is not None else None
        for entry in self._store.iter_entries(not_before=not_before):
            self._add(entry)
        self._drop_unreadable()

    def _drop_unreadable(self) -> None:
        """Delete the rows the store could not read (damaged in the file): the other entries
        stay served. Said in a warning, with a count and no text; a file that cannot be written
        keeps them, skipped on every load."""
        bad = sorted(self._store.unreadable)
        if not bad:
            return
        self._store.unreadable.clear()
        self._forget(bad)
        try:
            self._store.delete(bad)
        except CacheError:
            return
        self._seen()
        warnings.warn(
            f"Removed {len(bad)} damaged entries from the cache {self.path}; the other entries are kept.",
            RuntimeWarning,
            stacklevel=2,
        )

    def _add(self, entry: Entry) -> None:
        self._index.add(entry.bucket, entry.id, entry.embedding)
        self._entries[entry.id] = _Known(entry.bucket, entry.query, entry.created_at)

    def _check_open(self) -> None:
        """Every call that reads the file starts here (through _sync or _serve): before, a closed
        cache raised sqlite3.ProgrammingError."""
        if self._closed:
            raise CacheError(f"The cache {self.path} is closed; open a new SemanticCache.")

    def _sync(self) -> None:
        """Catch up with what other processes committed since we last looked: the entries their
        writes named in the store's change log (everything, when the log cannot tell)."""
        self._check_open()
        version = self._store.data_version()
        if version == self._seen_version:
            return
        self._seen_version = version
        ids, latest = self._store.changes_since(self._seq)
        if ids is None:
            self._reload()
            return
        self._seq = latest
        if not ids:  # only recency or counts were written
            return
        self._forget(ids)
        not_before = time.time() - self.ttl_s if self.ttl_s is not None else None
        for entry in self._store.get_many(ids):
            if not_before is None or entry.created_at >= not_before:
                self._add(entry)
        self._drop_unreadable()
