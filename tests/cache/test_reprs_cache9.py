"""The semantic cache's public objects hold no user text in their reprs, as the client's do
(tests/test_reprs_api9.py): a logged hit or entry showed the cached question and answer whole."""

from __future__ import annotations

from hybridllm.cache import SemanticCache

QUESTION = "Why was the Lovelace order held at customs?"
ANSWER = "Dear Ada, the parcel waits for a signed customs form"


def test_a_hit_and_its_entry_show_sizes_not_text(tmp_path):
    cache = SemanticCache(path=tmp_path / "c.db", verifier="cosine")
    msgs = [{"role": "user", "content": QUESTION}]
    cache.put(msgs, ANSWER, model="m", params_key={"temperature": 0.0})
    hit = cache.get(msgs, model="m", params_key={"temperature": 0.0})
    assert hit is not None and hit.text == ANSWER and hit.cached_query == QUESTION
    entry = cache._store.get(hit.entry_id)
    for obj in (hit, entry):
        text = repr(obj)
        assert "Lovelace" not in text and "Ada" not in text and "customs" not in text, text
    assert f"text=<{len(ANSWER)} chars>" in repr(hit) and f"cached_query=<{len(QUESTION)} chars>" in repr(hit)
    assert f"query=<{len(QUESTION)} chars>" in repr(entry) and entry.response == ANSWER
    assert "embedding" not in repr(entry)  # 384 floats said nothing to a reader either
    cache.close()
