"""bench.structured's plain-text formats (review 38): ``--schema choice`` and ``--schema regex`` hold
the answer to vLLM's structured_outputs choice / regex, and an answer counts as valid only when it is
one of the labels or matches the pattern whole. Fast: no model."""

from __future__ import annotations

import pytest

pytest.importorskip("hybridllm._structured")

from bench.structured import LABELS, PHONE, TEXT_FORMATS, valid  # noqa: E402


def test_a_plain_text_answer_is_valid_only_when_the_format_allows_it() -> None:
    choice, regex = TEXT_FORMATS["choice"][0], TEXT_FORMATS["regex"][0]
    assert valid("mixed", choice) and not valid("Mixed", choice) and not valid("positive.", choice)
    assert valid("(555) 123-4567", regex) and not valid("(555) 123-4567 ext", regex)
    assert not valid("555-123-4567", regex)


def test_our_grammars_accept_what_the_gbnf_says() -> None:
    from hybridllm._structured import parse_structured_outputs

    choice = parse_structured_outputs({"choice": LABELS})
    assert all(choice.validate(x) for x in LABELS) and not choice.validate("neutral")
    regex = parse_structured_outputs({"regex": PHONE})
    assert regex.validate("(555) 123-4567") and not regex.validate("(555)123-4567")
    for label in LABELS:  # the GBNF lists the same labels
        assert f'"{label}"' in TEXT_FORMATS["choice"][1]
