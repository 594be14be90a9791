"""Each PII kind is found, and look-alikes (checksum failures, order numbers, versions) are not."""

from __future__ import annotations

import pytest

from hybridllm.router.privacy import detect_pii, iban_ok, luhn_ok, redact_pii


def kinds(text: str) -> list[str]:
    return [m.kind for m in detect_pii(text)]


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        ("write to jane.doe+news@example.co.uk today", "email", "jane.doe+news@example.co.uk"),
        ("call (415) 555-2671 tonight", "phone", "(415) 555-2671"),
        ("my number is +44 20 7946 0958", "phone", "+44 20 7946 0958"),
        ("ring 415-555-2671", "phone", "415-555-2671"),
        ("portable 06 12 34 56 78", "phone", "06 12 34 56 78"),
        ("card 4111 1111 1111 1111 exp 12/29", "card", "4111 1111 1111 1111"),
        ("amex 378282246310005", "card", "378282246310005"),
        ("pay to GB82 WEST 1234 5698 7654 32", "iban", "GB82 WEST 1234 5698 7654 32"),
        ("IBAN DE89370400440532013000", "iban", "DE89370400440532013000"),
        ("my SSN is 123-45-6789", "national_id", "123-45-6789"),
        ("SSN: 123456789", "national_id", "123456789"),
        ("NI number AB 12 34 56 C", "national_id", "AB 12 34 56 C"),
        ("use sk-proj-Abcdefghijklmnopqrstuv1234 for it", "secret",
         "sk-proj-Abcdefghijklmnopqrstuv1234"),
        ("AWS key AKIAIOSFODNN7EXAMPLE", "secret", "AKIAIOSFODNN7EXAMPLE"),
        ("token ghp_abcdefghijklmnopqrstuvwxyz0123456789", "secret",
         "ghp_abcdefghijklmnopqrstuvwxyz0123456789"),
        ("config: api_key=a8f9d0c1e2b3f4", "secret", "a8f9d0c1e2b3f4"),
        ('password: "Tr0ub4dor&3x"', "secret", "Tr0ub4dor&3x"),
    ],
)
def test_detects(text, kind, value):
    found = detect_pii(text)
    assert [(m.kind, m.text) for m in found] == [(kind, value)]


@pytest.mark.parametrize(
    "text",
    [
        "card 4111 1111 1111 1112 fails Luhn",  # 16 digits, wrong check digit
        "order number 1234567890123456 shipped",  # 16 digits, no issuer, fails Luhn
        "tracking 9400111899223344556677",  # 22 digits
        "upgrade to version 1.2.3 or python 3.11.4",
        "released 2024-01-15, patched 2024-02-01",
        "server at 192.168.1.1 port 8080",
        "ISBN 978-3-16-148410-0",
        "it cost $1,234,567.89 in 1999-2003",
        "pi is 3.14159265358979",
        "bad IBAN GB82 WEST 1234 5698 7654 33",  # mod-97 fails
        "SSN-like 000-12-3456 and 666-12-3456 are never issued",
        "user@localhost is not an address with a domain",
        "token = tokenizer.encode(text)",
        "password: must be at least eight characters",
        "reach me on @handle",
        "Statement 1 | 12 3456 7890 is false",
        "sk-learn is a typo for scikit-learn",
    ],
)
def test_look_alikes_are_not_flagged(text):
    assert kinds(text) == []


def test_redact_replaces_each_kind_and_keeps_the_rest():
    text = "Mail a@b.io, card 4111111111111111, SSN 123-45-6789."
    assert redact_pii(text) == "Mail [EMAIL], card [CARD], SSN [NATIONAL_ID]."


def test_checksums():
    assert luhn_ok("79927398713") and not luhn_ok("79927398710")
    assert iban_ok("GB82WEST12345698765432") and not iban_ok("GB82WEST12345698765433")


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="Unknown PII kind"):
        detect_pii("x", kinds=["dna"])
