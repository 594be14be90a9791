"""Card numbers of the schemes the issuer check left out (review 21): Maestro, Mir and RuPay
numbers that pass the Luhn check went to the cloud as plain numbers."""

from __future__ import annotations

import pytest

from hybridllm.router import detect_pii, redact_pii


@pytest.mark.parametrize("text,card", [
    ("my maestro is 6759 6498 2643 8453", "6759 6498 2643 8453"),
    ("debit card 6304-0000-0000-0000 exp 04/27", "6304-0000-0000-0000"),
    ("5018 0000 0000 0009", "5018 0000 0000 0009"),
    ("карта Мир 2200 0000 0000 0004", "2200 0000 0000 0004"),
    ("RuPay 8171 9999 2766 0000", "8171 9999 2766 0000"),
    ("rupay 6080 0000 0000 0000", "6080 0000 0000 0000"),
])
def test_these_cards_are_found(text, card):
    assert [(m.kind, m.text) for m in detect_pii(text)] == [("card", card)]
    assert "[CARD]" in redact_pii(text)


@pytest.mark.parametrize("text", [
    "order 6759 6498 2643 8454",  # the Luhn check fails
    "ref 2205 0000 0000 0002",  # past Mir's range
    "id 8171 9999 2766 0000 1",  # 17 digits: no RuPay number
])
def test_look_alikes_are_not(text):
    assert [m.kind for m in detect_pii(text)] != ["card"]
