"""Card numbers, IBANs, national IDs and phone numbers: their patterns and checksums."""

from __future__ import annotations

import re
import unicodedata


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
    # Europe's debit cards and the national schemes (these went to the cloud as plain numbers)
    if digits.startswith(_MAESTRO):
        return 13 <= n <= 19  # Maestro
    if 2200 <= p4 <= 2204:
        return 16 <= n <= 19  # Mir
    if p2 in (60, 81, 82) or digits.startswith("508"):
        return n == 16  # RuPay
    return False


_MAESTRO = ("5018", "5020", "5038", "5893", "6304", "6759", "6761", "6762", "6763")


def iban_ok(compact: str) -> bool:
    """ISO 13616: move the first four characters to the end, letters to 10..35, mod 97 == 1."""
    if not 15 <= len(compact) <= 34:
        return False
    moved = compact[4:] + compact[:4]
    number = "".join(str(int(ch, 36)) for ch in moved)
    return int(number) % 97 == 1


# Every unbounded run below starts where a run of its characters starts (a lookbehind for the same
# class) or is bounded, so that a scan is linear in the prompt: a 1 MB prompt takes well under a
# second whatever it holds (an unanchored e-mail pattern took minutes on "1-1-1-...").
# not after "+": +49 151 12345678 is a phone number, whatever its Luhn sum
_CARD = re.compile(r"(?<![\d+-])\d(?:[ -]?\d){12,18}(?![\d-])")
# ISO 13616 paper format groups by four with spaces; dashes and lower case are seen in the wild
_IBAN = re.compile(
    r"(?<![\w-])[A-Z]{2}\d{2}(?:[ -]?[A-Z0-9]{4}){2,7}(?:[ -]?[A-Z0-9]{1,3})?(?![\w-])", re.IGNORECASE
)
_SSN = re.compile(r"(?<![\d-])(?!000|666|9\d\d)\d{3}([- ])(?!00)\d{2}\1(?!0000)\d{4}(?![\d-])")
_SSN_KEYWORD = re.compile(
    r"\b(?:ssn|social security(?: number| no\.?)?)[ \t]{0,3}(?:#|:|is)?[ \t]{0,3}"
    r"(?P<num>(?!000|666|9\d\d)\d{3}(?!00)\d{2}(?!0000)\d{4})\b", re.IGNORECASE
)
_NINO = re.compile(
    r"\b(?!BG|GB|NK|KN|TN|NT|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b",
    re.IGNORECASE,
)
_PHONE = re.compile(
    # not after "#": order #123-456-7890, ticket #0171 234 5678 are references ("phone #555-123-4567"
    # is found by the phone word below)
    r"(?<![\w+#])(?:"
    # +44 20 7946 0958, (+49) 30 1234567, and DIN 5008's old +49 (0)711 / 123 45-67
    r"(?:\+\d{1,3}|\(\+\d{1,3}\))[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:(?:[ .-]| ?/ ?)?\d{2,4}){1,4}"
    # the same after the international prefix 00 (0049 30 1234567, 0049 (0)711 / 123 45-67): a
    # separator after the country code and no 0 after it, so that a run of digits (00491234...)
    # or of zero-padded numbers (0010 0020 0030) is no phone
    r"|(?<![.,])00[1-9]\d{0,2}[ .-](?:\(\d{1,4}\)[ .-]?)?[1-9]\d{0,3}(?:(?:[ .-]| ?/ ?)?\d{2,4}){1,4}"
    r"|(?:1[ .-]?)?\(\d{3}\) ?\d{3}[ .-]\d{4}"  # (555) 123-4567
    r"|(?:1([ .-]))?\d{3}([ .-])\d{3}\2\d{4}"  # 555-123-4567, 555.123.4567, 555 123 4567
    r"|0\d([ .])\d{2}\3\d{2}\3\d{2}\3\d{2}"  # 06 12 34 56 78
    r"|0\d{2} \d{4} \d{4}|0\d{3} \d{3} \d{4}|0\d{4} \d{3} ?\d{3}"  # UK: 020 7946 0958, 07700 900123
    r"|\(0\d\) ?\d{4}[ -]?\d{4}|0\d \d{4} \d{4}|04\d{2} \d{3} \d{3}"  # AU: (02) 9876 5432, 0412 345 678
    # German and Austrian area code and slash: 030/1234567, 0711 / 123 45 67, 030 / 12 34 56 7,
    # 030/123456-0; not a path's part, an order number (#030/12345), a month (01/2024 1234) nor a
    # day (05/12 2024: two digits after the slash only after a 3- to 5-digit area code)
    r"|(?<![/.#])(?!0\d ?/ ?(?:19|20)\d\d\b)(?:0\d{1,4} ?/ ?\d{3,8}|0\d{2,4} ?/ ?\d\d(?=[ -]\d))"
    r"(?:[ -]\d{1,8}){0,4}(?!/)"
    # an area code in brackets: (030) 1234567, (0711) 123 45 67, (089) 123456-0
    r"|\(0\d{1,4}\) ?\d{2,8}(?:[ -]\d{1,8}){0,4}"
    r")(?![\w-])"
)
# a number right after a phone word, in any format: "call me on 5551234567", "tel. 030 1234567"
_PHONE_KEYWORD = re.compile(
    r"\b(?:phone|telephone|tel|mobile|cell ?phone|call me|text me|ring me|sms|whatsapp|fax)"
    r"(?:[ \t]{0,3}(?:no|number|nr|#))?\.?[ \t]{0,3}(?::|is|at|on)?[ \t]{0,3}#?"
    r"(?P<num>\+?\(?\d[\d ().-]{6,22}\d)(?![\w-])",
    re.IGNORECASE,
)


