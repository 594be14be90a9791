"""Australian phone numbers: found without a phone word, as the other national formats are."""

from __future__ import annotations

import pytest

from hybridllm.router.privacy import detect_pii, redact_pii


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("reach our Sydney office on (02) 9876 5432 after nine", "(02) 9876 5432"),
        ("Melbourne desk: (03)9123-4567.", "(03)9123-4567"),
        ("the landline 08 9123 4567 rings in Perth", "08 9123 4567"),
        ("my mobile 0412 345 678 is best", "0412 345 678"),
    ],
)
def test_australian_numbers_are_phones(text, value):
    assert [(m.kind, m.text) for m in detect_pii(text)] == [("phone", value)]
    assert value not in redact_pii(text) and "[PHONE]" in redact_pii(text)


@pytest.mark.parametrize(
    "text",
    [
        "the ratio (02) 1234 was a typo",  # too short to be a number
        "items 0 1234 5678 in the list",  # no area code digit after 0
        "part 0412 345 67 is missing a digit",
        "version 04.12.345.678",
    ],
)
def test_their_look_alikes_are_not(text):
    assert [m.kind for m in detect_pii(text)] == []
