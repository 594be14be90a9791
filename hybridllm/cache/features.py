"""Pair features for the hit verifier: does a cached question ask the same thing as the query?

Cosine alone cannot tell "How do I learn Python?" from "How do I learn Python fast?": the two
embeddings are close while the answers differ. The verifier sees, besides the cosine, what the
embedding vectors disagree on (element-wise ``|a - b|`` and ``a * b``, symmetric in the pair) and
surface signals that embeddings blur: words only one side has, numbers and capitalized names that
differ, negation on one side only, a different question word, the length ratio.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

# words of any script: with ASCII-only words, two different questions in Russian or Chinese had no
# words at all, so every overlap read 1.0 and ``exact_match`` 1.0 (ASCII text splits as before)
_WORD = re.compile(r"[^\W_]+(?:'[^\W\d_]+)?")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_CAPITALIZED = re.compile(r"(?<![.?!]\s)(?<!^)\b[A-Z][a-zA-Z0-9]+")
NEGATIONS = frozenset(
    {"not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "without", "cannot"}
)
QUESTION_WORDS = ("what", "why", "how", "when", "where", "who", "which", "whom", "whose")
STOPWORDS = frozenset(
    "a an the of to in on for and or is are was were be been do does did i you we my your it "
    "that this with as at by from can could should would will what how why when where who which "
    "there their they he she his her me us our its if so than then some any".split()
)

HANDCRAFTED = (
    "cosine",
    "word_jaccard",
    "content_jaccard",
    "content_only_query",
    "content_only_cached",
    "bigram_jaccard",
    "char_trigram_jaccard",
    "number_mismatch",
    "numbers_present",
    "negation_mismatch",
    "capitalized_only_one",
    "capitalized_jaccard",
    "question_word_differs",
    "first_word_differs",
    "log_length_ratio",
    "length_min",
    "exact_match",
    "idf_overlap",
    "idf_max_only_query",
    "idf_max_only_cached",
    "idf_sum_only",
)
NUM_HANDCRAFTED = len(HANDCRAFTED)


class _Parsed:
    """The surface facts of one text, computed once per text."""

    __slots__ = ("words", "first", "squashed", "content", "bigrams", "trigrams", "numbers", "neg", "caps",
                 "qword")

    def __init__(self, text: str) -> None:
        lower = text.lower()
        words = _WORD.findall(lower)
        self.words = set(words)
        self.first = words[:1]
        self.content = {w for w in words if w not in STOPWORDS}
        self.bigrams = set(zip(words, words[1:], strict=False))
        self.squashed = squashed = " ".join(words)
        self.trigrams = {squashed[i : i + 3] for i in range(max(len(squashed) - 2, 0))}
        self.numbers = set(_NUMBER.findall(text))
        self.neg = any(w in NEGATIONS or w.endswith("n't") for w in words)
        self.caps = {m.lower() for m in _CAPITALIZED.findall(text.strip())}
        self.qword = next((w for w in words if w in QUESTION_WORDS), "")


def _jaccard(a: set, b: set) -> float:
    union = len(a | b)
    return len(a & b) / union if union else 1.0


class Idf:
    """Inverse document frequency of words, from the training questions (rare words matter)."""

    def __init__(self, words: Sequence[str], values: Sequence[float], default: float) -> None:
        self.weights = dict(zip(words, (float(v) for v in values), strict=True))
        self.default = float(default)  # for words never seen in training: as rare as it gets

    @classmethod
    def fit(cls, texts: Sequence[str], *, min_count: int = 2) -> Idf:
        counts: dict[str, int] = {}
        for text in texts:
            for word in set(_WORD.findall(text.lower())):
                counts[word] = counts.get(word, 0) + 1
        n = len(texts)
        kept = sorted(w for w, c in counts.items() if c >= min_count)
        return cls(kept, [np.log(n / counts[w]) for w in kept], np.log(n))

    def __call__(self, word: str) -> float:
        return self.weights.get(word, self.default)


def handcrafted(query: str, cached: str, cosine: float, idf: Idf | None = None) -> list[float]:
    """The :data:`HANDCRAFTED` features of one pair, in that order."""
    return _handcrafted(_Parsed(query), _Parsed(cached), cosine, idf)


def _handcrafted(q: _Parsed, c: _Parsed, cosine: float, idf: Idf | None) -> list[float]:
    weight = idf or (lambda _w: 1.0)
    only_q = [weight(w) for w in q.words - c.words]
    only_c = [weight(w) for w in c.words - q.words]
    union = sum(weight(w) for w in q.words | c.words) or 1.0
    len_q, len_c = max(len(q.words), 1), max(len(c.words), 1)
    return [
        cosine,
        _jaccard(q.words, c.words),
        _jaccard(q.content, c.content),
        float(len(q.content - c.content)),
        float(len(c.content - q.content)),
        _jaccard(q.bigrams, c.bigrams),
        _jaccard(q.trigrams, c.trigrams),
        float(q.numbers != c.numbers),
        float(bool(q.numbers or c.numbers)),
        float(q.neg != c.neg),
        float(len(q.caps ^ c.caps)),
        _jaccard(q.caps, c.caps),
        float(q.qword != c.qword),
        float(q.first != c.first),
        float(np.log(len_q / len_c)),
        float(np.log(min(len_q, len_c))),
        float(q.squashed == c.squashed),
        1.0 - (sum(only_q) + sum(only_c)) / union,
        max(only_q, default=0.0),
        max(only_c, default=0.0),
        sum(only_q) + sum(only_c),
    ]


def pair_features(
    queries: Sequence[str],
    cached: Sequence[str],
    q_vecs: np.ndarray,
    c_vecs: np.ndarray,
    idf: Idf | None = None,
) -> np.ndarray:
    """Features of each (query, cached) pair: ``[n, NUM_HANDCRAFTED + 2 * dim]`` float32.

    ``q_vecs`` and ``c_vecs`` are ``[n, dim]`` unit vectors of the texts.
    """
    if not (len(queries) == len(cached) == len(q_vecs) == len(c_vecs)):
        raise ValueError("pair_features needs as many queries, cached texts and vectors")
    cosines = np.einsum("nd,nd->n", q_vecs, c_vecs)
    # each distinct text parsed once: a lookup pairs one query with every candidate
    parsed: dict[str, _Parsed] = {}

    def parse(text: str) -> _Parsed:
        found = parsed.get(text)
        if found is None:
            found = parsed[text] = _Parsed(text)
        return found

    hand = np.array(
        [
            _handcrafted(parse(q), parse(c), float(s), idf)
            for q, c, s in zip(queries, cached, cosines, strict=True)
        ],
        dtype=np.float32,
    ).reshape(len(queries), NUM_HANDCRAFTED)
    diff = np.abs(q_vecs - c_vecs)  # [n, dim]
    prod = q_vecs * c_vecs  # [n, dim]
    return np.concatenate([hand, diff, prod], axis=1).astype(np.float32)
