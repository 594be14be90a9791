"""An assistant turn with null content (one that only called tools, as OpenAI's format and
``message.model_dump()`` write it) is taken by the Python API as the HTTP servers take it: an
empty assistant turn. Before, ``chat()`` refused the conversation ("must be a string or a list of
text parts") that ``hybridllm serve`` accepted. Null content stays refused on the other roles."""

from __future__ import annotations

import pytest

from hybridllm import InvalidRequestError
from hybridllm._types import normalize_messages
from hybridllm.wire.requests import ChatMessage

CALL = [{"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]


def conversation(content=None):
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": content, "tool_calls": CALL},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "user", "content": "So, a coat?"},
    ]


def test_an_assistant_turn_with_null_content_is_an_empty_turn():
    msgs = normalize_messages(conversation())
    # (since review 36 the turn keeps its calls, and the tool turn the id of the call it answers:
    # the cloud model reads them)
    assert msgs[1] == {"role": "assistant", "content": "", "tool_calls": CALL}
    assert msgs[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    assert msgs == normalize_messages(conversation(""))
    # the wire layer reads the same turn as the same text
    assert ChatMessage(**conversation()[1]).text() == msgs[1]["content"]


@pytest.mark.parametrize("role", ["user", "system", "tool"])
def test_null_content_is_still_refused_on_other_roles(role):
    with pytest.raises(InvalidRequestError, match="content"):
        normalize_messages([{"role": "user", "content": "hi"}, {"role": role, "content": None}])
