"""A failed step's retry drafts as many tokens as the failed step did (the KV-honest fake model).

Prompt lookup drafts at most 3 tokens until a draft is accepted whole, then up to K;
``SpecDecoder.lookahead`` takes the "accepted whole" mark (and counts the step for the probes of
a sequence whose drafts keep failing) as it grants the slots. A step that then failed kept those
changes, so its retry drafted 3 tokens where the failed step had drafted more: a seeded sampled
request draws one number a draft, and went on another course than without the failure
(``test_seeded_retry_review28.py`` shows it on SmolLM2). Greedy output is the same either way;
the draft lengths show the difference here, without a model.
"""

from __future__ import annotations

from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.exceptions import EngineError

from .test_fuzz_fake_batching8 import check_invariants, make_engine


def _drafts_per_step(fail_when_k_above: int | None) -> tuple[list[int], list[int], int]:
    """(draft length of each step the model ran, output ids, failed steps) of one request whose
    prompt repeats, so prompt lookup's drafts are accepted whole."""
    eng = make_engine(16)
    real = eng.runner.execute
    lengths: list[int] = []
    failed: list[bool] = []

    def execute(scheduled, **kw):
        k = max(s.num_lookahead for s in scheduled)
        lengths.append(k)
        if fail_when_k_above is not None and not failed and k > fail_when_k_above:
            failed.append(True)
            raise RuntimeError("device lost")
        return real(scheduled, **kw)

    eng.runner.execute = execute
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                            speculative_method="ngram", num_speculative_tokens=6)
    eng.add_request("a", [6, 6, 0, 6, 2, 4] * 2 + [6, 6, 0], params)  # the model's own cycle
    ids: list[int] = []
    for _ in range(60):
        if not eng.has_unfinished():
            break
        try:
            for out in eng.step():
                ids += out.delta_token_ids
        except EngineError:
            pass
        check_invariants(eng)
    assert not eng.has_unfinished()
    return lengths, ids, len(failed)


def test_the_retry_of_a_failed_step_drafts_as_far_as_the_failed_step():
    plain, ref_ids, _ = _drafts_per_step(None)
    assert max(plain) > 3  # past the ramp: a draft was accepted whole
    lengths, ids, failures = _drafts_per_step(3)
    assert failures == 1
    first = next(i for i, k in enumerate(lengths) if k > 3)
    assert lengths[first + 1] == lengths[first]  # the retry, not a draft cut back to the ramp
    assert lengths[:first] + lengths[first + 1 :] == plain  # then on as without the failure
    assert ids == ref_ids
