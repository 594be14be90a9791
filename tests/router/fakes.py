"""A text-only router with hand-set weights: longer prompts score higher (no embedder needed)."""

from __future__ import annotations

import numpy as np

from hybridllm.router.classifier import LogisticScorer
from hybridllm.router.features import TEXT_FEATURES
from hybridllm.router.router import Router


def length_router(threshold: float = 0.5, *, pivot_chars: int = 100) -> Router:
    """score = sigmoid(4 * (log1p(chars) - log1p(pivot_chars))): 0.5 at ``pivot_chars``."""
    d = len(TEXT_FEATURES)
    coef = np.zeros(d, dtype=np.float32)
    coef[TEXT_FEATURES.index("log_chars")] = 4.0
    scorer = LogisticScorer(
        mean=np.zeros(d, np.float32), scale=np.ones(d, np.float32), coef=coef,
        intercept=float(-4.0 * np.log1p(pivot_chars)),
    )
    return Router(scorer=scorer, threshold=threshold, use_embedding=False)
