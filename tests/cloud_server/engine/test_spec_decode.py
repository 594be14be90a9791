"""Speculative decoding on the real SmolLM2 engine: lossless and leak-free.

1. Greedy identity: 26 input-grounded prompts (every other task on four passages, so later
   prompts hit the prefix cache) run plainly (the 20 greedy ones), then again in one mixed run on
   a KV pool small enough to force preemptions (24 blocks, 8 running at most, so every step
   speculates): half speculate (prompt lookup), a quarter decode plainly, a quarter sample at
   temperature 0.8 with top_k=1 through the rejection path (checked for length only: bf16 logits
   can tie), and 13 more speculating requests are aborted while they run. Every greedy output
   equals its plain one (on CUDA: or parts from it only at a near-tie, see ``_near_tie``), drafts
   were both accepted and rejected, and the pool is entirely free afterwards. On CPU (2026-12-03):
   13 aborts, 6 preemptions, 2,000 prefix-hit tokens, 190 drafts of 274 tokens, 199 accepted (55
   of the drafts sampled rows'); 3,789 model rows in 133 steps. It ran 52 prompts on 40 blocks and
   16 running before: 6,996 rows in 210 steps, 21 preemptions, but only 70 drafts of 75 tokens
   with 6 rejected (at 9 or more decoding rows speculation is off).
2. The rejection rule on the model's own distributions (temperature 0.8, top-k 50, top-p 0.95):
   6,000 verifications with two drafts (up to 18,000 until 300 second tokens are in), 500
   sequences a batch; the first emitted token, and the second one given the first draft was
   accepted, follow the target distribution (chi-square, fixed seed, p > 0.001; the same counts
   against a distribution halfway to the draft's give p < 1e-6, so the test can tell them apart).
3. The draft-model path (its own KV pool on the target's block tables, catch-up, preemption):
   SmolLM2 drafting for itself must give plain greedy output with nearly every draft accepted,
   and still plain output with its head cut to the first 1,024 ids (many drafts rejected).
   Its prefill beside the target and the vocabulary check: ``test_spec_draft_setup_review22.py``.
"""

from __future__ import annotations

import random

import pytest

from .pools import small_pool

pytestmark = pytest.mark.real

PASSAGES = [
    "The library opens at nine on weekdays and at ten on Saturdays. It is closed on Sundays. "
    "Members may borrow up to six books for three weeks; children's books can be renewed twice.",
    "def area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n\n"
    "print(area(3, 4), perimeter(3, 4))",
    "Maria bought 3 notebooks at 2 dollars each and a pen for 1 dollar. She paid with a ten "
    "dollar bill and got change back from the cashier, who also gave her a receipt.",
    "Ravens are large black birds found across the northern hemisphere. They can mimic sounds, "
    "solve puzzles, and remember human faces for years.",
]
TASKS = [
    "Repeat the text exactly.",
    "Copy the first sentence.",
    "Rewrite the text in plain words.",
    "Fix any mistakes in the text.",
    "Extract every number in the text.",
    "Summarize the text.",
    "Repeat the text, then say done.",
    "Copy the last sentence.",
    "List the nouns in the text.",
    "Rewrite the text as a list.",
    "Quote the text.",
    "Extract the key facts.",
    "Echo the text.",
]
MAX_TOKENS = 24


def _prompts(tok) -> list[list[int]]:
    out = []
    for passage in PASSAGES:
        for task in TASKS:
            text = f"Text:\n{passage}\n\nTask: {task}"
            out.append(tok.encode(tok.apply_chat_template([{"role": "user", "content": text}])))
    return out


KINDS = ["ngram", "ngram", "none", "sampled"]  # request i of the mixed run is KINDS[i % 4]


