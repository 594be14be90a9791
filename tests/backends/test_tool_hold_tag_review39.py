"""A ``<tool_call>`` tag that prose follows no longer keeps the hold's free text growing (review 39):
before, the text from the last tag on was kept (and copied at every token) until the next tag, so
an answer that wrote the tag and then went on in prose cost O(n^2) again. Now a tag is let go once
what follows it cannot begin a call (text that is not white space or ``{``, or an object whose
head is whole and names no listed tool). Calls after such a tag are found as before. Fast."""

from __future__ import annotations

import pytest

from .test_tool_hold_review37 import _hold
from .test_tool_hold_text_review38 import PROSE

pytest.importorskip("hybridllm._structured")


@pytest.mark.parametrize("after", ["", "\n  "])
def test_prose_after_a_tag_keeps_a_tags_length(after: str) -> None:
    m = _hold().matcher()
    m.feed(f"I would call a tool here: <tool_call>{after}".encode())
    for ch in PROSE:
        assert m.feed(ch.encode())
        assert len(m._text) <= len("<tool_call>")  # bounded, whatever the answer's length
    assert m.held is None
    m.feed(b'<tool_call>\n{"name": "add", "arguments": {"a": ')
    assert m.held is not None  # a later tagged call is held


def test_an_object_after_a_tag_that_names_no_tool_is_let_go() -> None:
    m = _hold().matcher()
    m.feed(b'<tool_call>{"name": "' + b"n" * 200 + b'"')
    assert m.held is None and len(m._text) <= len("<tool_call>")


@pytest.mark.parametrize(
    "pieces",
    [
        ["<tool_call>", "\n", '{"name": "add"', ', "arguments": {"a": '],
        ["<tool_call>\n{", '"name"', ': "add", "arguments": {"a": '],
        ["<tool_call>  \n\n", "{ ", '"name": "add", "arguments": {"a": '],
    ],
)
def test_a_tagged_call_split_over_tokens_is_held_as_before(pieces: list[str]) -> None:
    m = _hold().matcher()
    m.feed(b"Let me add them. ")
    for piece in pieces:
        assert m.feed(piece.encode())
    assert m.held is not None
