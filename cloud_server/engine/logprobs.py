"""Log-probabilities of the emitted tokens, and when each may be sent.

The runner returns, for each sequence that asks, the raw log-probability rows of its step's output
positions: ``[num_outputs, vocab]``, ``log_softmax`` of the target model's logits. Row j is the
distribution at the position of the step's j-th new token (the accepted drafts, then the target's
own token), so token j's log-probability is ``rows[j, token_j]``: always the target's, also for a
draft token and under sampling (the raw distribution, before temperature, top-k and top-p).

A token's entry goes out with the text it starts: it waits while that text is held back (it may
begin a stop string, or be an incomplete character) and is dropped with text a stop string cuts
away. A stop token (EOS, ``stop_token_ids``) sends no text and gets no entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .text_checkpoint import TextCheckpoint


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)  # N most likely, most likely first
    # (equal log-probabilities: lowest token id first, the lowest ids taking the last places)
    text_offset: int = 0  # where the token's text starts in the completion's text


def token_logprobs(rows: Any, tokens: list[int], top_n: int) -> list[TokenLogprob]:
    """Entries of ``tokens`` from their rows (``rows[j]`` is token j's position): one gather and
    one top-k on the rows' device, then a single copy to the host."""
    import torch

    n = len(tokens)
    if n == 0:
        return []
    lp = rows[:n]  # [n, V]
    ids = torch.tensor(tokens, device=lp.device).unsqueeze(1)  # [n, 1]
    chosen = lp.gather(1, ids).squeeze(1).tolist()  # [n]
    top_vals: list[list[float]] = [[] for _ in range(n)]
    top_ids: list[list[int]] = [[] for _ in range(n)]
    if top_n > 0:
        k = min(top_n, lp.shape[1])
        vals, idx = lp.topk(k, dim=-1)  # [n, N] each, sorted descending
        # ties: topk's order among equal values (and which of them make the cut) is the kernel's;
        # the lowest ids go first, so the same distribution always gives the same list
        num_at_cut = (lp == vals[:, -1:]).sum(dim=-1).tolist()  # tokens tied with the Nth
        top_vals, top_ids = vals.tolist(), idx.tolist()
        for j in range(n):
            pairs = sorted(zip(top_ids[j], top_vals[j], strict=True), key=lambda p: (-p[1], p[0]))
            cut = pairs[-1][1]
            if num_at_cut[j] > sum(v == cut for _, v in pairs):  # more ties than places: lowest ids
                above = [p for p in pairs if p[1] != cut]
                tied = (lp[j] == cut).nonzero().flatten()[: k - len(above)].tolist()
                pairs = above + [(t, cut) for t in tied]
            top_ids[j], top_vals[j] = [p[0] for p in pairs], [p[1] for p in pairs]
    return [
        TokenLogprob(t, c, list(zip(i, v, strict=True)))
        for t, c, i, v in zip(tokens, chosen, top_ids, top_vals, strict=True)
    ]


class TextOffsets:
    """One request's text offsets, token after token, each text read from a checkpoint: the
    decode of the answer's first ids (it ends with a whole character) and its last few ids
    (context). Decoding the whole answer before each token made ``logprobs`` cost the square of
    the answer's length in the engine thread (a 4,000-token answer: tens of seconds).

    The ids only grow (earlier ids never change); offsets are asked for in increasing order."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._checkpoint = TextCheckpoint(decode, byte_runs=True)
        self._last: tuple[int, str] = (0, "")  # the latest prefix decoded (the next token's)

    def offset(self, output_ids: list[int], index: int) -> int:
        """Where token ``index``'s text starts: the length of the complete text before it (an
        incomplete character at the end of that text is still to come, so it counts as this
        token's)."""
        if not index:
            return 0
        before = self._prefix(output_ids, index)
        complete = len(before.rstrip("\ufffd"))
        if complete == len(before):
            return complete
        # A trailing U+FFFD is an incomplete character, or bytes that are none (a stray byte the
        # text keeps as U+FFFD, as the detokenizer sends it): the text with this token tells them
        # apart. The U+FFFDs it keeps, short of its own incomplete end, are text before this token.
        after = self._prefix(output_ids, index + 1)
        end = min(len(before), len(after.rstrip("\ufffd")))
        while complete < end and before[complete] == after[complete]:
            complete += 1
        return complete

    def _prefix(self, ids: list[int], n: int) -> str:
        """The text of ``ids[:n]``, read from the checkpoint, which then moves to ``n``."""
        if n == self._last[0]:
            return self._last[1]
        text = self._checkpoint.decode(ids, n)
        self._last = (n, text)
        self._checkpoint.advance(ids, n, text)
        return text


def text_offset(decode: Callable[[list[int]], str], output_ids: list[int], index: int) -> int:
    """Token ``index``'s offset on its own, read through the tokens before it as the engine reads
    them (``TextOffsets``): an engine request keeps one for all its tokens instead."""
    offsets = TextOffsets(decode)
    for i in range(index):
        offsets.offset(output_ids, i)
    return offsets.offset(output_ids, index)


def release(
    pending: list[TokenLogprob], num_sent_chars: int, *, final: bool, cut: bool
) -> list[TokenLogprob]:
    """Take from ``pending`` the entries whose text has started to go out (``num_sent_chars``
    characters are sent). At the end every remaining entry goes, unless a stop string ``cut`` the
    text: then the entries whose text starts past the cut are dropped."""
    n = 0
    while n < len(pending) and (pending[n].text_offset < num_sent_chars or (final and not cut)):
        n += 1
    out = pending[:n]
    del pending[:n]
    if final:
        pending.clear()
    return out