def test_greedy_identity_in_mixed_batches_with_prefix_hits_aborts_and_preemptions(
    smollm2_engine,
):
    from cloud_server.engine.sampling_params import SamplingParams

    prompts = _prompts(smollm2_engine.tokenizer)[::2]  # every other task, all four passages
    assert len(prompts) >= 26
    plain = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, speculative_method="none")
    # the plain reference of the greedy rows only: sampled rows are checked for length alone
    greedy = [i for i in range(len(prompts)) if KINDS[i % 4] != "sampled"]
    outs = smollm2_engine.generate([prompts[i] for i in greedy], plain)
    reference = {i: r.token_ids for i, r in zip(greedy, outs, strict=True)}
    # 8 running at most: every step speculates (the adaptive rule turns it off at 8 of 16 rows
    # decoding), and 24 blocks (384 tokens) for 8 requests of ~110 tokens force preemptions
    with small_pool(smollm2_engine, 24, max_num_seqs=8) as eng:
        _mixed_run(eng, prompts, reference)


def _mixed_run(eng, prompts, reference: dict[int, list[int]]) -> None:
    from cloud_server.engine.sampling_params import SamplingParams
    from cloud_server.engine.spec_decode import SpecStats

    eng.spec.stats = SpecStats()
    rng = random.Random(0)
    live: dict[str, int] = {}
    doomed: dict[str, int] = {}  # aborted once running with this many output tokens
    for i, prompt in enumerate(prompts):
        if i % 2 == 0:  # a speculating request that the client drops mid-flight
            rid = f"x{i}"
            doomed[rid] = 2 + i % 7
            eng.add_request(
                rid,
                prompts[rng.randrange(len(prompts))],
                SamplingParams(
                    temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, speculative_method="ngram"
                ),
            )
        kind = KINDS[i % 4]
        params = SamplingParams(
            temperature=0.8 if kind == "sampled" else 0.0,
            top_k=1,
            max_tokens=MAX_TOKENS,
            ignore_eos=True,
            speculative_method="none" if kind == "none" else "ngram",
            num_speculative_tokens=rng.choice([2, 4, 6]),
        )
        eng.add_request(f"r{i}", prompt, params)
        live[f"r{i}"] = i
    got: dict[str, list[int]] = {rid: [] for rid in live}
    aborted_running = 0
    while eng.has_unfinished():
        for out in eng.step():
            if out.request_id in got:
                got[out.request_id] += out.delta_token_ids
        for rid, at in doomed.items():
            req = eng._requests.get(rid)
            if req is not None and req.seq.num_output_tokens >= at:
                aborted_running += 1
                eng.abort(rid)
    st = eng.spec.stats
    print(f"aborted running {aborted_running}, prefix hits {eng.block_manager.prefix_cache_hits}, "
          f"preemptions {eng.scheduler.num_preemptions}, drafts {st.num_drafts}, draft tokens "
          f"{st.num_draft_tokens}, accepted {st.num_accepted_tokens}")
    assert aborted_running >= 5
    assert eng.block_manager.prefix_cache_hits > 0
    # sampled rows (temperature 0.8, top_k=1) go through the rejection path; they are compared
    # by length only: bf16 logits can tie for the top token, and a tie is a coin flip there
    sampled = {f"r{i}" for i in range(len(prompts)) if KINDS[i % 4] == "sampled"}
    assert all(len(got[rid]) == MAX_TOKENS for rid in sampled)
    greedy = [rid for rid in live if rid not in sampled]
    bad = _mismatches(eng, [prompts[live[r]] for r in greedy], [reference[live[r]] for r in greedy],
                      [got[r] for r in greedy])
    mismatched = [greedy[i] for i in bad]
    assert not mismatched, f"{len(mismatched)} outputs differ from plain decoding: {mismatched}"
    assert eng.scheduler.num_preemptions > 0
    assert 0 < st.num_accepted_tokens < st.num_draft_tokens  # accepted and rejected drafts
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    assert sum(eng.block_manager.ref_counts) == 0


NEAR_TIE = 0.5  # logits; bf16 rounding moves a SmolLM2 logit by about 0.1


