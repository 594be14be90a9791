"""A text-only router with hand-set weights: longer prompts score higher (no embedder needed)."""

from __future__ import annotations

import numpy as np

from hybridllm.router.classifier import GainScorer
from hybridllm.router.features import TEXT_FEATURES
from hybridllm.router.router import Router


def length_router(threshold: float = 0.5, *, pivot_chars: int = 100) -> Router:
    """Classes -1 and +1 with logit 4 * (log1p(chars) - log1p(pivot_chars)): the score
    (1 + P(+1) - P(-1)) / 2 equals P(+1), which is 0.5 at ``pivot_chars``."""
    d = len(TEXT_FEATURES)
    coef = np.zeros((2, d), dtype=np.float32)
    coef[1, TEXT_FEATURES.index("log_chars")] = 4.0
    scorer = GainScorer(
        mean=np.zeros(d, np.float32), scale=np.ones(d, np.float32), coef=coef,
        intercept=np.asarray([0.0, -4.0 * np.log1p(pivot_chars)], np.float32),
        classes=np.asarray([-1.0, 1.0], np.float32),  # score = P(+1): 0.5 at the pivot
    )
    return Router(scorer=scorer, threshold=threshold, use_embedding=False)
