"""Fold assignment by question for the router's cross-validation: question keys and fold ids."""

from __future__ import annotations

import hashlib
import re
import unicodedata

import numpy as np

_OPERATORS = frozenset("*/%&#@")  # punctuation to Unicode, operators in "6*3", "6/3", "50%"


class _KeyChars(dict):  # type: ignore[type-arg]
    """str.translate's table for question_key, filled as characters are first seen: punctuation
    and control characters to a space, format ones (a zero-width space) to none, the rest kept. One
    translate per prompt in C, not a Python loop over its characters (fold_ids runs per salt)."""

    def __missing__(self, code: int) -> str | int | None:
        c, k = chr(code), unicodedata.category(chr(code))
        self[code] = value = None if k == "Cf" else " " if k[0] in "PC" and c not in _OPERATORS else code
        return value


_KEY_CHARS = _KeyChars()


def question_key(prompt: str) -> str:
    """What copies of one question share: case, punctuation and spacing dropped, symbols kept but
    not the spacing around them ("What is 2+2?", "what is 2 + 2" -> "what is 2 + 2"). A prompt
    of punctuation only keeps its own characters (else "?" and "!!" would be one question)."""
    text = unicodedata.normalize("NFKC", prompt).casefold()
    # punctuation and control characters read as a space, format ones (a zero-width space) as none
    text = text.translate(_KEY_CHARS)
    key = " ".join(re.findall(r"\w+|[^\w\s]", text))  # words and single symbols (+, =, emoji)
    return key or " ".join(prompt.split()).casefold()


def fold_ids(prompts: list[str], num_folds: int, *, salt: str = "") -> np.ndarray:
    """Fold of each prompt from a hash of its text: ``[n]`` ints in ``[0, num_folds)``. Another
    ``salt`` gives another assignment, still by question (``bench.router_cv`` compares them).
    Copies of a question that differ only in case, punctuation or spacing ("Hi", "hi ", "Hi!";
    "2+2", "2 + 2": :func:`question_key`) take the fold of its first copy: in two folds, the
    held-out one had its own twin among the training neighbors. A prompt without such twins
    keeps the fold of its own text (the shipped MMLU file has two pairs, apart by full stops)."""
    out = np.empty(len(prompts), dtype=np.int64)
    first: dict[str, int] = {}
    for i, p in enumerate(prompts):
        fold = int(hashlib.sha1((salt + p).encode("utf-8", "surrogatepass")).hexdigest()[:12], 16) % num_folds
        out[i] = first.setdefault(question_key(p), fold)
    return out