def _near_tie(eng, prompt: list[int], plain: list[int], other: list[int]) -> bool:
    """Greedy identity is exact on CPU, where every kernel computes a row the same way in any
    batch. On CUDA, cuBLAS picks its bf16 GEMM kernel by the batch's shape, so a row's logits move
    in the last bits with its neighbours: two decodings of one prompt may part where the top two
    tokens are within rounding of each other, never elsewhere. True when ``other`` leaves
    ``plain`` at such a near-tie: for the runner-up token, within ``NEAR_TIE`` of the top logit."""
    i = next((j for j, (a, b) in enumerate(zip(plain, other, strict=False)) if a != b), None)
    if i is None:
        return len(plain) == len(other)
    top = eng.score(prompt + plain[:i])[-1].float().topk(2)
    return other[i] in top.indices.tolist() and float(top.values[0] - top.values[1]) < NEAR_TIE


def _mismatches(eng, prompts, reference, got) -> list[int]:
    """Indices whose greedy output differs from plain decoding (on CUDA: other than at a near-tie)."""
    bad = [i for i, (r, g) in enumerate(zip(reference, got, strict=True)) if r != g]
    if eng.device.type == "cuda":
        bad = [i for i in bad if not _near_tie(eng, prompts[i], reference[i], got[i])]
    return bad


def _filtered(eng, logits, params):
    out = eng.runner.sampler(logits, [0] * logits.shape[0], [params] * logits.shape[0], return_probs=True)
    return out.probs  # [n, V]


@pytest.mark.parametrize("draft_kind", ["one_hot", "model"])
def test_rejection_sampling_matches_the_target_distribution(smollm2_engine, draft_kind):
    import torch
    from scipy.stats import chisquare

    from cloud_server.engine.sampling_params import SamplingParams
    from cloud_server.engine.spec_decode.rejection import verify_sampled

    eng = smollm2_engine
    tok = eng.tokenizer
    prompt = tok.encode(
        tok.apply_chat_template([{"role": "user", "content": "Write one sentence about the sea."}])
    )
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.95)
    n = len(prompt)
    # the rule runs on CPU tensors here (the draws below use a CPU generator), whatever the device
    p0 = _filtered(eng, eng.score(prompt)[-1:].float(), params)[0].cpu()
    # prompt lookup's draft is a fixed token (q one-hot): the second most likely, often rejected;
    # a draft model's tokens are drawn from its q, so the context for the second check is a
    # likely one (rows whose first draft differs count for the first token only)
    d0 = int(p0.argsort(descending=True)[1 if draft_kind == "one_hot" else 0])
    p1 = _filtered(eng, eng.score(prompt + [d0])[-1:].float(), params)[0]
    d1 = int(p1.argsort(descending=True)[0])
    target = _filtered(eng, eng.score(prompt + [d0, d1])[n - 1 :].float(), params).cpu()  # [3, V]
    gen = torch.Generator().manual_seed(1234)
    draws, chunk = 6000, 500
    if draft_kind == "one_hot":
        q = None
        q_first = torch.zeros_like(p0)
        q_first[d0] = 1.0
    else:  # a draft model's view: the same logits, hotter and wider
        hot = SamplingParams(temperature=1.6, top_k=200)
        q = _filtered(eng, eng.score(prompt + [d0, d1])[n - 1 : n + 1].float(), hot).cpu()  # [2, V]
        q_first = q[0]
    num = torch.full((chunk,), 2)
    bonus = torch.zeros(chunk, dtype=torch.long)
    firsts, seconds = [], []
    # 500 sequences verified per call, as in a step's batch; 6,000 draws, more (up to 18,000) where
    # the device's numerics leave d0 rarer, until 300 second tokens are in (the chi-square's power)
    while len(firsts) < draws or (len(seconds) <= 300 and len(firsts) < 3 * draws):
        if q is None:
            drafts = torch.tensor([[d0, d1]]).expand(chunk, 2)
        else:  # d_i ~ q_i, as a draft model proposes
            drafts = torch.multinomial(q, chunk, replacement=True, generator=gen).T  # [chunk, 2]
        accepted, token = verify_sampled(
            drafts,
            num,
            target.expand(chunk, 3, -1),
            None if q is None else q.expand(chunk, 2, -1),
            bonus,
            torch.rand(chunk, 3, generator=gen),
        )
        first = torch.where(accepted == 0, token, drafts[:, 0])  # the first emitted token
        firsts += first.tolist()
        # the second one, where the first was d0 and accepted (the context target[1] is for)
        second = torch.where(accepted == 1, token, drafts[:, 1])
        seconds += second[(accepted >= 1) & (drafts[:, 0] == d0)].tolist()

    def pvalue(samples: list[int], probs: torch.Tensor) -> float:
        probs = probs.double() / probs.double().sum()
        expected = probs * len(samples)
        bins = [int(i) for i in torch.nonzero(expected >= 5).flatten()]
        counts = torch.bincount(torch.tensor(samples), minlength=probs.numel()).double()
        obs = [float(counts[i]) for i in bins] + [len(samples) - float(counts[bins].sum())]
        exp = [float(expected[i]) for i in bins] + [len(samples) - float(expected[bins].sum())]
        if exp[-1] < 1e-9:
            obs, exp = obs[:-1], exp[:-1]
        return float(chisquare(obs, exp).pvalue)

    assert len(seconds) > 300
    assert pvalue(firsts, target[0]) > 1e-3
    assert pvalue(seconds, target[1]) > 1e-3
    # power: the same counts against a distribution halfway to the draft's are rejected
    assert pvalue(firsts, 0.5 * target[0] + 0.5 * q_first) < 1e-6


