"""Prompt-lookup drafting: the tokens that followed the latest earlier match of the sequence's
last n tokens (n from ``max_n`` down to ``min_n``) are proposed as its next tokens.

Input-grounded tasks (rewrite, fix, extract) copy long spans of their prompt, so the next tokens
are often already written down a few hundred tokens back. No model runs; q is one-hot.
"""

from __future__ import annotations


def propose_ngram(
    token_ids: list[int], k: int, *, min_n: int = 2, max_n: int = 4, window: int = 2048
) -> list[int]:
    """Up to ``k`` proposed next tokens for ``token_ids`` (empty when no n-gram matches)."""
    num = len(token_ids)
    if k < 1 or num < min_n + 1:
        return []
    lo = max(0, num - window)
    for n in range(min(max_n, num - 1), min_n - 1, -1):
        suffix = token_ids[num - n :]
        first = suffix[0]
        # the latest start i < num - n with token_ids[i : i + n] == suffix
        for i in range(num - n - 1, lo - 1, -1):
            if token_ids[i] == first and token_ids[i : i + n] == suffix:
                follow = token_ids[i + n : i + n + k]
                if follow:
                    return follow
                break  # a match right at the end proposes nothing; try a shorter n
    return []
