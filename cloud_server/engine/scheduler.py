"""Continuous batching: which sequences run in the next step, and with how many tokens (no torch).

Each step first serves the running sequences in arrival order (one decode token each, or the next
chunk of an unfinished prefill), then admits waiting sequences FCFS with chunked prefill, within
``max_num_seqs`` sequences and ``max_num_batched_tokens`` tokens. When the pool runs out of blocks,
the newest running sequence is preempted: its blocks are freed and it goes back to the front of the
waiting queue, to be recomputed (prompt + outputs so far, mostly from the prefix cache) later.
A waiting sequence starts only when its whole prompt fits (a chunked one too), and while others
run it must leave ``watermark_blocks`` free besides (see ``_can_admit``). A sequence grown past
the whole pool is ended with finish_reason "length" (``SchedulerOutput.finished``), not preempted.

Speculative decoding: ``schedule(lookahead=...)`` reserves draft slots for decoding sequences
(never at the cost of a preemption: a sequence short of blocks just decodes plainly),
``add_drafts`` appends the proposals as the step's trailing tokens, and ``update`` drops the
rejected ones and trims their blocks before anything is hashed into the prefix cache.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..exceptions import ContextLengthError, EngineError, InvalidRequestError, QueueFullError
from .block_manager import BlockManager
from .sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # tokens to compute in this step, from seq.num_computed_tokens on
    num_lookahead: int = 0  # of which trailing speculative tokens, verified by this step
    num_spec_slots: int = 0  # draft slots reserved by schedule(), filled by add_drafts()
    # where the step starts (num_tokens, num_computed_tokens): what ``rollback`` goes back to
    start: tuple[int, int] = field(init=False)

    def __post_init__(self) -> None:
        self.start = (self.seq.num_tokens, self.seq.num_computed_tokens)

    @property
    def samples(self) -> bool:
        """True when this step reaches the sequence's last token, so a new token is sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens

    @property
    def num_outputs(self) -> int:
        """Positions whose next-token output this step returns: the last one plus lookaheads."""
        return 1 + self.num_lookahead if self.samples else 0


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # ended by the scheduler with finish_reason "length": grown past the whole KV pool
    finished: list[Sequence] = field(default_factory=list)
    # waiting sequences started in this step (a first start, or a comeback after a preemption)
    admitted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_waiting: int = 256,
        watermark: float = 0.01,
    ) -> None:
        if not 0.0 <= watermark < 1.0:
            raise EngineError(
                f"the scheduler's watermark is a fraction of the pool in [0, 1), got {watermark!r}"
            )
        self.block_manager = block_manager
        # free blocks a new prefill may not take while others run, so they can still grow: a
        # fraction of the pool (1% by default, as vLLM), rounded up so a tiny pool keeps one block
        self.watermark_blocks = math.ceil(watermark * block_manager.num_blocks)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_waiting = max_waiting
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def num_queued_beyond_slots(self) -> int:
        """Waiting requests that the next step cannot start (a burst that fits the free batch
        slots is not a queue; ``max_waiting`` bounds only what is left over)."""
        free_slots = max(0, self.max_num_seqs - len(self.running))
        return max(0, len(self.waiting) - free_slots)

    def add(self, seq: Sequence) -> None:
        if not seq.token_ids:  # it would be scheduled with 0 tokens yet sample one
            raise InvalidRequestError("the prompt is empty", param="prompt")
        # a prompt the whole pool cannot hold would wait at the head of the FCFS queue for good,
        # and every request behind it with it: refused now (the engine's max_model_len check
        # keeps its requests inside the pool; this guards the scheduler's own callers)
        bm = self.block_manager
        if bm.num_blocks_for(seq.num_tokens) > bm.num_blocks:
            raise ContextLengthError(
                f"the prompt ({seq.num_tokens} tokens) exceeds the KV pool of "
                f"{bm.num_blocks * bm.block_size} tokens",
                param="prompt",
            )
        if self.num_queued_beyond_slots >= self.max_waiting:
            raise QueueFullError(f"the waiting queue is full ({self.max_waiting} requests)")
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def schedule(self, lookahead: Callable[[Sequence, int], int] | None = None) -> SchedulerOutput:
        """``lookahead(seq, num_decoding)``: draft slots wanted by a decoding sequence."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        bm = self.block_manager
        num_decoding = sum(1 for s in self.running if s.num_uncomputed_tokens == 1)
        # blocks drafts may take: what the running sequences' plain steps leave free
        spare = 0
        if lookahead is not None and num_decoding:
            spare = bm.num_free_blocks - sum(
                bm.num_new_blocks_needed(s, min(s.num_uncomputed_tokens, budget)) for s in self.running
            )
        # 1. Running sequences, oldest first; preempt from the newest end when blocks run out.
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if self._past_pool(seq, out):
                continue  # it left self.running: the next one is at i now
            n = min(seq.num_uncomputed_tokens, budget)
            k = 0
            if lookahead is not None and seq.num_uncomputed_tokens == 1:
                k = max(0, min(lookahead(seq, num_decoding), budget - 1))
                # drafts never take a block another sequence's plain step needs: at most the
                # slots of the sequence's own blocks plus the spare ones, and of the block its
                # plain step takes anyway (its next token starts one) while every plain step fits
                own = len(seq.block_table) + (bm.num_new_blocks_needed(seq, 1) if spare >= 0 else 0)
                room = (own + max(0, spare)) * bm.block_size
                k = max(0, min(k, room - seq.num_tokens))
                spare -= bm.num_new_blocks_needed(seq, 1 + k) - bm.num_new_blocks_needed(seq, 1)
            if k:
                bm.append_slots(seq, 1 + k)
                out.scheduled.append(ScheduledSeq(seq, 1, num_spec_slots=k))
                budget -= 1 + k
                i += 1
                continue
            while not bm.can_append(seq, n):
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                break  # seq itself was the newest and got preempted
            bm.append_slots(seq, n)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
            i += 1
        # 2. Waiting sequences, FCFS, only when nothing was preempted in this step.
        while self.waiting and not out.preempted and budget > 0:
            if len(self.running) >= self.max_num_seqs:
                break
            seq = self.waiting[0]
            if self._past_pool(seq, out):
                continue
            if not self._can_admit(seq):
                bm.free(seq)  # blocks it may hold go back; retry next step
                break
            if not seq.block_table:
                cached = bm.allocate_prefix(seq, count=False)
                if seq.num_preemptions == 0:  # a comeback finds its own blocks: not a hit
                    seq.num_cached_tokens = cached
            n = min(seq.num_uncomputed_tokens, budget)
            bm.append_slots(seq, n)
            self.waiting.popleft()
            if seq.num_preemptions == 0:
                # the prefix-cache counters take each request once, at its first admission: the
                # lookups of the steps it waited for blocks, and of a comeback, are not counted,
                # so they agree with its num_cached_tokens (usage.prompt_tokens_details)
                bm.count_prefix_lookup(seq.num_prompt_tokens, seq.num_cached_tokens)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, n))
            out.admitted.append(seq)
            budget -= n
        return out

    def _past_pool(self, seq: Sequence, out: SchedulerOutput) -> bool:
        """End a sequence that has grown past the whole KV pool (finish_reason "length").

        It could never get its next block: preempted, it waited at the head of the queue for good,
        and every request behind it with it. The engine never gets here (its max_model_len fits
        the pool and ends a request at it); this guards the scheduler's own callers, who read
        ``out.finished``."""
        bm = self.block_manager
        if bm.num_blocks_for(seq.num_tokens) <= bm.num_blocks:
            return False
        self.finish(seq, "length")
        out.finished.append(seq)
        return True

    def _can_admit(self, seq: Sequence) -> bool:
        """Whether a waiting sequence may start now.

        Its whole remaining prompt must fit in the free blocks, not only the first chunk of a
        chunked prefill: admitted on its first chunk, a long prompt's later chunks found the pool
        full and preempted it (or the sequences admitted after it), which then recomputed what
        they had. The running ones need nothing beyond this step then: admission runs only while
        the token budget is left, so each of them got all its uncomputed tokens (blocks included).
        While others run, ``watermark_blocks`` more must stay free for their decode tokens:
        without that margin a prefill takes the block a running sequence grows into next, and the
        newcomer is preempted a step or two later. Prefix-cache hits need no free block (they are
        in its table already). Alone it needs no margin, so a request that fits the pool (the
        engine refuses others) always starts once the others are done.
        """
        bm = self.block_manager
        reserve = self.watermark_blocks if self.running else 0
        if not seq.block_table:
            # its cached prefix counted without taking it: a lookup given back when the rest did
            # not fit marked the hit blocks reused and moved them to the newest end of the LRU,
            # so a request that waited, then was aborted, made one-off blocks outlive a shared
            # system prompt
            needed, free = bm.blocks_to_admit(seq)
            return needed + reserve <= free
        return bm.num_new_blocks_needed(seq, seq.num_uncomputed_tokens) + reserve <= bm.num_free_blocks

    def add_drafts(self, scheduled: list[ScheduledSeq], drafts: dict[int, list[int]]) -> None:
        """Append each sequence's proposals (at most its reserved slots) as lookahead tokens."""
        for item in scheduled:
            tokens = drafts.get(item.seq.seq_id, [])[: item.num_spec_slots]
            if tokens:
                item.seq.token_ids.extend(tokens)
                item.num_new_tokens += len(tokens)
                item.num_lookahead = len(tokens)

    def rollback(self, scheduled: list[ScheduledSeq]) -> None:
        """After a failed step: each sequence goes back to where the step started.

        That drops the drafts and the slots reserved for them, and what a failed ``update`` had
        done (tokens appended, computed tokens counted, blocks registered in the prefix cache).
        A draft model's proposal already counted the drafts' positions as in its cache; without
        the drafts those positions are gone, so its progress falls back to the tokens the target
        has (as ``update`` does), or the next proposal would start past the sequence's end.
        """
        bm = self.block_manager
        for item in scheduled:
            seq = item.seq
            num_tokens, seq.num_computed_tokens = item.start
            del seq.token_ids[num_tokens:]
            item.num_new_tokens -= item.num_lookahead
            item.num_lookahead = 0
            seq.num_draft_computed_tokens = min(seq.num_draft_computed_tokens, seq.num_computed_tokens)
            if item.num_spec_slots:
                bm.trim(seq)
            else:
                bm.uncommit(seq)

    def update(
        self,
        scheduled: list[ScheduledSeq],
        new_tokens: dict[int, list[int]],
        num_rejected: dict[int, int] | None = None,
    ) -> list[tuple[Sequence, list[int]]]:
        """Apply a step's results: the one place that moves sequences forward.

        For each scheduled sequence: drop its rejected speculative tokens, count what is now
        computed, give back blocks past it (``trim``), register newly full blocks in the prefix
        cache (``commit``), then append the new tokens. Returns (sequence, tokens it gained:
        accepted drafts, then the new ones) for every sequence that got at least one.
        """
        bm = self.block_manager
        appended: list[tuple[Sequence, list[int]]] = []
        for item in scheduled:
            seq = item.seq
            rejected = (num_rejected or {}).get(seq.seq_id, 0)
            if rejected:
                del seq.token_ids[len(seq.token_ids) - rejected :]
            accepted = (
                seq.token_ids[len(seq.token_ids) - (item.num_lookahead - rejected) :]
                if (item.num_lookahead > rejected)
                else []
            )
            seq.num_computed_tokens = min(seq.num_computed_tokens + item.num_new_tokens, seq.num_tokens)
            seq.num_draft_computed_tokens = min(seq.num_draft_computed_tokens, seq.num_computed_tokens)
            bm.trim(seq)
            bm.commit(seq)
            tokens = accepted + list(new_tokens.get(seq.seq_id) or [])
            if new_tokens.get(seq.seq_id):
                seq.token_ids.extend(new_tokens[seq.seq_id])
            if tokens:
                appended.append((seq, tokens))
        return appended

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence, reason: str) -> None:
        """Remove a sequence (finished or aborted) and return its blocks to the pool at once."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
