"""An auto answer's free text costs what each token adds (review 38): the hold of auto tool calls
keeps only the text a call may still begin in (the answer's start while a bare call may come, the
last ``<tool_call>`` tag begun, or a tag's length back from the end), not the whole answer so far,
which it scanned again at every token. Calls are found as before: tagged after long prose, bare at
the start (after white space or a JSON fence), and an object that is no call is let go. Fast."""

from __future__ import annotations

import pytest

from .test_tool_hold_review37 import _hold

pytest.importorskip("hybridllm._structured")

PROSE = "The weather in Paris is mild in spring; take a light coat and an umbrella. " * 60  # 4.5 kB


def test_long_prose_keeps_a_tags_length_and_a_later_tagged_call_is_still_held() -> None:
    m = _hold().matcher()
    for ch in PROSE:
        assert m.feed(ch.encode())
        assert len(m._text) <= len("<tool_call>")  # bounded, whatever the answer's length
    assert m.held is None
    for piece in ["<tool", "_call>\n", '{"name": "add"', ', "arguments": {"a": 1, "b": 2}}']:
        m.feed(piece.encode())
        if piece.startswith('{"name"'):
            assert m.held is not None  # held from the whole name on
    assert m.held is None  # the object closed: free again


def test_a_tag_split_over_tokens_and_text_after_a_tag_are_kept() -> None:
    m = _hold().matcher()
    m.feed(b"I will call it. <tool_c")
    assert m._text.endswith(b"<tool_c")  # a tag begun is kept
    m.feed(b"all>")
    m.feed(b'\n{"name": "get_weather", "arguments": {"city": ')
    assert m.held is not None


@pytest.mark.parametrize("lead", [[], ["  \n"], ["```json\n"], ["``", "`json", "\n"], ["```", "json\n  "]])
def test_a_bare_call_at_the_start_is_held_as_before(lead: list[str]) -> None:
    m = _hold().matcher()
    for piece in [*lead, '{"name": "add", ', '"arguments": {"a": ']:
        m.feed(piece.encode())
    assert m.held is not None


def test_an_object_that_is_no_call_is_let_go_and_a_tag_after_it_is_found() -> None:
    m = _hold().matcher()
    m.feed(b'{"city": "Paris", "notes": "' + b"x" * 200 + b'"}')
    assert m.held is None and not m._start  # no bare call can begin any more
    assert len(m._text) <= len("<tool_call>")
    m.feed(b' <tool_call>{"name": "add", "arguments": {"a": ')
    assert m.held is not None
