"""The check the guard rules' real-model tests share: each cached question in its own namespace,
the other question of its pair asked there, and nothing served (before, three files each wrote
these ten lines out)."""

from __future__ import annotations

from hybridllm.cache.semantic import SemanticCache


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def assert_none_served(cache: SemanticCache, pairs: list[tuple[str, str]], *,
                       the_question_itself: bool = False) -> None:
    """Cache ``f"answer to {cached}"`` for each ``(cached, asked)`` in namespace ``pair<i>`` and
    assert that ``asked`` gets no hit; with ``the_question_itself``, that the cached question
    (lower-cased: found as an exact repeat) still gets its own answer, so a guard that refused
    everything would fail."""
    for i, (cached, asked) in enumerate(pairs):
        ns = f"pair{i}"
        cache.put(_user(cached), f"answer to {cached}", model="m", params_key={}, namespace=ns)
        assert cache.get(_user(asked), model="m", params_key={}, namespace=ns) is None, (cached, asked)
        if the_question_itself:
            hit = cache.get(_user(cached.lower()), model="m", params_key={}, namespace=ns)
            assert hit is not None and hit.text == f"answer to {cached}", cached
