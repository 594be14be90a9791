"""Token log-probabilities on the real SmolLM2 engine, checked against a separate full forward
pass (``LLMEngine.score``) over prompt + generated tokens: plain, batched with requests that do
not ask, sampled, speculative, cut by a stop string, and across a preemption."""

from __future__ import annotations

import pytest

from ..kernels import engine_kernels

pytestmark = pytest.mark.real


def tol() -> float:
    """How far the same logprob computed in two ways (a speculative step, a plain one, the scorer)
    may be: 0.002 with the engine's kernels; torch's (AVX2-only CPUs) round otherwise, 0.013 apart
    measured there."""
    return 2e-3 if engine_kernels() else 2e-2


def _chat(eng, text: str) -> list[int]:
    tok = eng.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))


def _reference(eng, prompt: list[int], tokens: list[int]):
    """log_softmax of one teacher-forced pass: row i is the distribution of token i + 1."""
    import torch

    return torch.log_softmax(eng.score(prompt + tokens).float(), dim=-1)


def _check_against_score(eng, prompt, tokens, entries, top_n):
    ref = _reference(eng, prompt, tokens)
    assert len(entries) == len(tokens)
    for j, (tok, e) in enumerate(zip(tokens, entries, strict=True)):
        row = ref[len(prompt) + j - 1]
        assert e.token_id == tok
        assert e.logprob == pytest.approx(float(row[tok]), abs=tol()), j
        assert len(e.top) == top_n
        assert [lp for _, lp in e.top] == sorted((lp for _, lp in e.top), reverse=True)
        if top_n:
            best = row.topk(top_n)
            assert e.top[0][1] == pytest.approx(float(best.values[0]), abs=tol())
        assert all(lp <= 0 for _, lp in e.top) and e.logprob <= 0
    return ref


def _sp(**kw):
    from cloud_server.engine.sampling_params import SamplingParams

    return SamplingParams(**kw)


def test_greedy_logprobs_match_a_full_forward_pass(smollm2_engine):
    eng = smollm2_engine
    prompt = _chat(eng, "Name three colours of the rainbow.")
    res = eng.generate([prompt], _sp(temperature=0, max_tokens=12, ignore_eos=True, logprobs=5))[0]
    _check_against_score(eng, prompt, res.token_ids, res.logprobs, 5)
    for e in res.logprobs:  # greedy: the emitted token is the most likely one (bf16 logits may tie)
        assert e.top[0][1] == e.logprob and e.token_id in [t for t, lp in e.top if lp == e.logprob]
    # offsets: where each token's text starts in the answer
    text = eng.tokenizer.decode(res.token_ids)
    assert [e.text_offset for e in res.logprobs] == [
        len(eng.tokenizer.decode(res.token_ids[:j])) for j in range(len(res.token_ids))
    ]
    assert res.text == text


def test_rows_with_and_without_logprobs_in_one_batch(smollm2_engine):
    eng = smollm2_engine
    a, b = _chat(eng, "Say hello."), _chat(eng, "What is two plus two?")
    alone = eng.generate([b], _sp(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0))[0]
    both = eng.generate(
        [a, b, a],
        [_sp(temperature=0, max_tokens=8, ignore_eos=True),
         _sp(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0),
         _sp(temperature=0, max_tokens=8, ignore_eos=True, logprobs=3)],
    )
    assert both[0].logprobs is None
    assert both[1].token_ids == alone.token_ids
    _check_against_score(eng, b, both[1].token_ids, both[1].logprobs, 0)
    _check_against_score(eng, a, both[2].token_ids, both[2].logprobs, 3)


def test_sampled_tokens_report_the_raw_distribution_not_the_tempered_one(smollm2_engine):
    eng = smollm2_engine
    prompt = _chat(eng, "Write a word.")
    res = eng.generate([prompt], _sp(temperature=1.7, top_k=40, max_tokens=10, seed=3, ignore_eos=True,
                                     logprobs=2))[0]
    _check_against_score(eng, prompt, res.token_ids, res.logprobs, 2)


