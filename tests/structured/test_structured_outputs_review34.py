"""vLLM's ``structured_outputs`` in the grammar core (``parse_structured_outputs``): ``regex`` holds
the whole output, as plain text, to the pattern; ``choice`` to one of the strings exactly; ``json``
is a JSON schema as ``response_format``'s. Sampled through the token masks of a trained tokenizer,
every finished output fits, and what cannot be served is refused naming the field."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest

from hybridllm._structured import (
    ResponseFormatError,
    TokenIndex,
    parse_grammar,
    parse_response_format,
    parse_structured_outputs,
    token_bytes_from_tokenizer,
)

from .test_structured_core_review32 import _trained


def _ok(grammar, text: str) -> bool:
    return grammar.validate(text)


def test_a_regex_holds_the_whole_output_as_plain_text():
    g = parse_structured_outputs({"regex": r"\d{3}-\d{4}"})
    assert _ok(g, "555-1234")
    for bad in ("555-12345", " 555-1234", "555-1234\n", "x555-1234", '"555-1234"', "555-123"):
        assert not _ok(g, bad), bad
    # anchors the user wrote are the implied ones: the same language
    for written in (r"^\d{3}-\d{4}$", r"^\d{3}-\d{4}", r"\d{3}-\d{4}$"):
        other = parse_structured_outputs({"regex": written})
        assert _ok(other, "555-1234") and not _ok(other, "1555-1234") and not _ok(other, "555-12345")
    # alternation is inside the implied group: "a|bc" is a, or bc, not "a..." or "...bc"
    alt = parse_structured_outputs({"regex": "a|bc"})
    assert [_ok(alt, t) for t in ("a", "bc", "abc", "ab", "a bc")] == [True, True, False, False, False]


def test_a_regex_reads_utf8_characters_and_may_match_the_empty_text():
    g = parse_structured_outputs({"regex": "é+|a*"})
    assert _ok(g, "") and _ok(g, "ééé") and _ok(g, "aa") and not _ok(g, "éa")
    assert g.matcher().done  # the empty text is an answer: the end may come first
    m = g.matcher()
    assert m.feed("é".encode()[:1]) and not m.done  # half a character: not an end
    assert m.feed("é".encode()[1:]) and m.done
    assert not m.feed(b"a")
    m = g.matcher()
    assert not m.feed("ë".encode()[:2])  # a character the pattern has no room for: refused at once
    kanji = parse_structured_outputs({"regex": "[日本]{2}"})
    assert _ok(kanji, "日本") and not _ok(kanji, "日") and not _ok(kanji, "日本日")
    m = kanji.matcher()
    assert not m.feed("中".encode()[:2])  # U+4E2D's first two bytes lead to no 日 (U+65E5) or 本 (U+672C)


def test_a_choice_is_one_of_the_strings_exactly():
    g = parse_structured_outputs({"choice": ["positive", "negative", "neutral é"]})
    assert all(_ok(g, c) for c in ("positive", "negative", "neutral é"))
    for bad in ("pos", "positive ", " positive", "Positive", "positivenegative", '"positive"', ""):
        assert not _ok(g, bad), bad
    m = g.matcher()
    assert m.feed(b"negative") and m.done and m.finished  # nothing may follow a whole choice
    prefix = parse_structured_outputs({"choice": ["yes", "yes!"]})
    m = prefix.matcher()
    assert m.feed(b"yes") and m.done and not m.finished and m.feed(b"!") and m.finished


def test_json_is_a_schema_as_response_formats_and_may_come_as_text():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    g = parse_structured_outputs({"json": schema})
    assert g is parse_structured_outputs({"json": json.dumps(schema)})
    assert g is parse_response_format({"type": "json_schema",
                                       "json_schema": {"name": "structured_outputs", "schema": schema}})
    assert _ok(g, '{"a": 1}') and not _ok(g, '{"a": "1"}') and not _ok(g, '{"a": 1, "b": 2}')


def test_the_same_field_is_the_same_grammar_and_travels_as_its_own_dict():
    for spec in ({"regex": "[a-z]+"}, {"choice": ["x", "y"]}, {"json": {"type": "string"}}):
        g = parse_structured_outputs(spec)
        assert parse_structured_outputs(json.loads(json.dumps(spec))) is g
        assert parse_grammar(json.loads(json.dumps(g.response_format))) is g  # to a replica and back
    # the caches are apart: a choice's JSON sent as a response_format stays refused
    parse_structured_outputs({"choice": ["a", "b"]})
    with pytest.raises(ResponseFormatError):
        parse_response_format({"choice": ["a", "b"]})


@pytest.mark.parametrize(("spec", "param", "words"), [
    ({"regex": "(a"}, "structured_outputs.regex", "an unclosed group (at character 2"),
    ({"regex": r"(\w)\1"}, "structured_outputs.regex", "backreferences"),
    ({"regex": "a$|^b"}, "structured_outputs.regex", "only at the pattern's end"),
    ({"regex": ""}, "structured_outputs.regex", "non-empty string"),
    ({"choice": []}, "structured_outputs.choice", "one or more non-empty strings"),
    ({"choice": ["a", ""]}, "structured_outputs.choice", "non-empty strings"),
    ({"choice": "a"}, "structured_outputs.choice", "a list"),
    ({"json": "{bad"}, "structured_outputs.json", "valid JSON"),
    ({"json": []}, "structured_outputs.json", "a JSON schema"),
    ({"json": {"type": "string", "format": "ipv6"}}, "structured_outputs.json.format", "ipv6"),
    ({"grammar": "root ::= 'a'"}, "structured_outputs.grammar", "context-free grammar"),
    ({"regex": "a", "whitespace_pattern": " "}, "structured_outputs.whitespace_pattern", "fixed"),
    ({"regex": "a", "choice": ["a"]}, "structured_outputs", "exactly one of json, regex and choice; got"),
    ({}, "structured_outputs", "exactly one"),
    ({"regexp": "a"}, "structured_outputs.regexp", "not a field"),
])
def test_what_cannot_be_served_is_refused_naming_the_field(spec, param, words):
    with pytest.raises(ResponseFormatError) as err:
        parse_structured_outputs(spec)
    assert err.value.param == param and words in str(err.value), (err.value.param, str(err.value))


def test_vllms_older_fields_are_named_as_themselves():
    with pytest.raises(ResponseFormatError) as err:
        parse_structured_outputs({"regex": "(a"}, field="guided_regex")
    assert err.value.param == "guided_regex" and str(err.value).startswith("guided_regex: ")
    # vLLM's flags that change nothing here are taken
    assert parse_structured_outputs({"choice": ["a"], "disable_fallback": True}).validate("a")


@pytest.mark.parametrize("kind", ["bytelevel", "sentencepiece"])
def test_masked_sampling_keeps_every_output_in_the_language(kind):
    tok = _trained(kind)
    end = tok.token_to_id("<|end|>")
    index = TokenIndex(token_bytes_from_tokenizer(tok), [end])
    cases = [
        ({"regex": r"[a-z]{2,6}( [a-z]{1,4})?"}, lambda t: re.fullmatch(r"[a-z]{2,6}( [a-z]{1,4})?", t)),
        ({"regex": r"n\d+ é日|tabs?"}, lambda t: re.fullmatch(r"n\d+ é日|tabs?", t)),
        ({"choice": ["the cat", "the mat", "tabs here", "é日"]},
         lambda t: t in ("the cat", "the mat", "tabs here", "é日")),
    ]
    rng = random.Random(3)
    for spec, fits in cases:
        grammar = parse_structured_outputs(spec)
        ended = 0
        for _ in range(12):
            m = grammar.matcher()
            ids: list[int] = []
            for _ in range(60):
                allowed = np.flatnonzero(index.allowed(m))
                assert len(allowed), (spec, tok.decode(ids))  # never a dead end
                if end in allowed and rng.random() < 0.5:
                    break
                tid = int(rng.choice([t for t in allowed if t != end] or [end]))
                if tid == end:
                    break
                assert index.feed_token(m, tid)
                ids.append(tid)
            if m.done:
                text = tok.decode(ids)
                assert fits(text), (spec, text)
                ended += 1
        assert ended, spec


@pytest.mark.parametrize("kind", ["bytelevel", "sentencepiece"])
def test_the_grouped_masks_of_a_plain_text_regex_are_the_walks(kind, monkeypatch):
    """``TokenIndex._in_raw`` (tokens grouped by their class sequence, run through the regex once
    per group) allows exactly what feeding each token would: compared, state by state along random
    outputs, with the masks of the generic trie walk."""
    from hybridllm._structured import _nodes

    tok = _trained(kind)
    end = tok.token_to_id("<|end|>")
    table = token_bytes_from_tokenizer(tok)
    fast, slow = TokenIndex(table, [end]), TokenIndex(table, [end])
    patterns = [r'[^\n]{1,40}', r'"[a-z]+" \\ é{0,2}日?', r'(The|the) [a-z]{1,8}\.\n?', r'\d+|[a-f]{3,}',
                r'[^a-z"]*']
    rng = random.Random(11)
    compared = 0
    for pattern in patterns:
        grammar = parse_structured_outputs({"regex": pattern})
        for _ in range(4):
            m = grammar.matcher()
            for _ in range(25):
                want_fast = fast.allowed(m)
                with monkeypatch.context() as mp:
                    mp.setattr(_nodes, "raw_place", lambda _stack: None)
                    want_slow = slow._compute(m)
                np.testing.assert_array_equal(want_fast, want_slow, err_msg=f"{pattern} after {m.key}")
                compared += 1
                choices = [t for t in np.flatnonzero(want_fast) if t != end]
                if not choices:
                    break
                assert fast.feed_token(m, int(rng.choice(choices)))
    assert compared > 100
