"""Continuous batching fuzzed on the real engine code around a KV-honest fake model (no torch model).

The fake model keeps a KV pool of its own (one token id per slot). A step writes each computed
token into its slot and predicts from what it *reads back* from the slots of positions 0..p, and
it fails the test at once when a read slot does not hold the sequence's token (a prefix hit on a
block that was reused, a write past a table, a trimmed block still read) or when a step writes a
different token into a block another sequence also holds. So the outputs of a mixed, preempted,
aborted, speculating run can be compared with each request run alone, and every leak or stale
prefix-cache entry shows up as a wrong token or an invariant failure. Thousands of steps a second.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from cloud_server.engine.block_manager import BlockManager
from cloud_server.engine.llm_engine import LLMEngine
from cloud_server.engine.model_runner import StepResult
from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.engine.scheduler import Scheduler
from cloud_server.engine.sequence import SequenceStatus
from cloud_server.engine.spec_decode import SpecDecoder
from cloud_server.engine.spec_decode.draft import DraftProposer

BS = 4
VOCAB = 26  # ids 0..25 decode to 'a'..'z'
GEN = 8  # the fake model emits ids below 8 ('a'..'h'), often in repeating runs
EOS = 7  # 'h' ends a request unless it ignores EOS
MAX_MODEL_LEN = 40


def _next(tokens: list[int]) -> int:
    """The fake model: a function of the last two tokens (so prompt lookup often guesses right)
    and of the context length (so outputs differ from request to request)."""
    a, b = tokens[-1], tokens[-2] if len(tokens) > 1 else 0
    return (3 * a + b + (len(tokens) % 13 == 0)) % GEN


def _draft_next(tokens: list[int]) -> int:
    """The fake draft: the model, wrong whenever the last token is a multiple of 4."""
    t = _next(tokens)
    return (t + 1) % GEN if tokens[-1] % 4 == 0 else t


class _Sampler:
    def release(self, seq_id: int) -> None:
        pass

    def generator(self, *args):  # only sampled requests use it; the fuzz is greedy
        raise AssertionError("greedy fuzz")


class KVFakeRunner:
    """Runs ``ScheduledSeq`` lists like ``ModelRunner.execute``, on a pool of token ids."""

    def __init__(self, bm_of, num_blocks: int, predict=_next, check_shared: bool = True) -> None:
        self.bm_of = bm_of  # () -> the engine's current BlockManager
        self.kv: list[int | None] = [None] * (num_blocks * BS)
        self.predict = predict
        self.check_shared = check_shared
        self.sampler = _Sampler()

    def _slot(self, seq, p: int) -> int:
        assert p // BS < len(seq.block_table), f"position {p} past the block table of {seq!r}"
        return seq.block_table[p // BS] * BS + p % BS

    def execute(self, scheduled, *, return_probs: bool = False) -> StepResult:
        bm = self.bm_of()
        tokens: dict[int, list[int] | BaseException] = {}
        for s in scheduled:
            seq, c, n = s.seq, s.seq.num_computed_tokens, s.num_new_tokens
            assert n >= 1 and c + n <= seq.num_tokens
            for p in range(c, c + n):
                slot, tok = self._slot(seq, p), seq.token_ids[p]
                if self.check_shared and bm.ref_counts[slot // BS] > 1:
                    assert self.kv[slot] == tok, f"{seq!r} overwrites shared block {slot // BS}"
                self.kv[slot] = tok
            outs = []
            for p in range(c + n - s.num_outputs, c + n):
                read = [self.kv[self._slot(seq, q)] for q in range(p + 1)]
                assert read == seq.token_ids[: p + 1], f"stale KV read by {seq!r} at position {p}"
                outs.append(self.predict(read))
            if outs:
                tokens[seq.seq_id] = outs
        return StepResult(tokens)

    def release(self, seq_id: int) -> None:
        pass


class _Tok:
    eos_token_ids = (EOS,)

    @staticmethod
    def decode(ids: list[int]) -> str:
        return "".join(chr(ord("a") + i) for i in ids)


def make_engine(num_blocks: int, *, max_num_seqs: int = 6, budget: int = 24, draft: bool = False,
                prefix_caching: bool = True) -> LLMEngine:
    """An ``LLMEngine`` with every part real (scheduler, block manager, speculative decoder,
    stops, detokenizer) but the model, which is ``KVFakeRunner``."""
    eng = LLMEngine.__new__(LLMEngine)
    eng.tokenizer = _Tok()
    eng.model_config = SimpleNamespace(vocab_size=VOCAB)
    # as LLMEngine's constructor ensures: one max_model_len sequence fits the pool
    eng.max_model_len = max_model_len = min(MAX_MODEL_LEN, num_blocks * BS)
    eng.device = "cpu"
    eng.block_manager = BlockManager(num_blocks, BS, enable_prefix_caching=prefix_caching)
    eng.scheduler = Scheduler(eng.block_manager, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                              max_waiting=1000)
    eng.runner = KVFakeRunner(lambda: eng.block_manager, num_blocks)
    proposer = None
    if draft:  # the draft's pool is indexed by the target's block tables; shared blocks are
        # rewritten with the same tokens there, and a draft row reads only its own positions
        proposer = DraftProposer(KVFakeRunner(lambda: eng.block_manager, num_blocks, _draft_next, False))
    eng.spec = SpecDecoder(method=None, num_speculative_tokens=None, max_model_len=max_model_len,
                           draft=proposer, max_spec_rows=12)
    eng._spec_logged = (float("inf"), 0)
    eng._requests = {}
    eng._steps = eng._last_batch_num_seqs = eng._last_batch_num_tokens = 0
    eng._max_batch_num_seqs = eng._peak_slots = eng._unused_slots_at_peak = 0
    return eng


def check_invariants(eng: LLMEngine) -> None:
    """Block accounting and prefix-cache tables after a step (or an abort)."""
    bm, sch = eng.block_manager, eng.scheduler
    bs = bm.block_size
    holders = [0] * bm.num_blocks
    for seq in sch.running:
        assert seq.status is SequenceStatus.RUNNING
        assert len(seq.block_table) == len(set(seq.block_table))
        for b in seq.block_table:
            holders[b] += 1
        assert bm.num_blocks_for(seq.num_computed_tokens) <= len(seq.block_table)
        assert len(seq.block_hashes) == min(seq.num_computed_tokens // bs, len(seq.block_table))
        for i, h in enumerate(seq.block_hashes):  # a registered block holds this sequence's tokens
            b = seq.block_table[i]
            if bm._block_hash[b] is not None:
                assert bm._block_hash[b] == h
                assert bm._block_tokens[b] == tuple(seq.token_ids[i * bs : (i + 1) * bs])
    for seq in sch.waiting:
        assert seq.status is SequenceStatus.WAITING and not seq.block_table
    assert holders == bm.ref_counts, "a block's ref count differs from the tables that hold it"
    free = [*bm._fresh, *bm._evictable, *bm._evictable_reused]
    assert len(free) == len(set(free)) == bm.num_free_blocks
    assert all(bm.ref_counts[b] == 0 for b in free)
    assert bm.num_free_blocks == sum(1 for r in bm.ref_counts if r == 0)
    assert all(bm._block_hash[b] is None for b in bm._fresh)
    for h, b in bm._hash_to_block.items():
        assert bm._block_hash[b] == h and bm._block_tokens[b] is not None
    assert {s.request_id for s in [*sch.running, *sch.waiting]} == set(eng._requests)
    st = eng.stats()
    assert (st["num_running"], st["num_waiting"]) == (len(sch.running), len(sch.waiting))
    assert len(sch.running) <= sch.max_num_seqs


def _random_request(rng: random.Random, i: int, *, draft: bool, max_len: int):
    n = rng.randint(1, 14)
    # a few shared heads, so prefix hits, and comebacks after preemption, happen
    head = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9, 9], []][rng.randrange(3)]
    prompt = (head + [rng.randrange(VOCAB) for _ in range(n)])[:n]
    if rng.random() < 0.5:
        prompt = head + prompt
    methods = ["none", "ngram"] + (["draft"] if draft else [])
    stop = []
    if rng.random() < 0.3:
        stop = ["".join(chr(ord("a") + rng.randrange(GEN - 1)) for _ in range(rng.randint(1, 3)))]
    params = SamplingParams(
        temperature=0.0,
        max_tokens=min(rng.randint(1, 20), max_len - len(prompt)),
        ignore_eos=rng.random() < 0.5,
        stop=stop,
        speculative_method=rng.choice(methods),
        num_speculative_tokens=rng.choice([None, 1, 3, 5]),
    )
    return f"r{i}", prompt, params


def _alone(prompt, params, *, draft: bool, max_len: int):
    eng = make_engine(64, draft=draft)
    eng.max_model_len = eng.spec.max_model_len = max_len
    (res,) = eng.generate([prompt], params)
    return res.token_ids, res.text, res.finish_reason


def run_fuzz(seed: int, *, num_blocks: int, draft: bool = False, prefix_caching: bool = True,
             num_requests: int = 40):
    rng = random.Random(seed)
    eng = make_engine(num_blocks, draft=draft, prefix_caching=prefix_caching)
    pending = [_random_request(rng, i, draft=draft, max_len=eng.max_model_len) for i in range(num_requests)]
    # abort plan: some before they start, some at a given output count (running or preempted)
    abort_at = {rid: rng.choice([0, 1, 3, 6]) for rid, _, _ in pending if rng.random() < 0.25}
    got = {rid: ([], "") for rid, _, _ in pending}
    finished: dict[str, str | None] = {}
    seen_status: set[tuple[str, str]] = set()
    steps = idle = 0
    while pending or eng.has_unfinished():
        for _ in range(rng.randint(0, 3)):  # arrivals between steps
            if pending:
                eng.add_request(*pending.pop(0))
        for rid, at in list(abort_at.items()):
            req = eng._requests.get(rid)
            if req is not None and req.seq.num_output_tokens >= at and rng.random() < 0.5:
                seen_status.add((rid, "preempted" if req.seq.num_preemptions else req.seq.status.value))
                out = eng.abort(rid)
                assert out is not None and out.finish_reason == "abort"
                finished[rid] = "abort"
                del abort_at[rid]
                check_invariants(eng)
        ran = eng._steps
        outs = eng.step()
        steps += 1
        # a step that schedules nothing happens once after a sequence preempted itself
        idle = 0 if outs or eng._steps > ran or not eng.has_unfinished() else idle + 1
        assert idle < 3, f"seed {seed}: nothing scheduled for {idle} steps: {eng.scheduler.waiting}"
        assert steps < 5000, f"seed {seed}: did not finish"
        for out in outs:
            ids, text = got[out.request_id]
            got[out.request_id] = (ids + out.delta_token_ids, text + out.delta_text)
            if out.finished:
                assert out.request_id not in finished
                finished[out.request_id] = out.finish_reason
        check_invariants(eng)
    bm = eng.block_manager
    assert bm.num_free_blocks == bm.num_blocks and sum(bm.ref_counts) == 0
    assert not eng.scheduler.running and not eng.scheduler.waiting
    return eng, got, finished, seen_status


def _requests(seed: int, n: int, draft: bool, max_len: int):
    rng = random.Random(seed)
    return [_random_request(rng, i, draft=draft, max_len=max_len) for i in range(n)]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("num_blocks,draft,caching", [(8, False, True), (10, True, True), (9, False, False)])
def test_mixed_batches_match_requests_alone(seed, num_blocks, draft, caching):
    eng, got, finished, _ = run_fuzz(seed, num_blocks=num_blocks, draft=draft, prefix_caching=caching)
    for rid, prompt, params in _requests(seed, 40, draft, eng.max_model_len):
        if finished[rid] == "abort":
            continue
        ids, text, reason = _alone(prompt, params, draft=draft, max_len=eng.max_model_len)
        assert (got[rid][0], got[rid][1], finished[rid]) == (ids, text, reason), (seed, rid)


def test_fuzz_reaches_every_abort_state_and_preempts():
    states, preemptions = set(), 0
    for seed in range(12):
        eng, _, _, seen = run_fuzz(seed, num_blocks=8)
        states |= {s for _, s in seen}
        preemptions += eng.scheduler.num_preemptions
    assert {"waiting", "running", "preempted"} <= states
    assert preemptions > 0


def _fail_once(eng, when) -> None:
    """Make the target's forward pass raise once, at the first step ``when(scheduled)`` picks."""
    real, state = eng.runner.execute, {"failed": False}

    def flaky(scheduled, **kw):
        if not state["failed"] and when(scheduled):
            state["failed"] = True
            raise RuntimeError("device lost")
        return real(scheduled, **kw)

    eng.runner.execute = flaky


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_a_failed_step_with_drafts_leaves_the_request_able_to_finish(method):
    """The draft model had counted its drafts' positions as computed when the target's step
    failed; rollback dropped the drafts but not that progress, so every later proposal started
    past the sequence's end and every later step failed."""
    from cloud_server.exceptions import EngineError

    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, speculative_method=method,
                            num_speculative_tokens=3)
    prompt = [1, 2, 3, 4, 5, 6, 1, 2, 3]
    eng = make_engine(16, draft=True)
    ref_ids, _, _ = _alone(prompt, params, draft=True, max_len=eng.max_model_len)
    eng.add_request("a", prompt, params)
    _fail_once(eng, lambda scheduled: any(s.num_lookahead for s in scheduled))
    ids, failures = [], 0
    for _ in range(60):
        if not eng.has_unfinished():
            break
        try:
            for out in eng.step():
                ids += out.delta_token_ids
        except EngineError:
            failures += 1
        check_invariants(eng)
    assert failures == 1
    assert ids == ref_ids
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


def test_generate_that_raises_leaves_no_request_behind():
    """A refused prompt, or a failed step, used to leave the call's other requests in the engine,
    holding KV blocks and computed by the next call."""
    from cloud_server.exceptions import ContextLengthError, EngineError, InvalidRequestError

    eng = make_engine(16)
    params = SamplingParams(temperature=0.0, max_tokens=5)
    with pytest.raises(ContextLengthError):
        eng.generate([[1, 2, 3], [4, 5], [1] * 39], params)  # the third does not fit the window
    assert not eng.has_unfinished() and not eng.scheduler.waiting
    _fail_once(eng, lambda scheduled: any(s.seq.num_output_tokens >= 2 for s in scheduled))
    with pytest.raises(EngineError, match="device lost"):
        eng.generate([[1, 2, 3], [4, 5, 6, 7, 8, 9]], params)
    assert not eng.has_unfinished() and not eng.scheduler.running
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    with pytest.raises(InvalidRequestError, match="2 prompts but 1 SamplingParams"):
        eng.generate([[1], [2]], [params])
    assert not eng.has_unfinished()
    (res,) = eng.generate([[1, 2, 3]], params)  # the engine still serves
    assert len(res.token_ids) == 5 or res.finish_reason == "stop"
