"""Scheduler + BlockManager fuzzed on plain data (no engine, no model, no torch): random add,
abort (waiting, mid-chunk, running, preempted, finished, unknown), step, finish and preemption
under a tiny KV pool, with every invariant checked after every operation (review 17).

A toy KV pool (one token id per slot) stands in for the model: a step writes each computed token
into its slot and reads back every earlier position, so a prefix hit on a rewritten block or a
write past a block table shows up at once. Checked after every operation: free + held == pool
(no leak, no double free), each ref count equals the number of running tables holding the block,
a cached block holds exactly the tokens its hash claims (and its chain hash), ``max_num_seqs`` and
``max_num_batched_tokens`` hold, a preempted sequence keeps its tokens, and every request ends.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from cloud_server.engine.block_manager import BlockManager, chain_hash
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.engine.scheduler import Scheduler
from cloud_server.engine.sequence import Sequence, SequenceStatus
from cloud_server.exceptions import ContextLengthError, InvalidRequestError

_HEADS = [[1, 2, 3, 4, 5, 6, 7, 8], [9] * 8, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8]]


def _next(tokens: list[int]) -> int:
    return (3 * tokens[-1] + len(tokens)) % 11


class Harness:
    def __init__(self, rng: random.Random, *, num_blocks: int, bs: int, max_num_seqs: int,
                 budget: int, watermark: float, prefix: bool, spec: bool) -> None:
        self.bm = BlockManager(num_blocks, bs, enable_prefix_caching=prefix)
        self.sched = Scheduler(self.bm, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                               watermark=watermark)
        self.rng, self.bs, self.spec = rng, bs, spec
        self.kv: list[int | None] = [None] * (num_blocks * bs)
        self.seqs: dict[str, Sequence] = {}
        self.live: set[str] = set()

    # -- the toy model -------------------------------------------------------------------------
    def _slot(self, seq: Sequence, p: int) -> int:
        assert p // self.bs < len(seq.block_table), f"position {p} past the table of {seq!r}"
        return seq.block_table[p // self.bs] * self.bs + p % self.bs

    def step(self) -> None:
        sched, bm = self.sched, self.bm
        before = {s.seq_id: list(s.token_ids) for s in sched.running}
        lookahead = (lambda seq, n: self.rng.choice([0, 1, 3])) if self.spec else None
        out = sched.schedule(lookahead)
        # the batch limits
        assert len(sched.running) <= sched.max_num_seqs
        assert len(out.scheduled) <= sched.max_num_seqs
        assert out.num_tokens <= sched.max_num_batched_tokens
        assert len({i.seq.seq_id for i in out.scheduled}) == len(out.scheduled)
        for seq in out.preempted:  # preemption loses no token and frees the whole table
            assert seq.token_ids == before[seq.seq_id] and not seq.block_table
            assert seq.status is SequenceStatus.WAITING and seq in sched.waiting
        self.check()
        if out.is_empty:
            return
        drafts = {}
        for item in out.scheduled:
            if item.num_spec_slots:  # half the drafts right, half wrong
                t = list(item.seq.token_ids)
                d = []
                for _ in range(self.rng.randint(0, item.num_spec_slots)):
                    nxt = _next(t) if self.rng.random() < 0.5 else (_next(t) + 1) % 11
                    d.append(nxt)
                    t.append(nxt)
                drafts[item.seq.seq_id] = d
        sched.add_drafts(out.scheduled, drafts)
        if self.rng.random() < 0.05:  # the model step failed: the engine rolls back, retries later
            sched.rollback(out.scheduled)
            self.check()
            return
        new_tokens, rejected = {}, {}
        for item in out.scheduled:
            seq, c, n = item.seq, item.seq.num_computed_tokens, item.num_new_tokens
            assert n >= 1 and c + n <= seq.num_tokens, (item, seq)
            for p in range(c, c + n):
                slot, tok = self._slot(seq, p), seq.token_ids[p]
                if bm.ref_counts[slot // self.bs] > 1:  # never rewrite a shared block
                    assert self.kv[slot] == tok, f"{seq!r} overwrites shared block"
                self.kv[slot] = tok
            for p in range(c + n):  # attention reads every earlier position
                assert self.kv[self._slot(seq, p)] == seq.token_ids[p], f"{seq!r} reads a stale slot"
            if item.samples:
                base = seq.num_tokens - item.num_lookahead
                toks = seq.token_ids[:base]
                ok = 0
                for d in seq.token_ids[base:]:
                    if d != _next(toks):
                        break
                    toks = toks + [d]
                    ok += 1
                rejected[seq.seq_id] = item.num_lookahead - ok
                new_tokens[seq.seq_id] = [_next(toks)]
        sched.update(out.scheduled, new_tokens, rejected)
        for item in out.scheduled:  # finish like the engine: max_tokens reached
            seq = item.seq
            if seq.status is SequenceStatus.RUNNING and seq.num_output_tokens >= seq.params.max_tokens:
                del seq.token_ids[seq.num_prompt_tokens + seq.params.max_tokens:]
                sched.finish(seq, "length")
                self.live.discard(seq.request_id)
        self.check()

    # -- invariants ----------------------------------------------------------------------------
    def check(self) -> None:
        bm, sched, bs = self.bm, self.sched, self.bs
        fresh, once, reused = list(bm._fresh), list(bm._evictable), list(bm._evictable_reused)
        free = fresh + once + reused
        assert len(free) == len(set(free)) == bm.num_free_blocks, "a block is free twice"
        held = Counter(b for s in sched.running for b in s.block_table)
        assert not set(free) & set(held), "a block is both free and held"
        assert len(set(free)) + len(held) == bm.num_blocks, "a block leaked"
        for b in range(bm.num_blocks):
            assert bm.ref_counts[b] == held.get(b, 0), (b, bm.ref_counts[b], held.get(b, 0))
        for s in sched.waiting:
            assert not s.block_table and s.status is SequenceStatus.WAITING
        for s in self.seqs.values():
            if s.is_finished:
                assert not s.block_table
        for b in fresh:
            assert bm._block_hash[b] is None
        for b in once + reused:
            assert bm._block_hash[b] is not None
        for h, b in bm._hash_to_block.items():  # a cached block holds what its hash claims
            assert bm._block_hash[b] == h
            assert self.kv[b * bs:(b + 1) * bs] == list(bm._block_tokens[b])
        for b in range(bm.num_blocks):
            h = bm._block_hash[b]
            assert h is None or bm._hash_to_block.get(h) == b
        for s in sched.running:
            assert len(s.block_hashes) <= s.num_computed_tokens // bs
            assert len(s.block_table) >= bm.num_blocks_for(s.num_computed_tokens)
            parent = None
            for i, h in enumerate(s.block_hashes):
                parent = chain_hash(parent, tuple(s.token_ids[i * bs:(i + 1) * bs]))
                assert h == parent
                b = s.block_table[i]
                assert bm._block_hash[b] in (None, h)
                assert self.kv[b * bs:(b + 1) * bs] == s.token_ids[i * bs:(i + 1) * bs]


def _prompt(rng: random.Random, n: int) -> list[int]:
    return (rng.choice(_HEADS) + [rng.randrange(11) for _ in range(n)])[:n]


def _run(seed: int) -> int:
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4])
    num_blocks = rng.randint(2, 12)
    cap = num_blocks * bs  # the engine's max_model_len fits the pool
    h = Harness(rng, num_blocks=num_blocks, bs=bs, max_num_seqs=rng.randint(1, 5),
                budget=rng.choice([1, 2, 3, 5, 8, 24]), watermark=rng.choice([0.0, 0.01, 0.2]),
                prefix=rng.random() < 0.8, spec=rng.random() < 0.3)
    sched = h.sched
    n_added = 0
    for _ in range(250):
        r = rng.random()
        if r < 0.25 and n_added < 25:
            if rng.random() < 0.1:  # a prompt the pool cannot hold: refused, nothing queued
                big = Sequence("big", _prompt(rng, cap + rng.randint(1, 4)), SamplingParams())
                with pytest.raises(ContextLengthError):
                    sched.add(big)
                assert big not in sched.waiting and not big.block_table
                continue
            if cap < 2:
                continue
            n = rng.randint(1, cap - 1)
            seq = Sequence(f"r{n_added}", _prompt(rng, n),
                           SamplingParams(max_tokens=rng.randint(1, cap - n), ignore_eos=True))
            n_added += 1
            sched.add(seq)
            h.seqs[seq.request_id] = seq
            h.live.add(seq.request_id)
        elif r < 0.35 and h.seqs:
            rid = rng.choice([*h.seqs, "unknown"])
            seq = h.seqs.get(rid)
            if seq is not None:
                sched.finish(seq, "abort")
                sched.finish(seq, "abort")  # twice: nothing left to free
                h.live.discard(rid)
        else:
            h.step()
        h.check()
    steps = 0
    while sched.num_unfinished:  # every request ends: none waits for blocks that never come
        h.step()
        steps += 1
        assert steps < 3000, (seed, sched.waiting, sched.running)
    assert not h.live
    assert h.bm.num_free_blocks == h.bm.num_blocks and sum(h.bm.ref_counts) == 0
    return sched.num_preemptions


@pytest.mark.parametrize("chunk", range(4))
def test_random_schedule_keeps_the_pool_exact(chunk):
    preemptions = sum(_run(seed) for seed in range(chunk * 50, chunk * 50 + 50))
    assert preemptions > 0  # the fuzz reaches the preemption paths


def test_a_prompt_the_pool_cannot_hold_is_refused_at_once_not_starved():
    """17 tokens for a pool of 4 blocks of 4: it used to wait at the head of the FCFS queue for
    good, silently, and the short request behind it with it."""
    sched = Scheduler(BlockManager(4, 4), max_num_seqs=4, max_num_batched_tokens=64)
    big = Sequence("big", list(range(17)), SamplingParams(max_tokens=1))
    with pytest.raises(ContextLengthError, match="exceeds the KV pool of 16 tokens") as info:
        sched.add(big)
    assert info.value.param == "prompt"
    assert not sched.waiting and sched.block_manager.num_free_blocks == 4
    fits = Sequence("fits", list(range(16)), SamplingParams(max_tokens=1))  # exactly the pool
    sched.add(fits)
    out = sched.schedule()
    assert [(i.seq.request_id, i.num_new_tokens) for i in out.scheduled] == [("fits", 16)]
    sched.finish(fits, "length")
    assert sched.block_manager.num_free_blocks == 4


def test_an_empty_prompt_is_refused_not_scheduled_with_zero_tokens():
    """It was scheduled with 0 new tokens yet claimed an output: the runner would have sampled
    it from the previous row of the batch (another request's logits)."""
    sched = Scheduler(BlockManager(4, 4), max_num_seqs=4, max_num_batched_tokens=64)
    with pytest.raises(InvalidRequestError, match="the prompt is empty"):
        sched.add(Sequence("empty", [], SamplingParams()))
    assert not sched.waiting and sched.schedule().is_empty
