"""What the model sees of the last user turn besides its text keys the cache entry too."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridllm.cache import SemanticCache

from .fakes import FakeEmbedder

KW = {"model": "m", "params_key": {"temperature": 0}}


@pytest.fixture
def cache(tmp_path: Path):
    c = SemanticCache(tmp_path / "c.sqlite3", verifier=None, min_similarity=0.9, embedder=FakeEmbedder())
    yield c
    c.close()


def test_a_named_user_is_never_served_another_user_s_answer(cache: SemanticCache) -> None:
    """Before: the last user turn's ``name`` was dropped from the key, so Bob asking "What is my
    name?" was served "Your name is Alice." as an exact repeat (an OpenAI-style endpoint reads
    ``name``)."""
    alice = [{"role": "user", "name": "alice", "content": "What is my name?"}]
    bob = [{"role": "user", "name": "bob", "content": "What is my name?"}]
    cache.put(alice, "Your name is Alice.", **KW)
    assert cache.get(bob, **KW) is None
    assert cache.get_exact(bob, **KW) is None
    hit = cache.get(alice, **KW)
    assert hit is not None and hit.text == "Your name is Alice."


def test_the_place_of_the_question_in_the_conversation_is_keyed(cache: SemanticCache) -> None:
    """Before: the context was every other turn in order, without where the question stood, so
    a question followed by an assistant prefill and the same question after the same assistant
    turn were one entry."""
    prefill = [{"role": "user", "content": "Tell me a joke"}, {"role": "assistant", "content": "Sure."}]
    after = [{"role": "assistant", "content": "Sure."}, {"role": "user", "content": "Tell me a joke"}]
    cache.put(prefill, "Sure. Why did the chicken...", **KW)
    assert cache.get(after, **KW) is None
    assert cache.get(prefill, **KW) is not None


def test_an_unnamed_last_question_keeps_the_key_entries_were_written_with(tmp_path: Path) -> None:
    """The usual request (the question last, no name) keys as before: a file written before this
    change is still read."""
    from hybridllm.cache.semantic import bucket_key, split_messages

    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    context, query = split_messages(msgs)
    assert context == [{"role": "system", "content": "Be brief."}] and query == "hi"
    named_none = [{"role": "user", "name": None, "content": "hi"}]
    assert bucket_key("ns", "m", {}, split_messages(named_none)[0]) == bucket_key("ns", "m", {}, [])
