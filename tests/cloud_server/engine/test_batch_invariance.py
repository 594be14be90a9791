"""A request's greedy output does not depend on its batch (real SmolLM2 weights).

Alone vs. batched with 15 others of different lengths: without a prefix-cache hit, with one,
and after the request was preempted and recomputed. Every test ends with all blocks free.
"""

from __future__ import annotations

import pytest

from .pools import small_pool

pytestmark = pytest.mark.real

MAX_TOKENS = 20
TARGET = "A farmer has 17 sheep and buys 5 more each week. How many sheep after 6 weeks?"
OTHERS = [
    "Hi!",
    "What is the boiling point of water?",
    "Write a limerick about a cat who loves to sleep in the sun all day long.",
    "List five fruits.",
    "Explain recursion to a five year old in a few sentences, with an example about stairs.",
    "Translate 'good morning' into French.",
    "What's 12 * 12?",
    "Give me a name for a pet goldfish.",
    "Describe the water cycle, covering evaporation, condensation, precipitation and collection.",
    "Why is the sky blue?",
    "Tell me a fun fact about octopuses.",
    "How many legs does a spider have?",
    "Suggest a title for a mystery novel set in Venice during a winter festival.",
    "What is the capital of Japan?",
    "Name a famous painting by Van Gogh and say in one sentence why it is famous.",
]


@pytest.fixture
def eng(smollm2_engine):
    engine = smollm2_engine
    engine.block_manager.reset_prefix_cache()
    yield engine
    assert not engine.has_unfinished()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def _prompts(engine):
    chat = engine.tokenizer.apply_chat_template
    return chat([{"role": "user", "content": TARGET}]), [
        chat([{"role": "user", "content": q}]) for q in OTHERS
    ]


def _params():
    from cloud_server.engine.sampling_params import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(smollm2_engine):
    engine = smollm2_engine
    engine.block_manager.reset_prefix_cache()
    target, _ = _prompts(engine)
    out = engine.generate([target], _params())[0]
    assert out.num_cached_tokens == 0 and len(out.token_ids) == MAX_TOKENS
    return out.token_ids


def test_batched_without_prefix_hit(eng, reference):
    target, others = _prompts(eng)
    eng.block_manager.reset_prefix_cache()
    eng.reset_stats()  # the batch size below is this run's, whatever ran before
    outs = eng.generate(others[:8] + [target] + others[8:], _params())
    assert outs[8].num_cached_tokens == 0
    assert outs[8].token_ids == reference
    assert eng.stats()["max_batch_num_seqs"] == 16


def test_batched_with_prefix_hit(eng, reference):
    target, others = _prompts(eng)
    eng.generate([target], _params())  # caches the target's full blocks
    outs = eng.generate([*others, target], _params())
    assert outs[-1].num_cached_tokens >= 16
    assert outs[-1].token_ids == reference


def test_after_preemption(eng, reference):
    target, others = _prompts(eng)
    # Just enough blocks to admit all 16 prompts in one step (shared prefix blocks are counted
    # once per prompt here, so a few spare): decoding 20 tokens crosses a block boundary in every
    # sequence, the pool runs out, and the newest running sequence, the target, is preempted.
    # No admission watermark (small_pool's default): it would keep the target waiting rather than
    # admit it to be preempted.
    bs = eng.block_manager.block_size
    num_blocks = sum(-(-len(eng.tokenizer.encode(p)) // bs) for p in [*others, target])
    preempted: set[str] = set()
    with small_pool(eng, num_blocks, max_num_batched_tokens=2048):
        schedule = eng.scheduler.schedule

        def recording_schedule(*args, **kwargs):
            out = schedule(*args, **kwargs)
            preempted.update(s.request_id for s in out.preempted)
            return out

        eng.scheduler.schedule = recording_schedule
        outs = eng.generate([*others, target], _params())
        assert eng.block_manager.num_free_blocks == num_blocks
    assert outs[-1].request_id in preempted
    assert outs[-1].token_ids == reference