def test_draft_model_path_is_lossless_and_leak_free(smollm2_engine):
    from cloud_server.engine.model_runner import ModelRunner
    from cloud_server.engine.sampling_params import SamplingParams
    from cloud_server.engine.spec_decode import SpecStats
    from cloud_server.engine.spec_decode.draft import DraftProposer

    eng = smollm2_engine
    prompts = _prompts(eng.tokenizer)[::7][:6]
    plain = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, speculative_method="none")
    reference = [r.token_ids for r in eng.generate(prompts, plain)]
    with small_pool(eng, 24):  # 24 blocks: 6 requests of ~100 tokens preempt each other
        eng.spec.draft = DraftProposer(
            ModelRunner(  # the same weights, a KV pool of its own
                eng.runner.model,
                eng.model_config,
                num_blocks=24,
                block_size=eng.block_manager.block_size,
                device=eng.device,
                dtype=eng.dtype,
            )
        )
        eng.spec.stats = SpecStats()
        try:
            drafted = SamplingParams(
                temperature=0.0,
                max_tokens=16,
                ignore_eos=True,
                speculative_method="draft",
                num_speculative_tokens=3,
            )
            got = [r.token_ids for r in eng.generate(prompts, drafted)]
            st = eng.spec.stats
            assert not _mismatches(eng, prompts, reference, got)
            assert st.num_drafts > 0 and st.num_accepted_tokens >= 0.9 * st.num_draft_tokens
            assert eng.scheduler.num_preemptions > 0
            assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
        finally:
            eng.spec.draft = None


