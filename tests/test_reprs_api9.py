"""The reprs of the public objects hold no user text: a prompt or an answer logged as
``log.info("%r", decision)`` showed the whole text (Decision put its messages_for_cloud in its repr,
Completion / Chunk / Delta their text). They show its size instead; the attributes keep the text."""

from __future__ import annotations

import logging

from hybridllm import Chunk, Completion, Decision, Delta, HybridLLM, Usage
from hybridllm.backends.base import Generation
from hybridllm.backends.fake import FakeBackend

PROMPT = "my card is 4111 1111 1111 1111 and my name is Ada Lovelace"
ANSWER = "Dear Ada, your card ending 1111 is blocked"


def test_a_decision_shows_the_size_of_its_messages_not_their_text():
    d = Decision("cloud", "router: hard", score=0.8,
                 messages_for_cloud=[{"role": "system", "content": "be brief"},
                                     {"role": "user", "content": PROMPT}])
    text = repr(d)
    assert "Lovelace" not in text and "be brief" not in text
    assert f"messages_for_cloud=<2 messages, {8 + len(PROMPT)} chars>" in text
    assert "route='cloud'" in text and "reason='router: hard'" in text and "score=0.8" in text
    assert d.messages_for_cloud[1]["content"] == PROMPT  # the attribute is whole


def test_completions_chunks_deltas_and_generations_show_the_texts_length():
    c = Completion(ANSWER, "edge", "edge: easy", "smollm2", usage=Usage(3, 9))
    for obj in (c, Chunk(ANSWER, "edge", "smollm2", finish_reason="stop", completion=c),
                Delta(ANSWER, finish_reason="stop"), Generation(ANSWER, "stop", Usage(), None, 1.0)):
        text = repr(obj)
        assert "Ada" not in text and f"text=<{len(ANSWER)} chars>" in text, text
        assert obj.text == ANSWER
    assert "route='edge'" in repr(c) and "prompt_tokens=3" in repr(c)
    assert str(c) == repr(c)  # f"{c}" and "%s" too


def test_nothing_the_client_returns_logs_the_prompt_or_the_answer(caplog):
    with HybridLLM(edge=FakeBackend(reply=lambda m: ANSWER), cache=False) as llm:
        with llm.stream(PROMPT) as s:
            chunks = list(s)
    with caplog.at_level(logging.INFO, logger="test"):
        logging.getLogger("test").info("%r %s", chunks, s.completion)
    assert "Ada" not in caplog.text and "Lovelace" not in caplog.text
    assert s.completion is not None and s.completion.text == ANSWER
