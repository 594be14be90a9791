"""Prompt-lookup drafting: the tokens that followed the latest earlier occurrence of the longest
suffix of the sequence (``min_n`` to ``max_n`` tokens) are proposed as its next tokens.

Input-grounded tasks (rewrite, fix, extract) copy long spans of their prompt, so the next tokens
are often already written down a few hundred tokens back. No model runs; q is one-hot.
"""

from __future__ import annotations

# how many tokens back the lookup scans: a pure-Python pass per sequence and step, linear in its
# length (about 0.05-0.1 ms at 2,048 tokens, 0.7-1.6 ms at 32,768 on one core), so a long context
# costs a step no more than a short one; a span only further back is never proposed
LOOKUP_WINDOW = 2048


def propose_ngram(
    token_ids: list[int],
    k: int,
    *,
    min_n: int = 2,
    max_n: int = 8,
    window: int = LOOKUP_WINDOW,
    fallback_k: int = 0,
) -> list[int]:
    """Up to ``k`` proposed next tokens for ``token_ids`` (empty when no n-gram matches).

    One backward scan over the last ``window`` tokens: every earlier occurrence i of the last
    token is a match of length n = how many tokens before it also agree with the suffix (at most
    ``max_n``); the longest wins, the latest among equals (code repeats short n-grams such as
    ``    return``, and a longer agreeing context picks the right copy), and it proposes what
    followed it, ``token_ids[i + 1 : i + 1 + k]``, continued with the same period where that runs
    past the end (``[7, 7, 7]`` proposes ``k`` 7s, not one). Without a match of ``min_n`` tokens,
    the latest earlier occurrence of the last token alone proposes up to ``fallback_k`` tokens
    (0: none)."""
    num = len(token_ids)
    if k < 1 or num < 2:
        return []
    last = token_ids[-1]
    best, at = 0, -1
    for i in range(num - 2, max(0, num - 1 - window) - 1, -1):
        if token_ids[i] != last:
            continue
        n = 1
        while n < max_n and n <= i and token_ids[i - n] == token_ids[num - 1 - n]:
            n += 1
        if n > best:
            best, at = n, i
            if n == max_n:
                break
    if best < min_n:
        k = min(k, fallback_k) if best >= 1 else 0
    out = token_ids[at + 1 : at + 1 + k]
    # the copy runs into the end of the sequence (repeated or periodic text such as "====" or
    # "abab"): it goes on with period num - 1 - at, proposal j copies proposal j - period
    period = num - 1 - at
    while 0 < len(out) < k:
        out.append(out[len(out) - period])
    return out