def _digits(text: str) -> str:
    """The decimal digits in ``text`` as ASCII: ``\\d`` also matches other scripts' digits (Arabic-Indic,
    full-width ４１１１), which the prefix checks compare as "0".."9"."""
    return "".join(str(unicodedata.decimal(ch)) for ch in text if ch.isdecimal())


def _cards(text: str) -> list[tuple[int, int]]:
    out = []
    for m in _CARD.finditer(text):
        d = _digits(m.group())
        if 13 <= len(d) <= 19 and _card_prefix_ok(d) and luhn_ok(d):
            out.append(m.span())
    return out


def _ibans(text: str) -> list[tuple[int, int]]:
    out = []
    for m in _IBAN.finditer(text):
        # the pattern may have taken a word after the IBAN as one more group of four ("BE68 5390
        # 0754 7034 with"): drop groups from the end until the checksum holds
        groups = list(re.finditer(r"[A-Za-z0-9]+", m.group()))
        for n in range(len(groups), 0, -1):
            compact = "".join(g.group() for g in groups[:n]).upper()
            if iban_ok(compact):
                out.append((m.start(), m.start() + groups[n - 1].end()))
                break
    return out


def _national_ids(text: str) -> list[tuple[int, int]]:
    spans = [m.span() for r in (_SSN, _NINO) for m in r.finditer(text)]
    return spans + [m.span("num") for m in _SSN_KEYWORD.finditer(text)]


def _phone_length_ok(number: str) -> bool:
    """8 to 15 digits (E.164's most); after the prefix 00, 9 at least besides it ("version 0012
    3456" is no number abroad: a country code and 5 digits)."""
    n = len(_digits(number))
    if number.startswith("00"):
        return 9 <= n - 2 <= 15
    return 8 <= n <= 15


def _phones(text: str) -> list[tuple[int, int]]:
    spans = [m.span() for m in _PHONE.finditer(text) if _phone_length_ok(m.group())]
    return spans + [
        m.span("num") for m in _PHONE_KEYWORD.finditer(text) if 7 <= len(_digits(m.group("num"))) <= 15
    ]
