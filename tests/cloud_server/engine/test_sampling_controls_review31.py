"""vLLM's and OpenAI's sampling controls in the engine: logit_bias, repetition_penalty,
presence_penalty, frequency_penalty and min_p (a tiny random model, no weights on disk).

Each control changes the tokens as its rule says, checked against a reference computed here from
the model's raw logits (``LLMEngine.score``); speculative decoding (prompt lookup, and the model
drafting for itself) gives the same greedy output as without it, the penalties counting the drafts
before each verified position; log-probabilities stay the raw distribution's; bad values are an
``InvalidRequestError`` naming the parameter. Before, SamplingParams had none of these fields.
"""

from __future__ import annotations

import math

import pytest
import torch

from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.engine.spec_decode.draft import DraftProposer
from cloud_server.exceptions import InvalidRequestError
from cloud_server.layers.sampler import Sampler, TokenHistory

from ._tiny_model import tiny_config, tiny_model, tiny_runner, tiny_weights
from .test_fuzz_fake_batching8 import BS, check_invariants, make_engine

NUM_BLOCKS = 32
CFG = tiny_config()
V = CFG.vocab_size


# -- SamplingParams -------------------------------------------------------------------------------

@pytest.mark.parametrize(("fields", "param"), [
    ({"min_p": 1.5}, "min_p"), ({"min_p": -0.1}, "min_p"), ({"min_p": math.nan}, "min_p"),
    ({"min_p": "0.1"}, "min_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"repetition_penalty": math.inf}, "repetition_penalty"),
    ({"repetition_penalty": None}, "repetition_penalty"),
    ({"presence_penalty": 2.5}, "presence_penalty"), ({"presence_penalty": math.nan}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"), ({"frequency_penalty": True}, "frequency_penalty"),
    ({"logit_bias": [1, 2]}, "logit_bias"), ({"logit_bias": {"5": 1.0}}, "logit_bias"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias"), ({"logit_bias": {5: 101}}, "logit_bias"),
    ({"logit_bias": {5: math.nan}}, "logit_bias"), ({"logit_bias": {i: 1 for i in range(301)}}, "logit_bias"),
])
def test_bad_values_name_their_parameter(fields, param):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**fields)
    assert err.value.param == param


def test_good_values_become_plain_numbers():
    import numpy as np

    p = SamplingParams(min_p=np.float32(0.25), repetition_penalty=2, presence_penalty=-2,
                       frequency_penalty=np.int64(1), logit_bias={np.int64(7): 3, 8: 0})
    assert (p.min_p, p.repetition_penalty, p.presence_penalty, p.frequency_penalty) == (0.25, 2.0, -2.0, 1.0)
    assert all(type(x) is float for x in (p.min_p, p.repetition_penalty, p.frequency_penalty))
    assert p.logit_bias == {7: 3.0} and type(next(iter(p.logit_bias))) is int  # a 0 bias is no bias
    assert p.has_penalties and not SamplingParams().has_penalties


# -- the sampler, row by row ----------------------------------------------------------------------

def _reference(logits: torch.Tensor, p: SamplingParams, context: list[int],
               output: list[int]) -> torch.Tensor:
    """The rules, written out plainly for one row: [V] in, [V] out."""
    x = logits.clone().double()
    for t, b in (p.logit_bias or {}).items():
        x[t] += b
    for t in set(context) | set(output):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(output):
        x[t] -= p.presence_penalty + p.frequency_penalty * output.count(t)
    return x.float()


def test_a_large_bias_forces_its_token_and_a_negative_one_forbids_it():
    torch.manual_seed(0)
    logits = torch.randn(4, V) * 3
    top = logits.argmax(dim=-1)
    params = [SamplingParams(temperature=1.0, logit_bias={17: 100}, seed=1),
              SamplingParams(temperature=0.0, logit_bias={17: 100}),
              SamplingParams(temperature=0.0, logit_bias={int(top[2]): -100}),
              SamplingParams(temperature=0.0)]
    out = Sampler()(logits, [1, 2, 3, 4], params, return_probs=True)
    assert out.tokens[:2] == [17, 17]
    assert out.tokens[2] == int(logits[2].topk(2).indices[1])  # the next most likely
    assert out.tokens[3] == int(top[3])
    assert out.probs[0, 17] > 0.999


def test_a_bias_outside_the_vocabulary_fails_its_row_only():
    logits = torch.randn(2, V)
    out = Sampler()(logits, [1, 2], [SamplingParams(temperature=0.0, logit_bias={V: 5}),
                                     SamplingParams(temperature=0.0)])
    assert isinstance(out.tokens[0], InvalidRequestError) and out.tokens[0].param == "logit_bias"
    assert out.tokens[1] == int(logits[1].argmax())


def test_penalties_follow_the_rule_per_row_with_the_raw_logprobs_kept():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, V, generator=g) * 4
    ids = torch.randint(0, V, (30,), generator=g).tolist()
    top = logits.argmax(dim=-1).tolist()
    ids[12], ids[11], ids[3] = top[0], top[1], top[3]  # in row 0's output, row 1's, row 3's prompt
    hist = [TokenHistory(ids, 10, 10 + j) for j in (20, 5, 12, 0, 20)]
    params = [SamplingParams(temperature=0.0, repetition_penalty=3.0, logprobs=1),
              SamplingParams(temperature=0.0, presence_penalty=2.0, frequency_penalty=1.5),
              SamplingParams(temperature=0.7, frequency_penalty=-2.0, repetition_penalty=0.5, seed=4),
              SamplingParams(temperature=0.0, repetition_penalty=4.0, presence_penalty=2.0),
              SamplingParams(temperature=0.0)]
    out = Sampler()(logits, [1, 2, 3, 4, 5], params, return_probs=True, histories=hist)
    for i, (p, h) in enumerate(zip(params, hist, strict=True)):
        ref = _reference(logits[i], p, ids[: h.num_prompt_tokens], ids[h.num_prompt_tokens : h.end])
        if p.is_greedy:
            assert out.tokens[i] == int(ref.argmax()), i
        else:
            torch.testing.assert_close(out.probs[i], torch.softmax(ref / p.temperature, dim=-1))
    # the rule changed the greedy pick somewhere (else the check above could not fail)
    assert any(out.tokens[i] != int(logits[i].argmax()) for i in (0, 1, 3))
    # logprobs: the model's raw distribution, not the penalised one
    torch.testing.assert_close(out.logprobs[0], torch.log_softmax(logits[0], dim=-1))


def test_min_p_drops_what_is_less_likely_than_min_p_times_the_top():
    torch.manual_seed(1)
    logits = torch.randn(3, V) * 2
    params = [SamplingParams(temperature=0.8, min_p=0.3, seed=5),
              SamplingParams(temperature=0.8, min_p=0.3, top_k=5, top_p=0.9, seed=6),
              SamplingParams(temperature=0.8, seed=7)]
    out = Sampler()(logits, [1, 2, 3], params, return_probs=True)
    base = torch.softmax(logits / 0.8, dim=-1)
    kept = base[0] >= 0.3 * base[0].max()
    assert 1 < int(kept.sum()) < V  # the filter cuts and keeps more than one
    torch.testing.assert_close(out.probs[0], torch.where(kept, base[0], 0) / base[0][kept].sum())
    # after top-k and top-p: still relative to the most likely token
    no_min_p = SamplingParams(temperature=0.8, top_k=5, top_p=0.9, seed=6)
    filtered = Sampler()(logits[1:2], [2], [no_min_p], return_probs=True).probs[0]
    ref = torch.where(base[1] >= 0.3 * base[1].max(), filtered, 0)
    torch.testing.assert_close(out.probs[1], ref / ref.sum())
    torch.testing.assert_close(out.probs[2], base[2])
    for _ in range(50):  # every draw comes from the kept set
        tok = Sampler()(logits[:1], [9], params[:1]).tokens[0]
        assert kept[tok]


def test_rows_without_controls_are_what_they_are_alone():
    torch.manual_seed(2)
    logits = torch.randn(3, V) * 3
    ids = list(range(20))
    plain = SamplingParams(temperature=0.9, top_p=0.8, seed=8)
    alone = Sampler()(logits[1:2], [2], [plain], return_probs=True)
    mates = [SamplingParams(temperature=0.9, repetition_penalty=2.0, min_p=0.1, logit_bias={3: 5}, seed=9),
             plain, SamplingParams(temperature=0.0, frequency_penalty=1.0)]
    hist = [TokenHistory(ids, 5, 20), None, TokenHistory(ids, 5, 20)]
    mixed = Sampler()(logits, [1, 2, 3], mates, return_probs=True, histories=hist)
    assert mixed.tokens[1] == alone.tokens[0]
    assert torch.equal(mixed.probs[1], alone.probs[0])


# -- the engine, tiny model --------------------------------------------------------------------

def _engine(scale: float = 1.0, draft: bool = False):
    model = tiny_model(CFG, tiny_weights(CFG, scale=scale))
    eng = make_engine(NUM_BLOCKS, max_num_seqs=4, budget=64)
    eng.model_config = CFG
    eng.runner = tiny_runner(model, CFG, num_blocks=NUM_BLOCKS, block_size=BS)
    if draft:
        eng.spec.draft = DraftProposer(tiny_runner(model, CFG, num_blocks=NUM_BLOCKS, block_size=BS))
    return eng


def _run(eng, requests: list[tuple[str, list[int], SamplingParams]]) -> dict[str, list[int]]:
    ids: dict[str, list[int]] = {rid: [] for rid, _, _ in requests}
    for rid, prompt, params in requests:
        eng.add_request(rid, prompt, params)
    for _ in range(200):
        if not eng.has_unfinished():
            break
        for out in eng.step():
            ids[out.request_id] += out.delta_token_ids
        check_invariants(eng)
    assert not eng.has_unfinished()
    assert eng.block_manager.num_free_blocks == NUM_BLOCKS
    return ids


def _greedy(**controls) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, **controls)


