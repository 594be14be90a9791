"""The request schema says what the servers accept: a refusal content part only in an assistant
turn. Before, the document let any role send one, so a generated client (and the schemathesis
fuzz, whose draws changed with the stop-length bound) sent user turns the servers refused (400)."""

from __future__ import annotations

import pytest

jsonschema = pytest.importorskip("jsonschema")
from hybridllm.wire.requests import ChatMessage  # noqa: E402

REFUSAL = [{"type": "refusal", "refusal": "I can't help with that."}]
TEXT = [{"type": "text", "text": "hello"}]


def _valid(message: dict) -> bool:
    schema = ChatMessage.model_json_schema()
    return not list(jsonschema.Draft202012Validator(schema).iter_errors(message))


@pytest.mark.parametrize("role", ["user", "system", "developer", "tool"])
def test_a_refusal_part_outside_an_assistant_turn_is_outside_the_schema(role):
    assert not _valid({"role": role, "content": REFUSAL})
    assert not _valid({"role": role, "content": [*TEXT, *REFUSAL]})
    assert _valid({"role": role, "content": TEXT})  # text parts stay valid


def test_an_assistant_refusal_part_and_null_content_stay_valid():
    assert _valid({"role": "assistant", "content": REFUSAL})
    assert _valid({"role": "assistant", "content": None})
    assert not _valid({"role": "user", "content": None})  # the rule kept: content needed elsewhere
