"""Failures after the scheduler's update (a tiny random model drafting for itself, no weights).

``BlockManager.mark_draft_ready`` records the draft's full blocks once the update has moved the
sequences on: it is step bookkeeping, so a failure there rolls the step back like one in the
update (the retry gives the same tokens and counters). ``_process_tokens`` turns one request's
new tokens into its output (stops, text, logprobs): a failure there belongs to that request, which
ends with the error and its blocks freed while the step's other outputs go out (retried, the same
tokens would fail the same way). Either raised out of ``step`` before: the sequences had moved on,
the step's outputs were lost (tokens never sent, a finished request's end never seen) and the
caller's next step went on from there.
"""

from __future__ import annotations

import pytest

from cloud_server.exceptions import EngineError

from .test_fuzz_fake_batching8 import BS, check_invariants
from .test_postprocess_retry_review29 import NUM_BLOCKS, _drafting, _engine, _once, _requests


def _check_draft_records(eng) -> None:
    """A block the draft is recorded to hold is one of the sequence's full, computed blocks."""
    bm = eng.block_manager
    for seq in eng.scheduler.running:
        for block in seq.block_table[len(seq.block_hashes):]:
            assert not bm._draft_ready[block], f"{seq!r}: block {block} recorded past its hashes"


def _run(fail=None, abort_after=None):
    """(output ids, finish reason and error per request, errors raised by ``step``, draft
    counters, free blocks at the end), stepping again after a failed step. ``fail(eng)`` installs
    a failure; ``abort_after(eng)`` returns a list that names the requests to abort after a step."""
    eng = _engine()
    assert eng.block_manager.num_free_blocks == NUM_BLOCKS
    for rid, prompt, params in _requests():
        eng.add_request(rid, prompt, params)
    if fail is not None:
        fail(eng)
    to_abort = abort_after(eng) if abort_after is not None else []
    ids: dict[str, list[int]] = {rid: [] for rid, _, _ in _requests()}
    ends: dict[str, tuple[str | None, str | None]] = {}
    errors: list[BaseException] = []
    for _ in range(100):
        if not eng.has_unfinished():
            break
        try:
            for out in eng.step():
                ids[out.request_id] += out.delta_token_ids
                if out.finished:
                    ends[out.request_id] = (out.finish_reason, out.error)
        except Exception as exc:  # the caller steps again (as the async loop's retry does)
            errors.append(exc)
        while to_abort:
            rid = to_abort.pop()
            ends[rid] = (eng.abort(rid).finish_reason, None)
        check_invariants(eng)
        _check_draft_records(eng)
    assert not eng.has_unfinished()
    return ids, ends, errors, eng.spec.stats.snapshot(), eng.block_manager.num_free_blocks


@pytest.fixture(scope="module")
def reference():
    ids, ends, errors, stats, free = _run()
    assert errors == [] and all(len(v) == 10 for v in ids.values())
    assert set(ends.values()) == {("length", None)}
    assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]
    assert free == NUM_BLOCKS
    return ids, stats


def _mark_midway(eng) -> None:
    """``mark_draft_ready`` fails for the second sequence of a drafting step: the first one's
    blocks are recorded, the others' not."""
    real_update, steps = eng.scheduler.update, []

    def update(scheduled, *args, **kw):
        steps.append(scheduled if _drafting(scheduled) else None)
        return real_update(scheduled, *args, **kw)

    eng.scheduler.update = update
    _once(eng.block_manager, "mark_draft_ready", after=False,
          when=lambda seq: steps[-1] is not None and seq is steps[-1][1].seq)


def _mark_after(eng) -> None:
    """``mark_draft_ready`` records a block that the step's update filled, then fails: the
    rollback takes the block back from the sequence's full ones, and the record with it."""
    bm, real, failed = eng.block_manager, eng.block_manager.mark_draft_ready, []
    real_update, full_before = eng.scheduler.update, {}

    def update(scheduled, *args, **kw):
        full_before.clear()
        full_before.update({item.seq.seq_id: item.start[1] // BS for item in scheduled})
        return real_update(scheduled, *args, **kw)

    def mark(seq):
        real(seq)
        filled = seq.block_table[full_before.get(seq.seq_id, 0) : len(seq.block_hashes)]
        if not failed and any(bm._draft_ready[block] for block in filled):
            failed.append(True)
            raise RuntimeError("device lost")

    eng.scheduler.update = update
    bm.mark_draft_ready = mark


@pytest.mark.parametrize("fail", [_mark_midway, _mark_after], ids=["midway", "after"])
def test_a_failed_draft_block_record_rolls_the_step_back(reference, fail):
    ref_ids, ref_stats = reference
    ids, ends, errors, stats, free = _run(fail)
    assert ids == ref_ids  # the same tokens (seeded and greedy), none lost, none twice
    assert len(errors) == 1 and isinstance(errors[0], EngineError)  # it failed, once, as a step
    assert str(errors[0]) == "model step failed: device lost"
    assert set(ends.values()) == {("length", None)}
    assert stats == ref_stats  # the failed step's drafts are not counted
    assert free == NUM_BLOCKS  # every block back


def _nth_output(rid: str, n: int):
    """The first ``_process_tokens`` call of request ``rid`` once it has sent ``n`` tokens."""
    return lambda req, *a, **kw: req.seq.request_id == rid and req.num_sent_tokens >= n


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
@pytest.mark.parametrize("rid", ["ngram", "greedy"])  # seeded sampled, greedy: both draft
def test_a_failed_output_ends_its_request_alone(reference, rid, after):
    """The request ends with the error (the tokens of its failed step unsent); the others answer
    as they do when it is aborted right after that step, and every block comes back."""
    when = _nth_output(rid, 4)

    def abort_after(eng):  # the reference: the same request aborted after the same step
        real, marked, aborts = eng._process_tokens, [], []

        def spy(req, *args, **kw):
            if not marked and when(req):
                marked.append(True)
                aborts.append(req.seq.request_id)
                sent.append(len(req.seq.output_token_ids) - len(args[0]))
            return real(req, *args, **kw)

        eng._process_tokens = spy
        return aborts

    sent: list[int] = []
    want, want_ends, errors, _, free = _run(abort_after=abort_after)
    assert errors == [] and free == NUM_BLOCKS and want_ends[rid] == ("abort", None)
    assert len(sent) == 1 and 4 <= sent[0] < 10
    ids, ends, errors, _, free = _run(lambda eng: _once(eng, "_process_tokens", after=after, when=when))
    others = [r for r in ids if r != rid]
    assert {r: ids[r] for r in others} == {r: want[r] for r in others}  # none of theirs lost
    assert ids[rid] == want[rid][: sent[0]]  # what it sent before the failed step
    assert ends[rid] == ("error", "RuntimeError: device lost")  # a clean end, not a silent one
    assert errors == []  # the step did not fail: the other requests' outputs went out
    assert all(ends[r] == ("length", None) for r in others)
    assert free == NUM_BLOCKS  # its blocks were freed