PROMPT = [5, 9, 5, 9, 5, 9, 1, 2, 3]


def _check_against_raw_logits(eng, prompt: list[int], output: list[int], params: SamplingParams) -> int:
    """Each output token is the argmax of the rule applied to the raw logits at its position;
    returns how many positions the rule moved off the raw argmax."""
    moved = 0
    every = eng.score(prompt + output)  # [n, V] teacher forcing: row j predicts token j + 1
    for i, tok in enumerate(output):
        raw = every[len(prompt) - 1 + i]  # [V] the model's logits for output token i
        ref = _reference(raw, params, prompt, output[:i])
        assert tok == int(ref.argmax()), (i, output)
        moved += tok != int(raw.argmax())
    return moved


@pytest.mark.parametrize("controls", [
    {"repetition_penalty": 3.0},
    {"frequency_penalty": 2.0, "presence_penalty": 2.0},
    {"logit_bias": {7: 2.5, 11: -3.0}, "repetition_penalty": 1.5, "frequency_penalty": 0.5},
])
def test_greedy_output_follows_the_rule_on_the_raw_logits(controls):
    eng = _engine()
    params = _greedy(**controls)
    out = _run(eng, [("a", PROMPT, params), ("plain", PROMPT, _greedy())])
    assert _check_against_raw_logits(eng, PROMPT, out["a"], params) > 0  # the rule did act
    assert out["a"] != out["plain"]
    _check_against_raw_logits(eng, PROMPT, out["plain"], _greedy())


