"""Cheap per-request features: text statistics of the last user turn and its MiniLM embedding.

Text features are a fixed, named vector (``TEXT_FEATURES``) computed with a few regexes in under a
millisecond. The embedding (384 floats) comes from the shared ONNX Runtime embedder. Training keeps
the embeddings of whole prompt lists on disk (:mod:`.embedding_cache`, build code).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import numpy as np

EMBEDDING_DIM = 384
EMBEDDER_ID = "minilm-l6-v2-int8"

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_DIGIT = re.compile(r"\d")
_UPPER = re.compile(r"[A-Z]")
_WORD = re.compile(r"\w+", re.UNICODE)
_OPERATOR = re.compile(r"[+\-*/=^<>%×÷≤≥≠√∑∫π]")
_MATH = re.compile(r"\\frac|\\sqrt|\$|\d\s?[x*/^]\s?\d|(?<![\w.])[a-z] ?= ?")
_CODE = re.compile(r"```|#include|[{};]\s*$|\w\(\w*\)|==|!=|->|=>", re.MULTILINE)
_CODE_WORDS = frozenset({"def", "class", "return", "import", "function", "var", "const", "int",
                         "void", "elif", "lambda", "println", "printf", "self", "null", "None"})
_MULTI_STEP_WORDS = frozenset({
    "step", "steps", "first", "then", "finally", "calculate", "compute", "solve", "derive",
    "prove", "estimate", "explain", "justify", "compare", "analyze", "analyse", "evaluate",
    "total", "remaining", "each", "many", "much",
})
_WHY_HOW = frozenset({"why", "how"})
_WHAT_WHICH = frozenset({"what", "which", "who", "whom", "when", "where"})
_IMPERATIVE = frozenset({
    "write", "create", "generate", "implement", "design", "draft", "summarize", "summarise",
    "translate", "list", "give", "describe", "explain", "find", "calculate", "solve", "prove",
})
_NEGATION = frozenset({"not", "except", "false", "incorrect", "least", "never", "cannot"})

TEXT_FEATURES: tuple[str, ...] = (
    "log_chars",
    "log_words",
    "log_lines",
    "digit_frac",
    "log_numbers",
    "operator_density",
    "math_markers",
    "code_markers",
    "multi_step_cues",
    "why_how",
    "what_which",
    "imperative",
    "negation_cues",
    "question_marks",
    "non_ascii_frac",
    "upper_frac",
    "mean_word_len",
)


def text_features(text: str) -> np.ndarray:
    """The named text statistics of one prompt: ``[len(TEXT_FEATURES)]`` float32."""
    n_chars = len(text)
    words = _WORD.findall(text)
    lower = [w.lower() for w in words]
    n_words = len(words)
    denom = max(n_chars, 1)
    multi_step = code_words = why_how = what_which = negation = 0
    for w in lower:
        multi_step += w in _MULTI_STEP_WORDS
        code_words += w in _CODE_WORDS
        why_how += w in _WHY_HOW
        what_which += w in _WHAT_WHICH
        negation += w in _NEGATION
    non_ascii = 0 if text.isascii() else sum(ord(c) > 127 for c in text)
    values = (
        math.log1p(n_chars),
        math.log1p(n_words),
        math.log1p(text.count("\n") + 1 if text else 0),
        len(_DIGIT.findall(text)) / denom,
        math.log1p(len(_NUMBER.findall(text))),
        100.0 * len(_OPERATOR.findall(text)) / denom,
        math.log1p(len(_MATH.findall(text))),
        math.log1p(len(_CODE.findall(text)) + code_words),
        math.log1p(multi_step),
        float(why_how > 0),
        float(what_which > 0),
        float(bool(lower) and lower[0] in _IMPERATIVE),
        math.log1p(negation),
        math.log1p(text.count("?")),
        non_ascii / denom,
        len(_UPPER.findall(text)) / denom,
        (sum(map(len, words)) / n_words) if n_words else 0.0,
    )
    return np.asarray(values, dtype=np.float32)


def text_feature_matrix(texts: Sequence[str]) -> np.ndarray:
    """``[n, len(TEXT_FEATURES)]`` float32."""
    out = np.empty((len(texts), len(TEXT_FEATURES)), dtype=np.float32)
    for i, t in enumerate(texts):
        out[i] = text_features(t)
    return out


def embed_texts(texts: Sequence[str], progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """``[n, 384]`` float32 unit vectors from the shared embedder (``progress(done, total)``)."""
    from ..cache.embedder import get_embedder

    return get_embedder().embed(list(texts), progress=progress)


def embed_one(text: str) -> np.ndarray:
    from ..cache.embedder import get_embedder

    return get_embedder().embed_one(text)


def feature_matrix(
    texts: Sequence[str], *, use_embedding: bool, embeddings: np.ndarray | None = None
) -> np.ndarray:
    """Text features, then (if ``use_embedding``) the embedding: ``[n, d]`` float32."""
    feats = text_feature_matrix(texts)
    if not use_embedding:
        return feats
    if embeddings is None:
        embeddings = embed_texts(texts)
    return np.concatenate([feats, embeddings.astype(np.float32)], axis=1)
