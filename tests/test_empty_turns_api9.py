"""The library refuses an empty turn as ``chat("")`` is refused and as ``hybridllm serve`` answers
400: a user turn without text, or content that is an empty list of parts (before: both were
answered, the empty question sent on to the model)."""

from __future__ import annotations

import pytest

from hybridllm import HybridLLM, InvalidRequestError
from hybridllm._types import normalize_messages
from hybridllm.backends.fake import FakeBackend


@pytest.mark.parametrize(("messages", "says"), [
    ([{"role": "user", "content": ""}], r"messages\[0\] is a user turn without text"),
    ([{"role": "user", "content": "  \n"}], r"messages\[0\] is a user turn without text"),
    ([{"role": "user", "content": [{"type": "text", "text": " "}]}], r"messages\[0\] is a user turn"),
    ([{"role": "system", "content": []}, {"role": "user", "content": "hi"}],
     r"messages\[0\]\['content'\] is an empty list of content parts"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
      {"role": "user", "content": []}], r"messages\[2\]\['content'\] is an empty list"),
])
def test_an_empty_turn_is_refused_naming_the_message(messages, says):
    with pytest.raises(InvalidRequestError, match=says):
        normalize_messages(messages)


def test_turns_that_need_no_text_are_still_taken():
    msgs = normalize_messages([{"role": "system", "content": ""}, {"role": "user", "content": "hi"},
                               {"role": "assistant", "content": ""}, {"role": "user", "content": "go on"}])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]


def test_the_client_refuses_it_before_the_device_runs():
    edge = FakeBackend()
    with HybridLLM(edge=edge, cloud=None, cache=False) as llm:
        with pytest.raises(InvalidRequestError, match="user turn without text"):
            llm.chat([{"role": "user", "content": ""}])
        assert edge.tokens_generated == 0
        assert llm.chat([{"role": "user", "content": "hi"}]).text == "echo: hi"


def test_a_labelled_file_s_conversations_may_hold_an_empty_turn(tmp_path):
    """Data files are read as they are (an empty prompt string is taken too): the rule is for
    requests, not for a whole training file refused over one record."""
    import json

    from hybridllm.router._dataset_table import _prompt_cell

    turns = [{"role": "user", "content": ""}, {"role": "assistant", "content": "?"},
             {"role": "user", "content": "What is 2+2?"}]
    assert _prompt_cell(tmp_path / "x.jsonl", 0, json.loads(json.dumps(turns))) == "What is 2+2?"
    assert normalize_messages([{"role": "user", "content": []}], allow_empty=True)[0]["content"] == ""