def test_a_large_penalty_forbids_repeating_an_output_token():
    eng = _engine(scale=0.2)  # small logits: a penalty of 2 + 2 outweighs any gap between them
    plain = _run(eng, [("p", PROMPT, _greedy())])["p"]
    assert len(set(plain)) < len(plain)  # greedy alone repeats itself
    out = _run(eng, [("f", PROMPT, _greedy(frequency_penalty=2.0, presence_penalty=2.0))])["f"]
    assert len(set(out)) == len(out) == 24


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculation_gives_the_plain_greedy_output_with_controls_on(method):
    controls = [{"repetition_penalty": 2.0}, {"frequency_penalty": 1.5, "presence_penalty": 0.5},
                {"logit_bias": {9: 4.0}, "min_p": 0.2, "repetition_penalty": 0.7}, {}]
    prompts = [PROMPT, [9, 5] * 6, [1, 2, 3, 4] * 3, PROMPT[::-1]]

    def requests(spec: str | None):
        return [(f"r{i}", prompt, _greedy(speculative_method=spec, num_speculative_tokens=3, **c))
                for i, (prompt, c) in enumerate(zip(prompts, controls, strict=True))]

    plain = _run(_engine(), requests("none"))
    eng = _engine(draft=method == "draft")
    spec = _run(eng, requests(method))
    assert spec == plain
    stats = eng.spec.stats.snapshot()
    assert stats["spec_decode_num_draft_tokens"] > 0 and stats["spec_decode_num_accepted_tokens"] > 0
    if method == "draft":
        # the model drafting for itself proposes exactly what it verifies: only with the same
        # penalties, counting the drafts before each position, are all its drafts accepted
        assert stats["spec_decode_num_accepted_tokens"] >= 0.9 * stats["spec_decode_num_draft_tokens"]


@pytest.mark.parametrize(("method", "prompt", "controls"), [
    # a penalty below 1 invites repeats, which prompt lookup then finds to propose
    ("ngram", [1, 2, 3, 4] * 3,
     {"repetition_penalty": 0.5, "frequency_penalty": 0.2, "logit_bias": {3: 1.0}}),
    ("draft", PROMPT, {"repetition_penalty": 2.5, "frequency_penalty": 1.0, "logit_bias": {3: 1.0}}),
])
def test_speculation_through_the_rejection_rule_keeps_the_penalised_distribution(method, prompt, controls):
    """top_k 1 makes the penalised distribution one token: sampled and speculated through the
    rejection rule, the output must be the penalised greedy one, and a seed repeats itself."""
    greedy = _run(_engine(), [("g", prompt, _greedy(**controls))])["g"]
    sampled = SamplingParams(temperature=0.8, top_k=1, seed=11, max_tokens=24, ignore_eos=True,
                             speculative_method=method, num_speculative_tokens=3, **controls)
    eng = _engine(draft=method == "draft")
    assert _run(eng, [("s", prompt, sampled)])["s"] == greedy
    assert eng.spec.stats.snapshot()["spec_decode_num_accepted_tokens"] > 0
    seeded = SamplingParams(temperature=1.0, seed=12, max_tokens=24, ignore_eos=True, min_p=0.05,
                            speculative_method=method, num_speculative_tokens=3, **controls)
    first = _run(_engine(draft=method == "draft"), [("s", prompt, seeded)])["s"]
    assert _run(_engine(draft=method == "draft"), [("s", prompt, seeded)])["s"] == first


def test_a_draft_head_cut_short_ignores_a_bias_past_its_ids():
    sampler = Sampler()
    sampler.partial_vocab = True  # as DraftProposer sets it on its runner's sampler
    logits = torch.randn(1, 16)
    out = sampler(logits, [1], [SamplingParams(temperature=0.0, logit_bias={40: 100.0, 2: 100.0})])
    assert out.tokens == [2]
