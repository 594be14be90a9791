"""LLMEngine's prompt handling on the fake-model engine: a clear error for a malformed prompt, and
one string is one prompt (review 14)."""

from __future__ import annotations

import pytest

from cloud_server.engine.sampling_params import SamplingParams
from cloud_server.exceptions import InvalidRequestError

from .test_fuzz_fake_batching8 import make_engine


def test_generate_takes_one_string_as_one_prompt():
    """A bare string ran as one prompt per character (5 results for 'hello')."""
    eng = make_engine(8)
    eng.tokenizer.encode = lambda text, add_special=True: [ord(c) - ord("a") for c in text]
    out = eng.generate("bcd", SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert len(out) == 1
    assert out[0].num_prompt_tokens == 3 and len(out[0].token_ids) == 3
    assert not eng.has_unfinished()


@pytest.mark.parametrize("bad", [[1, 2, 3], [None]])
def test_generate_refuses_a_prompt_that_is_no_string_or_id_list(bad):
    """A flat id list's ints (or None) were prompts: a TypeError from list(1), not a 400."""
    eng = make_engine(8)
    with pytest.raises(InvalidRequestError) as err:
        eng.generate(bad, SamplingParams(max_tokens=2))
    assert err.value.param == "prompt"
    assert not eng.has_unfinished() and eng.block_manager.num_free_blocks == 8


def test_score_refuses_ids_past_the_vocabulary():
    """They went to the model, indexing past its embedding (a CUDA assert kills the context)."""
    eng = make_engine(8)
    calls = []
    eng.runner.prompt_logits = lambda item: calls.append(item) or "logits"
    assert eng.score([1, 2, 3]) == "logits"
    with pytest.raises(InvalidRequestError):
        eng.score([1, 2, 10_000])
    with pytest.raises(InvalidRequestError):
        eng.score([1, -1])
    assert len(calls) == 1
    assert eng.block_manager.num_free_blocks == 8


def test_a_failed_step_names_its_batch_and_keeps_the_queued_requests():
    """The step's EngineError named no request, so its caller (the async loop) could only fail
    every request, the ones that were only queued too; it now lists the failed batch, and the
    engine still serves everything on the next step."""
    from cloud_server.exceptions import EngineError

    eng = make_engine(8, max_num_seqs=1)
    p = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    eng.add_request("a", [1, 2, 3], p)
    eng.add_request("b", [4, 5, 6], p)  # waits: one batch slot
    real, calls = eng.runner.execute, []

    def execute(scheduled, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("out of memory")
        return real(scheduled, **kw)

    eng.runner.execute = execute
    with pytest.raises(EngineError) as err:
        eng.step()
    assert err.value.request_ids == ["a"]
    finished = {}
    while eng.has_unfinished():
        for out in eng.step():
            finished.setdefault(out.request_id, []).extend(out.delta_token_ids)
    assert sorted(finished) == ["a", "b"] and all(len(t) == 3 for t in finished.values())
    assert eng.block_manager.num_free_blocks == 8
