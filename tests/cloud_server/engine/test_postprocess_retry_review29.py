"""A step that fails after the forward pass (in speculative verification or in the scheduler's
update) is rolled back like one whose forward pass failed (a tiny random model, no weights).

``verify`` draws a seeded request's acceptance numbers and moves its acceptance state and the
draft counters; ``Scheduler.update`` appends tokens, moves ``num_computed_tokens``, trims blocks
and registers full ones in the prefix cache. A failure there left all of that in place and
escaped ``step`` as it was: the next step ran the unverified drafts as prompt tokens, or drew
other numbers than the same seed without the failure. Stepping again must give the same tokens,
the same counters, and every block back once the requests finish.
"""

from __future__ import annotations

import pytest

from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.engine.spec_decode.draft import DraftProposer
from cloud_server.exceptions import EngineError

from ._tiny_model import tiny_config, tiny_model, tiny_runner, tiny_weights
from .test_fuzz_fake_batching8 import BS, check_invariants, make_engine

NUM_BLOCKS = 24
CFG = tiny_config()


def _runner(model):
    return tiny_runner(model, CFG, num_blocks=NUM_BLOCKS, block_size=BS)


def _engine():
    """The engine's scheduler, block manager and speculative decoder around the tiny model, which
    also drafts for itself (its drafts pass often, so accepted drafts are rolled back too)."""
    model = tiny_model(CFG, tiny_weights(CFG))
    eng = make_engine(NUM_BLOCKS, max_num_seqs=4, budget=32)
    eng.model_config = CFG
    eng.runner = _runner(model)
    eng.spec.draft = DraftProposer(_runner(model))
    return eng


_REPEAT = [5, 9, 5, 9, 5, 9, 5, 9, 5, 9]  # prompt lookup finds drafts in it


def _requests():
    def params(seed, method, temperature=1.0):
        return SamplingParams(temperature=temperature, seed=seed, max_tokens=10, ignore_eos=True,
                              speculative_method=method, num_speculative_tokens=3)

    return [("plain", [1, 2, 3], params(11, "none")),
            ("ngram", _REPEAT, params(12, "ngram")),
            ("draft", [4, 8, 15, 16, 23], params(13, "draft")),
            ("greedy", _REPEAT[:6] + [7], params(None, "ngram", 0.0))]


def _run(fail=None) -> tuple[dict[str, list[int]], list[BaseException], dict, int]:
    """(output ids per request, errors raised by ``step``, draft counters, free blocks at the end),
    stepping again after each failed step; ``fail(eng)`` installs a failure."""
    eng = _engine()
    assert eng.block_manager.num_free_blocks == NUM_BLOCKS
    for rid, prompt, params in _requests():
        eng.add_request(rid, prompt, params)
    if fail is not None:
        fail(eng)
    ids: dict[str, list[int]] = {rid: [] for rid, _, _ in _requests()}
    errors: list[BaseException] = []
    for _ in range(100):
        if not eng.has_unfinished():
            break
        try:
            for out in eng.step():
                ids[out.request_id] += out.delta_token_ids
        except Exception as exc:  # the caller steps again (as the async loop's retry does)
            errors.append(exc)
        check_invariants(eng)
    assert not eng.has_unfinished()
    return ids, errors, eng.spec.stats.snapshot(), eng.block_manager.num_free_blocks


def _once(obj, name: str, *, after: bool, when=lambda *a, **kw: True) -> None:
    """Make ``obj.name`` raise once, on the first call where ``when`` holds: before it does
    anything, or after it did all it does (``after``)."""
    real, failed = getattr(obj, name), []

    def flaky(*args, **kw):
        if failed or not when(*args, **kw):
            return real(*args, **kw)
        failed.append(True)
        if after:
            real(*args, **kw)
        raise RuntimeError("device lost")

    setattr(obj, name, flaky)


def _drafting(scheduled, *args, **kw) -> bool:
    """A step that verifies drafts of two sequences or more (not the first of them)."""
    return sum(1 for s in scheduled if s.num_lookahead) >= 2


def _mid_update(eng) -> None:
    """``BlockManager.commit`` fails for the second sequence of a drafting step: the update has
    moved the first one on, not the others."""
    scheduler, steps = eng.scheduler, []
    real_update = scheduler.update

    def update(scheduled, *args, **kw):
        steps.append(scheduled if _drafting(scheduled) else None)
        return real_update(scheduled, *args, **kw)

    scheduler.update = update
    _once(eng.block_manager, "commit", after=False,
          when=lambda seq: steps[-1] is not None and seq is steps[-1][1].seq)


FAILURES = {
    "verify, before": lambda eng: _once(eng.spec, "verify", after=False, when=_drafting),
    "verify, after": lambda eng: _once(eng.spec, "verify", after=True, when=_drafting),
    "update, after": lambda eng: _once(eng.scheduler, "update", after=True, when=_drafting),
    "update, midway": _mid_update,
}


@pytest.fixture(scope="module")
def reference():
    ids, errors, stats, free = _run()
    assert errors == [] and all(len(v) == 10 for v in ids.values())
    assert stats["spec_decode_num_accepted_tokens"] > 0  # drafts were accepted, and rejected
    assert stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]
    assert free == NUM_BLOCKS
    return ids, stats


@pytest.mark.parametrize("where", list(FAILURES))
def test_a_step_that_fails_after_the_forward_pass_is_rolled_back(reference, where):
    ref_ids, ref_stats = reference
    ids, errors, stats, free = _run(FAILURES[where])
    assert len(errors) == 1  # the failure happened, once
    assert ids == ref_ids  # the same tokens, none twice, no draft taken unverified
    assert free == NUM_BLOCKS  # every block back
    assert stats == ref_stats  # the failed step's drafts are not counted
    assert isinstance(errors[0], EngineError)  # a step failure, the request kept
    assert str(errors[0]) == "model step failed: device lost"


def test_a_rolled_back_update_takes_its_blocks_out_of_the_prefix_cache():
    """An update registers a block filled by accepted drafts; the step then fails and is rolled
    back. The sequence keeps that block, and its retry may accept other drafts (an unseeded
    request) and write their keys there: the prefix cache must not offer it for the old tokens."""
    from cloud_server.engine.block_manager import BlockManager
    from cloud_server.engine.scheduler import Scheduler
    from cloud_server.engine.sequence import Sequence

    bm = BlockManager(8, 4)
    sch = Scheduler(bm, max_num_seqs=2, max_num_batched_tokens=16)
    seq = Sequence("a", [1, 2, 3, 4, 5, 6], SamplingParams(temperature=0.0))
    sch.add(seq)
    sch.update(sch.schedule().scheduled, {seq.seq_id: [7]})  # the prompt: block 0 is cached
    cached = bm.cached_block_hashes()
    assert len(cached) == 1
    step = sch.schedule(lambda s, n: 2).scheduled
    sch.add_drafts(step, {seq.seq_id: [8, 9]})
    sch.update(step, {seq.seq_id: [10]}, {seq.seq_id: 0})  # both drafts pass: block 1 is full
    assert len(bm.cached_block_hashes()) == 2
    sch.rollback(step)
    assert (seq.token_ids, seq.num_computed_tokens) == ([1, 2, 3, 4, 5, 6, 7], 6)
    assert seq.block_table[:1] == [bm._hash_to_block[cached[0]]] and len(seq.block_table) == 2
    assert bm.cached_block_hashes() == cached  # block 1 holds no computed tokens of seq's
    assert len(seq.block_hashes) == 1
