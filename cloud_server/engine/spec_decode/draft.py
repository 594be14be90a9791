"""Drafting with a smaller model that shares the target's tokenizer.

The draft model has its own KV pool, indexed by the target's block tables (same block ids, same
slots, another tensor), so no second block manager is needed. ``seq.num_draft_computed_tokens``
says how far the draft's cache is filled for a sequence. ``prefill`` fills it chunk by chunk in
the steps that prefill the target (the prompt less the prefix-hit blocks whose draft KV is
already there: ``BlockManager`` tracks them); whatever is still missing when a sequence first
drafts (a busy server skips the early prefill, see ``SpecDecoder.prefill``) is computed by that
proposal, and later ones catch up on the one or two tokens the last verification added. Draft KV
never decides what is emitted (the target verifies every token), so a shared prefix block that
another sequence's draft wrote holds the same keys and values and is simply rewritten.

Per step with k slots: position c (the last, uncomputed token) and then each new draft token is
one draft decode row, all drafting sequences batched; sampled requests draw from the draft's
filtered distribution q (same logit_bias, penalties, temperature, top-k, top-p and min-p, the
penalties counting the drafts before each), kept for the rejection rule.
"""

from __future__ import annotations

from typing import Any

import torch

from ..scheduler import ScheduledSeq
from ..sequence import Sequence


class _DraftView:
    """What the model runner reads of a sequence, at the draft's own progress."""

    def __init__(self, seq: Sequence) -> None:
        self.seq_id = seq.seq_id
        self.params = seq.params
        self.block_table = seq.block_table
        self.token_ids = seq.token_ids[: seq.num_tokens]  # a copy: drafts go here first
        self.num_prompt_tokens = seq.num_prompt_tokens  # penalties count the output after it
        self.num_computed_tokens = seq.num_draft_computed_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class DraftProposer:
    def __init__(self, runner: Any) -> None:
        self.runner = runner  # a ModelRunner over the draft model, sized like the target's pool
        # a seeded request's draft draws from a stream of its own, not the target's (Sampler)
        runner.sampler.stream = 1
        runner.sampler.partial_vocab = True  # a bias past a cut head's ids: a token never proposed

    def propose(
        self, items: list[ScheduledSeq], blocks: Any = None
    ) -> tuple[dict[int, list[int]], dict[int, torch.Tensor]]:
        """Up to ``item.num_spec_slots`` drafts per sequence, and q at each (sampled requests).

        With the engine's ``blocks`` (its BlockManager), a sequence's first proposal starts after
        the prefix-hit blocks whose draft keys another sequence's draft already computed (a shared
        system prompt is prefilled by the draft once, as by the target); the engine records the
        full blocks of final tokens for the sequences that come next, after the step."""
        for it in items:
            self.start(it.seq, blocks)
        views = {it.seq.seq_id: _DraftView(it.seq) for it in items}
        want = {it.seq.seq_id: it.num_spec_slots for it in items}
        drafts: dict[int, list[int]] = {sid: [] for sid in views}
        probs: dict[int, list[torch.Tensor]] = {}
        need_probs = any(not it.seq.params.is_greedy for it in items)
        while True:
            active = [v for sid, v in views.items() if len(drafts[sid]) < want[sid]]
            if not active:
                break
            step = [ScheduledSeq(v, v.num_tokens - v.num_computed_tokens) for v in active]  # type: ignore[arg-type]
            result = self.runner.execute(step, return_probs=need_probs)
            for v, s in zip(active, step, strict=True):
                v.num_computed_tokens += s.num_new_tokens
                out = result.tokens.get(v.seq_id)
                if not isinstance(out, list):  # a row failure: stop drafting for it
                    want[v.seq_id] = len(drafts[v.seq_id])
                    continue
                drafts[v.seq_id].append(out[-1])
                v.token_ids.append(out[-1])
                if need_probs and result.probs is not None:
                    probs.setdefault(v.seq_id, []).append(result.probs[v.seq_id][-1])
        for it in items:  # the draft computed every position but its last draft's
            it.seq.num_draft_computed_tokens = views[it.seq.seq_id].num_computed_tokens
        return drafts, {sid: torch.stack(p) for sid, p in probs.items() if p}

    @staticmethod
    def start(seq: Sequence, blocks: Any = None) -> int:
        """Where the sequence's draft KV ends; a sequence new to the draft starts after the
        prefix-hit blocks whose draft keys are already in the pool (``blocks``: the BlockManager)."""
        if seq.num_draft_computed_tokens == 0 and blocks is not None:
            seq.num_draft_computed_tokens = blocks.draft_cached_tokens(seq)
        return seq.num_draft_computed_tokens

    def prefill(self, chunks: list[tuple[Sequence, int]]) -> None:
        """Fill each sequence's draft KV from ``start`` up to ``end`` (exclusive) in one batched
        step with no outputs: ``end`` stays below ``seq.num_tokens``, so no row reaches the
        sequence's end and nothing is sampled."""
        views = [_DraftView(seq) for seq, _ in chunks]
        pairs = zip(views, chunks, strict=True)
        self.runner.execute([ScheduledSeq(v, end - v.num_computed_tokens) for v, (_, end) in pairs])  # type: ignore[arg-type]
        for seq, end in chunks:
            seq.num_draft_computed_tokens = end

    def release(self, seq_id: int) -> None:
        self.runner.release(seq_id)