def test_a_draft_with_a_cut_head_stays_lossless(smollm2_engine):
    """A draft that proposes only ids below 1,024 (``vocab_limit``, the head cut to its first
    rows): greedy output is still the plain one, the draft never proposes an id past the cut,
    and sampled requests go through the rejection rule with q zero past it (no shape error)."""
    from cloud_server.engine.model_runner import ModelRunner
    from cloud_server.engine.sampling_params import SamplingParams
    from cloud_server.engine.spec_decode import SpecStats
    from cloud_server.engine.spec_decode.draft import DraftProposer

    eng, cut = smollm2_engine, 1024
    prompts = _prompts(eng.tokenizer)[::9][:5]
    plain = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, speculative_method="none")
    reference = [r.token_ids for r in eng.generate(prompts, plain)]
    assert any(t >= cut for r in reference for t in r)  # the cut removes tokens the target emits
    runner = ModelRunner(eng.runner.model, eng.model_config, num_blocks=eng.block_manager.num_blocks,
                         block_size=eng.block_manager.block_size, device=eng.device, dtype=eng.dtype,
                         vocab_limit=cut)
    assert runner.head is not None and runner.head.out_features == cut
    proposer = DraftProposer(runner)
    proposed: list[int] = []
    propose = proposer.propose

    def recording(items, blocks=None):
        drafts, probs = propose(items, blocks)
        proposed.extend(t for d in drafts.values() for t in d)
        assert all(p.shape[-1] == cut for p in probs.values())
        return drafts, probs

    proposer.propose = recording  # type: ignore[method-assign]
    eng.spec.draft, eng.spec.stats = proposer, SpecStats()
    try:
        kw = dict(max_tokens=16, ignore_eos=True, speculative_method="draft", num_speculative_tokens=3)
        got = [r.token_ids for r in eng.generate(prompts, SamplingParams(temperature=0.0, **kw))]
        assert not _mismatches(eng, prompts, reference, got)
        assert proposed and max(proposed) < cut
        st = eng.spec.stats
        assert 0 < st.num_accepted_tokens < st.num_draft_tokens  # some drafts fail at the cut
        proposed.clear()
        sampled = eng.generate(prompts, SamplingParams(temperature=0.8, top_k=50, seed=3, **kw))
        assert [len(r.token_ids) for r in sampled] == [16] * len(prompts) and proposed
        assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    finally:
        eng.spec.draft = None


def test_a_draft_reuses_its_keys_of_a_shared_prefix(smollm2_engine):
    """Three prompts on one passage, one after another: the draft prefills the first whole, and
    the next ones only past the blocks they share with it (their prefix hits), and those reused
    draft keys are right: SmolLM2 drafting for itself keeps nearly every draft, and the output is
    the plain one. The draft prefills in the target's prefill step (all but the last prompt
    token), so a first proposal computes two tokens: the last prompt token and the first output."""
    from cloud_server.engine.model_runner import ModelRunner
    from cloud_server.engine.sampling_params import SamplingParams
    from cloud_server.engine.spec_decode import SpecStats
    from cloud_server.engine.spec_decode.draft import DraftProposer

    eng = smollm2_engine
    bs = eng.block_manager.block_size
    prompts = _prompts(eng.tokenizer)[:3]  # one passage, three tasks
    shared = next(i for i, (x, y) in enumerate(zip(prompts[0], prompts[1], strict=False)) if x != y)
    assert shared >= 3 * bs
    plain = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, speculative_method="none")
    reference = [r.token_ids for r in eng.generate(prompts, plain)]
    eng.block_manager.reset_prefix_cache()
    runner = ModelRunner(eng.runner.model, eng.model_config, num_blocks=eng.block_manager.num_blocks,
                         block_size=bs, device=eng.device, dtype=eng.dtype)
    chunks: dict[int, list[int]] = {}  # seq_id -> tokens the draft computes, step by step
    execute = runner.execute

    def recording(step, **kw):
        for s in step:
            chunks.setdefault(s.seq.seq_id, []).append(s.num_new_tokens)
        return execute(step, **kw)

    runner.execute = recording  # type: ignore[method-assign]
    eng.spec.draft, eng.spec.stats = DraftProposer(runner), SpecStats()
    try:
        drafted = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                                 speculative_method="draft", num_speculative_tokens=3)
        got = [eng.generate([p], drafted)[0].token_ids for p in prompts]
        assert not _mismatches(eng, prompts, reference, got)
        st = eng.spec.stats
        assert st.num_drafts > 0 and st.num_accepted_tokens >= 0.9 * st.num_draft_tokens
        # the prefill step: the first prompt but its last token; next: less the shared full blocks
        # (each prompt fits one prefill chunk); then the first proposal's two tokens
        firsts = [c[:2] for c in chunks.values()]
        assert firsts[0] == [len(prompts[0]) - 1, 2]
        for p, c in zip(prompts[1:], firsts[1:], strict=True):
            assert c == [len(p) - 1 - (shared // bs) * bs, 2]
    finally:
        eng.spec.draft = None
