"""Where a request ends, on the real SmolLM2 engine: stop strings inside an accepted draft run,
and max_tokens cutting a UTF-8 character."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.real


def _chat(eng, text: str) -> list[int]:
    tok = eng.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))


def _stream(eng, prompt, params):
    eng.add_request("stops", prompt, params)
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    return outs


def test_a_stop_string_inside_an_accepted_draft_run_ends_the_request_there(smollm2_engine, monkeypatch):
    """Drafts are the plain greedy continuation itself (all accepted, 8 a step), so the token that
    completes the stop string falls inside a run: the request must return and count the same
    tokens and text as without speculation, not the rest of the run."""
    from cloud_server.engine.sampling_params import SamplingParams
    from cloud_server.engine.spec_decode import decoder

    eng = smollm2_engine
    prompt = _chat(eng, "Count from 1 to 30, separated by commas.")
    ref = eng.generate([prompt], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0].token_ids
    # a stop string spanning the boundary into token m, found nowhere earlier: outputs come 1
    # (prefill), 1 + 3 (prompt lookup's ramp) and 1 + 7 at a time (whole row blocks of 8 or 4),
    # so token 10 is mid-run
    m = 10
    full, prev = eng.tokenizer.decode(ref[: m + 1]), eng.tokenizer.decode(ref[:m])
    stop = next(full[-n:] for n in range(len(full) - len(prev) + 1, len(full) + 1)
                if full.find(full[-n:]) == len(full) - n)
    params = dict(temperature=0, max_tokens=40, stop=[stop], num_speculative_tokens=8)
    plain = _stream(eng, prompt, SamplingParams(**params, speculative_method="none"))
    text = "".join(o.delta_text for o in plain)
    assert plain[-1].finish_reason == "stop" and stop not in text
    assert sum((o.delta_token_ids for o in plain), []) == ref[: m + 1]

    oracle = prompt + ref
    monkeypatch.setattr(decoder, "propose_ngram",
                        lambda ids, k, fallback_k: oracle[len(ids) : len(ids) + k])
    accepted = eng.spec.stats.num_accepted_tokens
    spec = _stream(eng, prompt, SamplingParams(**params, speculative_method="ngram"))
    assert eng.spec.stats.num_accepted_tokens - accepted >= 3 + 3
    assert len(spec[-1].delta_token_ids) > 1  # the stop came in a multi-token step
    assert sum((o.delta_token_ids for o in spec), []) == ref[: m + 1]
    assert spec[-1].num_output_tokens == m + 1 and spec[-1].finish_reason == "stop"
    assert "".join(o.delta_text for o in spec) == text
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks


def test_max_tokens_inside_a_character_drops_it_instead_of_sending_u_fffd(smollm2_engine):
    """A Chinese answer's characters span several byte tokens; cut after the first byte of one,
    the text ends before it (the token ids keep it), and the streamed deltas join to the text."""
    from cloud_server.engine.sampling_params import SamplingParams

    eng = smollm2_engine
    prompt = _chat(eng, "Write a short sentence in Chinese about cats.")
    ref = eng.generate([prompt], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0].token_ids
    cuts = [n for n in range(1, len(ref) + 1) if eng.tokenizer.decode(ref[:n]).endswith("\ufffd")]
    if not cuts:
        pytest.skip("this CPU's greedy answer has no multi-token character")
    for n in (cuts[0], cuts[-1]):
        outs = _stream(eng, prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
        text = "".join(o.delta_text for o in outs)
        assert sum((o.delta_token_ids for o in outs), []) == ref[:n]
        assert outs[-1].finish_reason == "length"
        assert "\ufffd" not in text
        assert text == eng.tokenizer.decode(ref[:n]).rstrip("\ufffd")
        assert eng.generate([prompt], SamplingParams(temperature=0, max_tokens=n))[0].text == text