def test_speculative_tokens_get_the_target_models_logprobs(smollm2_engine, monkeypatch):
    """Drafts are the greedy continuation with one wrong token: accepted runs, a rejected draft
    and its correction; every emitted token's entry is the target's at its own position."""
    from cloud_server.engine.spec_decode import decoder

    eng = smollm2_engine
    prompt = _chat(eng, "Count from 1 to 30, separated by commas.")
    params = dict(temperature=0, max_tokens=20, ignore_eos=True, logprobs=2, num_speculative_tokens=8)
    plain = eng.generate([prompt], _sp(**params, speculative_method="none"))[0]
    oracle = prompt + plain.token_ids
    oracle[len(prompt) + 9] = (oracle[len(prompt) + 9] + 1) % 1000  # a draft the target rejects
    monkeypatch.setattr(decoder, "propose_ngram", lambda ids, k, fallback_k: oracle[len(ids) : len(ids) + k])
    before = eng.spec.stats.num_accepted_tokens
    res = eng.generate([prompt], _sp(**params, speculative_method="ngram"))[0]
    assert eng.spec.stats.num_accepted_tokens - before >= 10  # drafts were accepted
    assert res.token_ids == plain.token_ids
    _check_against_score(eng, prompt, res.token_ids, res.logprobs, 2)
    assert [e.logprob for e in res.logprobs] == pytest.approx([e.logprob for e in plain.logprobs], abs=tol())


def test_no_entries_for_text_a_stop_string_cuts_or_for_the_stop_token(smollm2_engine):
    eng = smollm2_engine
    tok = eng.tokenizer
    prompt = _chat(eng, "Count from 1 to 30, separated by commas.")
    ref = eng.generate([prompt], _sp(temperature=0, max_tokens=14, ignore_eos=True))[0]
    # a stop string that starts inside token 6's text, found nowhere earlier
    cut = len(tok.decode(ref.token_ids[:6])) + 1
    stop = next(ref.text[cut : cut + n] for n in range(2, 8) if ref.text.find(ref.text[cut : cut + n]) == cut)
    outs = []
    eng.add_request("lp-stop", prompt, _sp(temperature=0, max_tokens=14, stop=[stop], logprobs=1))
    while eng.has_unfinished():
        outs += eng.step()
    text = "".join(o.delta_text for o in outs)
    assert text == ref.text[:cut] and outs[-1].finish_reason == "stop"
    entries = [e for o in outs for e in (o.logprobs or [])]
    offsets = [len(tok.decode(ref.token_ids[:j])) for j in range(len(ref.token_ids))]
    assert len(entries) == sum(1 for off in offsets if off < cut) == 7  # token 6 is partly sent
    assert [e.token_id for e in entries] == ref.token_ids[: len(entries)]
    # each output carries the entries of the tokens whose text it starts, not more
    sent = 0
    for o in outs:
        sent += len(o.delta_text)
        assert all(e.text_offset < sent for e in o.logprobs or [])
    # an EOS that ends the answer sends no text and gets no entry
    eos = eng.generate([prompt], _sp(temperature=0, max_tokens=3, stop_token_ids=[ref.token_ids[1]],
                                     logprobs=0))[0]
    assert eos.finish_reason == "stop" and len(eos.token_ids) == 2 and len(eos.logprobs) == 1


def test_logprobs_survive_a_preemption(smollm2_engine):
    from cloud_server.engine.scheduler import SchedulerOutput

    eng = smollm2_engine
    prompt = _chat(eng, "Name three colours of the rainbow.")
    params = _sp(temperature=0, max_tokens=10, ignore_eos=True, logprobs=4)
    seq = eng.add_request("lp-preempt", prompt, params)
    outs = []
    for _ in range(4):
        outs += eng.step()
    eng.scheduler._preempt(seq, SchedulerOutput())  # its KV is gone: recomputed from the tokens
    assert seq.num_computed_tokens == 0
    while eng.has_unfinished():
        outs += eng.step()
    tokens = [t for o in outs for t in o.delta_token_ids]
    entries = [e for o in outs for e in (o.logprobs or [])]
    _check_against_score(eng, prompt, tokens, entries, 4)


def test_requests_without_logprobs_compute_none():
    import torch

    from cloud_server.layers.sampler import Sampler, raw_logprobs

    logits = torch.randn(3, 50)
    plain = [_sp(temperature=0)] * 3
    assert raw_logprobs(logits, plain) is None
    assert Sampler()(logits, [0, 1, 2], plain).logprobs is None
    asked = [_sp(temperature=0), _sp(temperature=0, logprobs=2), _sp(temperature=0)]
    got = raw_logprobs(logits, asked)
    assert list(got) == [1]
    assert torch.allclose(got[1], torch.log_softmax(logits[1], dim=-1))


@pytest.mark.parametrize("bad", [-1, 21, True, 1.5])
def test_bad_logprobs_count_is_a_request_error(bad):
    from cloud_server.exceptions import InvalidRequestError

    with pytest.raises(InvalidRequestError) as info:
        _sp(logprobs=bad)
    assert info.value.param == "logprobs"
