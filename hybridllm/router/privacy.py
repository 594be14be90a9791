"""Personal data and secrets in prompts: detect them, or redact them before the cloud sees them.

Each detector is a regex for the shape plus, where the format has one, its checksum, so that
look-alikes (order numbers, version strings, random 16-digit numbers) are not flagged:

    card       13-19 digits, a known issuer prefix, and the Luhn check
    iban       country code, 2 check digits, BBAN; moved-digits number mod 97 == 1 (ISO 13616)
    national_id  US SSN (area not 000/666/9xx, group not 00, serial not 0000), UK NINO
    phone      +country code, (NNN) NNN-NNNN / NNN-NNN-NNNN, or 0N NN NN NN NN
    email      local@domain.tld
    secret     well-known API-key prefixes, private-key blocks, JWTs, key=value assignments
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .._types import Message

PII_KINDS = ("secret", "iban", "card", "national_id", "email", "phone")
PLACEHOLDER = {
    "secret": "[SECRET]",
    "iban": "[IBAN]",
    "card": "[CARD]",
    "national_id": "[NATIONAL_ID]",
    "email": "[EMAIL]",
    "phone": "[PHONE]",
}


@dataclass(frozen=True)
class PIIMatch:
    kind: str
    start: int
    end: int
    text: str


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card_prefix_ok(digits: str) -> bool:
    n, p2, p4 = len(digits), int(digits[:2]), int(digits[:4])
    if digits[0] == "4":
        return n in (13, 16, 19)  # Visa
    if 51 <= p2 <= 55 or 2221 <= p4 <= 2720:
        return n == 16  # Mastercard
    if p2 in (34, 37):
        return n == 15  # American Express
    if digits.startswith(("6011", "65")) or 644 <= int(digits[:3]) <= 649:
        return 16 <= n <= 19  # Discover
    if 3528 <= p4 <= 3589:
        return 16 <= n <= 19  # JCB
    if p2 in (36, 38, 39) or 300 <= int(digits[:3]) <= 305:
        return 14 <= n <= 19  # Diners Club
    if p2 == 62:
        return 16 <= n <= 19  # UnionPay
    return False


def iban_ok(compact: str) -> bool:
    """ISO 13616: move the first four characters to the end, letters to 10..35, mod 97 == 1."""
    if not 15 <= len(compact) <= 34:
        return False
    moved = compact[4:] + compact[:4]
    number = "".join(str(int(ch, 36)) for ch in moved)
    return int(number) % 97 == 1


_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])")
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b")
_SSN = re.compile(r"(?<![\d-])(?!000|666|9\d\d)\d{3}([- ])(?!00)\d{2}\1(?!0000)\d{4}(?![\d-])")
_SSN_KEYWORD = re.compile(
    r"\b(?:ssn|social security(?: number| no\.?)?)\s*(?:#|:|is)?\s*"
    r"(?P<num>(?!000|666|9\d\d)\d{3}(?!00)\d{2}(?!0000)\d{4})\b", re.IGNORECASE
)
_NINO = re.compile(
    r"\b(?!BG|GB|NK|KN|TN|NT|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b"
)
_EMAIL = re.compile(
    r"\b[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b"
)
_PHONE = re.compile(
    r"(?<![\w+])(?:"
    r"\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]?\d{2,4}){1,4}"  # +44 20 7946 0958
    r"|\(\d{3}\) ?\d{3}[ .-]\d{4}"  # (555) 123-4567
    r"|\d{3}([.-])\d{3}\1\d{4}"  # 555-123-4567, 555.123.4567
    r"|0\d([ .])\d{2}\2\d{2}\2\d{2}\2\d{2}"  # 06 12 34 56 78
    r")(?![\w-])"
)
_SECRET = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)"
    r"|\b(?:sk|rk|pk)-(?:proj-|live-|test-|ant-)?[A-Za-z0-9_-]{20,}"
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"
    r"|\bgh[pousr]_[A-Za-z0-9]{30,}\b|\bgithub_pat_[A-Za-z0-9_]{30,}"
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"
    r"|\bAIza[0-9A-Za-z_-]{35}"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
)
_ASSIGNMENT = re.compile(
    r"\b(?:api[_-]?key|secret(?:[_-]?key)?|access[_-]?token|auth[_-]?token|token|password|passwd|"
    r"pwd|client[_-]?secret)\b[\"']?\s*[:=]\s*[\"']?([^\s\"',;]{8,})",
    re.IGNORECASE,
)


def _digits(text: str) -> str:
    return "".join(ch for ch in text if ch.isdigit())


def _cards(text: str) -> list[tuple[int, int]]:
    out = []
    for m in _CARD.finditer(text):
        d = _digits(m.group())
        if 13 <= len(d) <= 19 and _card_prefix_ok(d) and luhn_ok(d):
            out.append(m.span())
    return out


def _ibans(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in _IBAN.finditer(text) if iban_ok(m.group().replace(" ", ""))]


def _national_ids(text: str) -> list[tuple[int, int]]:
    spans = [m.span() for r in (_SSN, _NINO) for m in r.finditer(text)]
    return spans + [m.span("num") for m in _SSN_KEYWORD.finditer(text)]


def _phones(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in _PHONE.finditer(text) if 8 <= len(_digits(m.group())) <= 15]


def _secrets(text: str) -> list[tuple[int, int]]:
    spans = [m.span() for m in _SECRET.finditer(text)]
    for m in _ASSIGNMENT.finditer(text):
        value = m.group(1)
        # a real secret mixes letters and digits; "token = tokenizer.encode" does not
        if any(c.isdigit() for c in value) and any(c.isalpha() for c in value) and "(" not in value:
            spans.append(m.span(1))
    return spans


_DETECTORS: dict[str, Callable[[str], list[tuple[int, int]]]] = {
    "secret": _secrets,
    "iban": _ibans,
    "card": _cards,
    "national_id": _national_ids,
    "email": lambda t: [m.span() for m in _EMAIL.finditer(t)],
    "phone": _phones,
}


def detect_pii(text: str, *, kinds: Sequence[str] = PII_KINDS) -> list[PIIMatch]:
    """Non-overlapping matches in text order; on overlap the earlier kind in ``PII_KINDS`` wins."""
    unknown = set(kinds) - set(PII_KINDS)
    if unknown:
        raise ValueError(f"Unknown PII kind(s) {sorted(unknown)}; known: {', '.join(PII_KINDS)}.")
    taken: list[PIIMatch] = []
    for kind in PII_KINDS:
        if kind not in kinds:
            continue
        for start, end in _DETECTORS[kind](text):
            if all(end <= t.start or start >= t.end for t in taken):
                taken.append(PIIMatch(kind, start, end, text[start:end]))
    return sorted(taken, key=lambda m: m.start)


def redact_pii(text: str, *, kinds: Sequence[str] = PII_KINDS) -> str:
    """``text`` with every detected item replaced by a placeholder such as ``[EMAIL]``."""
    out, last = [], 0
    for m in detect_pii(text, kinds=kinds):
        out.append(text[last : m.start])
        out.append(PLACEHOLDER[m.kind])
        last = m.end
    out.append(text[last:])
    return "".join(out)


def pii_kinds_in_messages(messages: Sequence[Message]) -> list[str]:
    found = {m.kind for msg in messages for m in detect_pii(str(msg.get("content", "")))}
    return [k for k in PII_KINDS if k in found]


def redact_messages(messages: Sequence[Message]) -> list[Message]:
    return [{**msg, "content": redact_pii(str(msg.get("content", "")))} for msg in messages]
