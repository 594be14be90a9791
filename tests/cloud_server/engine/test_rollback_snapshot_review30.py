"""What a step keeps so that a failure can roll it back: only what the step changes.

Each step copied the speculation state of every sequence that had ever drafted (a busy server,
where the adaptive rule turns speculation off, copied all of them every step for nothing: 2-3%
of a tiny-model decode step at 32-64 sequences), and saved the state of a seeded request's
draft-model generator even when the request does not draft with the model, and of its target
generator in a prefill chunk that samples nothing (a 5 KB copy each). A failed step must still
put back every state it changed, and take away the ones it created.
"""

from __future__ import annotations

from dataclasses import replace

from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.engine.sequence import Sequence
from cloud_server.engine.spec_decode.decoder import SpecDecoder, _SeqState

from .test_postprocess_retry_review29 import _engine


def _seq(prompt: list[int]) -> Sequence:
    params = SamplingParams(temperature=0.0, max_tokens=20, speculative_method="ngram")
    seq = Sequence("s", prompt, params)
    seq.num_computed_tokens = len(prompt) - 1  # decoding
    return seq


def test_a_step_keeps_the_start_of_the_states_it_changes_only():
    spec = SpecDecoder(method="ngram", num_speculative_tokens=3, max_model_len=64, max_spec_rows=16)
    old, new = _seq([1, 2, 3, 1, 2, 3, 1, 2]), _seq([5, 6, 7, 5, 6, 7, 5, 6])
    # sequences that drafted while it was quiet, with ids past both (Sequence ids count up across
    # the session: fixed ids collided with `new` after about 10,000 earlier sequences)
    first = max(old.seq_id, new.seq_id) + 1
    idle = {sid: _SeqState(acceptance=0.1 * (sid % 7), steps=sid, whole=sid % 2 == 0)
            for sid in range(first, first + 50)}
    spec._state.update({sid: replace(s) for sid, s in idle.items()})
    spec._state[old.seq_id] = _SeqState(acceptance=0.5, steps=3, whole=True)
    marks = spec.adaptive_marks()
    assert spec.lookahead(old, 2) == 3 and spec.lookahead(new, 2) == 3
    assert spec._state[old.seq_id] == _SeqState(acceptance=0.5, steps=4, whole=False)
    journal, _ = marks
    assert journal == {old.seq_id: _SeqState(acceptance=0.5, steps=3, whole=True), new.seq_id: None}
    spec.restore_marks(marks)  # the step failed
    assert spec._state[old.seq_id] == _SeqState(acceptance=0.5, steps=3, whole=True)
    assert new.seq_id not in spec._state  # its first step left nothing
    assert {sid: spec._state[sid] for sid in idle} == idle


def _draws(eng) -> dict[str, list[str]]:
    """Per request of the next step: whose generators (the target's, the draft model's)
    ``_seeded_draws`` saves."""
    sched = eng.scheduler.schedule(eng.spec.lookahead)
    try:
        saved = {id(gen) for gen, _ in eng._seeded_draws(sched.scheduled)}
    finally:
        eng.scheduler.rollback(sched.scheduled)
    samplers = (("target", eng.runner.sampler), ("draft", eng.spec.draft.runner.sampler))
    return {item.seq.request_id: [name for name, sampler in samplers
                                  if id(sampler._per_seq.get(item.seq.seq_id)) in saved]
            for item in sched.scheduled}


def test_a_step_saves_only_the_generators_it_draws_from():
    eng = _engine()  # a tiny model that drafts for itself; a token budget of 32
    for rid, method in (("ngram", "ngram"), ("draft", "draft")):
        eng.add_request(rid, list(range(1, 37)) if rid == "ngram" else [4, 8, 15, 16, 23],
                        SamplingParams(temperature=1.0, seed=7, max_tokens=3, ignore_eos=True,
                                       speculative_method=method, num_speculative_tokens=2))
    # the first step: 32 of the 36-token prompt (no token sampled), nothing left for "draft"
    assert _draws(eng) == {"ngram": []}
    eng.step()
    eng.step()  # the rest of the prompt, and the draft request's whole prompt: both sample
    got = _draws(eng)  # both decode, the draft request with the draft model's drafts
    assert got == {"ngram": ["target"], "draft": ["target", "draft"]}
