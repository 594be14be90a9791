"""Personal data and secrets in prompts: detect them, or redact them before the cloud sees them.

Each detector is a regex for the shape plus, where the format has one, its checksum, so that
look-alikes (order numbers, version strings, random 16-digit numbers) are not flagged:

    card       13-19 digits, a known issuer prefix, and the Luhn check
    iban       country code, 2 check digits, BBAN, any case, spaces or dashes; moved-digits
               number mod 97 == 1 (ISO 13616)
    national_id  US SSN (area not 000/666/9xx, group not 00, serial not 0000), UK NINO
    phone      +country code (or 0049-style), (NNN) NNN-NNNN / NNN-NNN-NNNN / NNN NNN NNNN,
               0N NN NN NN NN, UK and Australian national numbers, German ones with a slash or
               brackets (030/1234567, (030) 123 45 67), or any number right after a phone word
               ("call me on ...")
    email      local@domain.tld (Unicode too), or spelled out: "a [at] b [dot] com"; not an
               SCP-style remote (me@host.org:~/repo), Git's account (git@github.com:org/x.git)
               nor a URL's user name (https://jane@github.com)
    ip_address a public IPv4 or IPv6 address (a person's connection); not private, loopback,
               documentation or multicast ranges, networks (10.0.0.0/8), public DNS resolvers
               (8.8.8.8, 1.1.1.1), nor a version after "v", "version" or "==" (v1.2.3.4), or
               that an upgrade goes to or from ("upgrade to 1.2.3.4")
    secret     well-known API-key prefixes, private-key blocks, JWTs, Authorization headers and
               bearer tokens, credentials in URLs, and key=value / "password: ..." assignments

Names and street addresses need a language model (Presidio's NER) and are not detected. Messages
are scanned one by one and joined, so a value split across two consecutive turns is found too.

Two ways to take values out:

    redact_pii / redact_messages   one-way: every value of a kind becomes the same ``[EMAIL]``
    pseudonymize_messages          reversible: each distinct value gets its own numbered
                                   placeholder (``[EMAIL_1]``, ``[EMAIL_2]``) and the map back,
                                   which :class:`Restorer` applies to the cloud's answer
"""

from __future__ import annotations

import bisect
import ipaddress
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .._types import USER_TEXT, Message, private_repr

PII_KINDS = ("secret", "iban", "card", "national_id", "email", "phone", "ip_address")
PLACEHOLDER = {
    "secret": "[SECRET]",
    "iban": "[IBAN]",
    "card": "[CARD]",
    "national_id": "[NATIONAL_ID]",
    "email": "[EMAIL]",
    "phone": "[PHONE]",
    "ip_address": "[IP_ADDRESS]",
}


@dataclass(frozen=True)
class PIIMatch:
    kind: str
    start: int
    end: int
    text: str = field(metadata=USER_TEXT)  # the personal value itself: in repr by its length only

    __repr__ = private_repr


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
# Unicode letters and digits (IDN addresses: jürgen@müller.de), any case; RFC 5321's lengths
_EMAIL = re.compile(
    r"(?<![\w.%+'-])[\w%+'-][\w.%+'-]{0,63}@(?:[^\W_][\w-]{0,62}\.){1,8}"
    r"(?:[^\W\d_]{2,63}|xn--[\w-]{2,59})(?![\w-])"
)
# Spelled-out addresses: "jane.doe [at] example [dot] com", "jane dot doe at example dot com".
# A plain " at " needs a spelled " dot " and a common top-level domain, and a local part that is
# not a verb or pronoun ("look at example dot com" is a sentence, not an address).
_AT = r"(?:[ \t]{0,3}[\[({<][ \t]?at[ \t]?[\])}>][ \t]{0,3}|[ \t]{1,3}at[ \t]{1,3})"
_DOT = r"(?:[ \t]{0,3}[\[({<][ \t]?dot[ \t]?[\])}>][ \t]{0,3}|[ \t]{1,3}dot[ \t]{1,3})"
_EMAIL_SPELLED = re.compile(
    rf"(?<![\w.+-])(?!(?:look|looking|looked|sign|signed|log|logged|me|us|them|him|her|it|is|are|was|"
    rf"be|here|there|find|found|go|visit|available|online|live|hosted|up|out|in|on|site|page|"
    rf"website|arrive|arrived|stop|stay|meet)\b)"
    rf"[\w+-]{{1,64}}(?:(?:\.|{_DOT})[\w+-]{{1,64}}){{0,3}}"
    rf"(?:[ \t]{{0,3}}[\[({{<][ \t]?at[ \t]?[\])}}>][ \t]{{0,3}}"
    rf"(?:[^\W_][\w-]{{0,62}}(?:\.|{_DOT})){{1,4}}[^\W\d_]{{2,24}}"
    rf"|[ \t]{{1,3}}at[ \t]{{1,3}}(?!(?:the|a|an|this|that|my|your|our|least|most|all|home|work|"
    rf"night|first|last|once)\b)(?:[^\W_][\w-]{{0,62}}{_DOT}){{1,4}}"
    rf"(?:com|org|net|edu|gov|mil|int|io|co|uk|de|fr|es|it|nl|be|ch|at|se|no|dk|fi|ie|pl|pt|ca|au|"
    rf"nz|jp|cn|in|br|ru|us|eu|info|biz|me|ai|dev|app))(?![\w-])",
    re.IGNORECASE,
)
_PHONE = re.compile(
    r"(?<![\w+])(?:"
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
    r"(?:[ \t]{0,3}(?:no|number|nr|#))?\.?[ \t]{0,3}(?::|is|at|on)?[ \t]{0,3}"
    r"(?P<num>\+?\(?\d[\d ().-]{6,22}\d)(?![\w-])",
    re.IGNORECASE,
)
_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")
_PRIVATE_KEY_END = re.compile(r"-----END [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----")
_SECRET = re.compile(
    r"(?<![\w-])(?:sk|rk|pk)-(?:proj-|live-|test-|ant-)?[A-Za-z0-9_-]{20,}"
    r"|(?<![\w-])[rsp]k_(?:live|test)_[A-Za-z0-9]{16,}"  # Stripe
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"
    r"|\bgh[pousr]_[A-Za-z0-9]{30,}\b|\bgithub_pat_[A-Za-z0-9_]{30,}"
    r"|(?<![\w-])glpat-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|\bhf_[A-Za-z0-9]{30,}|\bnpm_[A-Za-z0-9]{36}"  # Hugging Face, npm
    r"|(?<![\w-])xox[abeprs]-[A-Za-z0-9-]{10,}|(?<![\w-])xapp-\d-[A-Za-z0-9-]{10,}"  # Slack
    r"|\bSG\.[\w-]{22}\.[\w-]{43}"  # SendGrid
    r"|\bAIza[0-9A-Za-z_-]{35}|\bya29\.[\w-]{20,}"  # Google
    r"|(?<![\w-])eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"  # JWT
    # credentials in a URL: postgres://admin:s3cret@db.example.com
    r"|(?<=://)[^\s/:@]{1,256}:[^\s/@]{1,256}(?=@)"
    # an Authorization header's credentials, whatever their shape
    r"|(?<=Authorization:)[ \t]{0,3}(?:Bearer|Basic|Token|Bot)?[ \t]{0,3}[A-Za-z0-9._~+/=-]{8,}"
)
_BEARER = re.compile(r"\bbearer[ \t]{1,3}(?P<v>[A-Za-z0-9._~+/-]{16,}=*)", re.IGNORECASE)
_PASSWORD_KEYS = ("password", "passwd", "passphrase", "pwd")
# a name that ends in a secret's name (DB_PASSWORD, OPENAI_API_KEY, aws_secret_access_key), then
# ":", "=", ":=", "=>" (or, after a password, "is"), then the value, quoted or not
_ASSIGNMENT = re.compile(
    r"(?<![\w-])(?:[A-Za-z0-9]{1,40}[_.-]){0,4}"
    r"(?P<key>api[_ -]?key|apikey|secret(?:[_-]?(?:access[_-]?)?key)?|access[_-]?(?:key|token)|"
    r"auth[_-]?token|refresh[_-]?token|token|password|passwd|passphrase|pwd|client[_-]?secret|"
    r"private[_-]?key)(?![\w-])[\"']?"
    r"(?P<sep>[ \t]{0,3}(?::=|=>|[:=])[ \t]{0,3}|[ \t]{1,3}is[ \t]{1,3})"
    r"(?P<q>[\"'`]?)(?P<v>[^\s\"'`,;]{4,512})",
    re.IGNORECASE,
)
# what fills a secret's place in code and docs without being one
_NOT_A_VALUE = re.compile(
    r"<.*>|\$\{?\w+\}?|\*+|\.{3,}|[A-Z][A-Z0-9_]*|[A-Za-z_]+(?:\.[A-Za-z_]+)+"
    r"|(?i:x{4,}|(?:your|my)[_-]?\w*|str|string|bytes|int|none|null|nil|true|false|required|"
    r"optional(?:\[.*)?|secretstr|hidden|redacted|changeme|example|placeholder)"
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


# host:org/repo.git, host:~/repo, host:/srv/repo; not a URL's port (db.example.com:5432/app)
_SCP_PATH = re.compile(r":(?!\d+/)~?[\w.-]{0,100}/")


# an image at a pixel density (logo@2x.png, icon@1.5x.webp: web and app assets); no such TLD exists
_DENSITY_IMAGE = re.compile(r"@\d+(?:\.\d+)?x\.(?:png|jpe?g|gif|webp|svg|avif|bmp|ico|tiff?|heic)$",
                            re.IGNORECASE)


def _url_user(text: str, start: int, end: int) -> bool:
    """Whether ``text[start:end]`` is the user and host right after a URL's scheme; not where a
    second "@" follows (https://jane@gmail.com@host: the user name is an address)."""
    return text.endswith("://", 0, start) and not text.startswith("@", end)


def _emails(text: str) -> list[tuple[int, int]]:
    # an SCP-style remote (me@host.org:~/repo, ":" and a path right after the host), Git's
    # service account (git@github.com, ssh://git@gitlab.com/...) and a URL's user name
    # (https://jane@github.com/org/x) are logins, not a mailbox
    spans = [m.span() for m in _EMAIL.finditer(text)
             if not _SCP_PATH.match(text, m.end()) and not m.group().startswith("git@")
             and not _DENSITY_IMAGE.search(m.group()) and not _url_user(text, *m.span())]
    if re.search(r"(?i)\bat\b", text):  # the spelled-out form only where it can be
        spans += [m.span() for m in _EMAIL_SPELLED.finditer(text)]
    return spans


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


def _private_keys(text: str) -> list[tuple[int, int]]:
    """From each BEGIN ... PRIVATE KEY line to its END line, or to the end of a pasted fragment."""
    spans, pos = [], 0
    while (begin := _PRIVATE_KEY.search(text, pos)) is not None:
        end = _PRIVATE_KEY_END.search(text, begin.end())
        stop = end.end() if end is not None else len(text)
        spans.append((begin.start(), stop))
        pos = stop
    return spans


def _secret_value(key: str, sep: str, quoted: bool, value: str, at_line_end: bool) -> bool:
    if "(" in value or "[" in value or "{" in value or _NOT_A_VALUE.fullmatch(value):
        return False
    if key.lower() == "pwd" and value.startswith(("/", "~/")):  # PWD=/home/jane/app: the shell's
        return False  # working directory (env dumps, CI logs), not a password
    letters, digits = any(c.isalpha() for c in value), any(c.isdigit() for c in value)
    if len(value) >= 8 and letters and digits:  # "token = tokenizer.encode" has no digit
        return True
    if key.lower() not in _PASSWORD_KEYS:
        return False
    symbols = any(not c.isalnum() and c not in "_." for c in value)
    if sep.strip().lower() == "is":  # "my password is hunter2", not "the password is incorrect"
        # nor a question or exclamation ("what if my password is hacked?", "... is wrong!")
        symbols = any(not c.isalnum() and c not in "_." for c in value.rstrip("?!"))
        return quoted or digits or symbols
    if not quoted and value[-1] in "?!" and not digits:  # "password: hacked?", as for "is" above
        return any(not c.isalnum() and c not in "_." for c in value.rstrip("?!"))
    if quoted or digits or symbols:
        return True
    # an unquoted word: a password when it ends the line ("password: hunter"), unless it is a
    # variable in code ("password = pwd")
    code_variable = sep.strip() == "=" and key.islower() and re.fullmatch(r"[a-z_][a-z0-9_]*", value)
    return at_line_end and not code_variable


def _secrets(text: str) -> list[tuple[int, int]]:
    spans = [m.span() for m in _SECRET.finditer(text)] + _private_keys(text)
    for m in _BEARER.finditer(text):
        value = m.group("v")
        if any(c.isdigit() for c in value) and any(c.isalpha() for c in value):
            spans.append(m.span("v"))
    for m in _ASSIGNMENT.finditer(text):
        value, quoted = m.group("v"), bool(m.group("q"))
        rest = text[m.end("v") : m.end("v") + 2]
        at_line_end = rest[:1] in ("", "\n", "\r") or (quoted and rest[1:2] in ("", "\n", "\r"))
        if _secret_value(m.group("key"), m.group("sep"), quoted, value, at_line_end):
            spans.append(m.span("v"))
    return spans


# four octets 0-255 without leading zeros, not part of a longer dotted run (an OID, 1.2.3.4.5)
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = re.compile(rf"(?<![\w.-])(?:{_OCTET}\.){{3}}{_OCTET}(?![\w-]|\.\w)")
# hex groups with at least two colons, bounded (a scan stays linear); ipaddress decides the rest
_IPV6 = re.compile(r"(?<![\w:.])[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?![\w:])")
# a number after these is a version (v1.2.3.4, version 4.2.1.0, ==1.0.2.3), not an address; so is
# one an upgrade goes to or from ("upgrade to 1.2.3.4", "bump numpy from 1.2.3.4 to 1.2.3.5"), but
# not one a record is updated to ("update the A record to 81.2.69.160": only "update to" counts)
_VERSION_CUE = re.compile(
    r"(?i)(?:\bv|\bversion|\bver\.?|\brelease|\bbuild|[=<>~^!]=?"
    r"|\b(?:up|down)grad(?:e|es|ed|ing):?(?:[ \t]+\S{1,40}){0,3}?[ \t]+(?:to|from)"
    r"|\bbump(?:s|ed|ing)?(?:[ \t]+\S{1,40}){0,3}?[ \t]+(?:to|from)"
    r"|\bupdat(?:e|es|ed|ing)[ \t]+(?:to|from))[ \t]{0,2}$"
)
# well-known public DNS resolvers: a server everyone uses, not a person's connection
_RESOLVERS = frozenset({
    "8.8.8.8", "8.8.4.4", "1.1.1.1", "1.0.0.1", "9.9.9.9", "149.112.112.112", "208.67.222.222",
    "208.67.220.220", "2001:4860:4860::8888", "2001:4860:4860::8844", "2606:4700:4700::1111",
    "2606:4700:4700::1001", "2620:fe::fe", "2620:fe::9",
})
_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")


def _ip_addresses(text: str) -> list[tuple[int, int]]:
    out = []
    for m in _IPV4.finditer(text):
        network = re.match(r"/(\d{1,2})\b", text[m.end() : m.end() + 3])
        if network and network.group(1) != "32":  # 81.2.0.0/16: a network, no one's address
            continue
        if _VERSION_CUE.search(text[max(0, m.start() - 100) : m.start()]):
            continue
        addr = ipaddress.IPv4Address(m.group())
        if addr.is_global and not addr.is_multicast and m.group() not in _RESOLVERS:
            out.append(m.span())
    if text.count(":") >= 2:  # an IPv6 address has at least two colons
        for m in _IPV6.finditer(text):
            try:
                addr6 = ipaddress.IPv6Address(m.group())
            except ValueError:  # 12:30:45, a MAC address, C++'s a::b...
                continue
            network = re.match(r"/(\d{1,3})\b", text[m.end() : m.end() + 4])
            if network and network.group(1) != "128":  # 2a00:1450::/32: a network, as for IPv4
                continue
            if addr6 in _GLOBAL_UNICAST and addr6.is_global and str(addr6) not in _RESOLVERS:
                out.append(m.span())
    return out


_DETECTORS: dict[str, Callable[[str], list[tuple[int, int]]]] = {
    "secret": _secrets,
    "iban": _ibans,
    "card": _cards,
    "national_id": _national_ids,
    "email": _emails,
    "phone": _phones,
    "ip_address": _ip_addresses,
}


def detect_pii(text: str, *, kinds: Sequence[str] = PII_KINDS) -> list[PIIMatch]:
    """Non-overlapping matches in text order. Matches that overlap are merged into one that covers
    them all, of the earliest of their kinds in ``PII_KINDS`` (so a redaction leaves no part of
    either: "postgres://admin:s3cret@db.example.com" is a secret up to the host's end)."""
    unknown = set(kinds) - set(PII_KINDS)
    if unknown:
        raise ValueError(f"Unknown PII kind(s) {sorted(unknown)}; known: {', '.join(PII_KINDS)}.")
    spans = sorted(
        (start, end, rank)
        for rank, kind in enumerate(PII_KINDS)
        if kind in kinds
        for start, end in _DETECTORS[kind](text)
        if end > start
    )
    return _merged(spans, text)


def _merged(spans: Sequence[tuple[int, int, int]], text: str) -> list[PIIMatch]:
    """``(start, end, rank)`` spans sorted by start, overlapping ones merged into one span of the
    lowest rank (the earliest kind in ``PII_KINDS``): one pass."""
    merged: list[list[int]] = []
    for start, end, rank in spans:
        if merged and start < merged[-1][1]:
            last = merged[-1]
            last[1], last[2] = max(last[1], end), min(last[2], rank)
        else:
            merged.append([start, end, rank])
    return [PIIMatch(PII_KINDS[rank], start, end, text[start:end]) for start, end, rank in merged]


def redact_pii(text: str, *, kinds: Sequence[str] = PII_KINDS) -> str:
    """``text`` with every detected item replaced by its kind's placeholder such as ``[EMAIL]``
    (one-way: two different addresses both become ``[EMAIL]``; for logs and stores)."""
    return _redact(text, detect_pii(text, kinds=kinds))


def _redact(text: str, matches: Sequence[PIIMatch]) -> str:
    out, last = [], 0
    for m in matches:
        out.append(text[last : m.start])
        out.append(PLACEHOLDER[m.kind])
        last = m.end
    out.append(text[last:])
    return "".join(out)


def _matches_in_messages(messages: Sequence[Message]) -> list[list[PIIMatch]]:
    """Each message's matches, where a value may also run from one message into the next (the
    cloud reads the turns together: "my card is 4111 1111" then "1111 1111"), or a turn may hold
    a keyword whose number is in the next: each message gets its part of such a match."""
    texts = [str(msg.get("content", "")) for msg in messages]
    found = [detect_pii(t) for t in texts]
    if len(texts) < 2:
        return found
    starts, pos = [], 0
    for t in texts:
        starts.append(pos)
        pos += len(t) + 1  # joined by one space
    for m in detect_pii(" ".join(texts)):
        i = bisect.bisect_right(starts, m.start) - 1
        for j in range(i, len(texts)):
            lo, hi = max(m.start - starts[j], 0), min(m.end - starts[j], len(texts[j]))
            if hi > lo:
                found[j].append(PIIMatch(m.kind, lo, hi, texts[j][lo:hi]))
            if m.end <= starts[j] + len(texts[j]):
                break
    rank = {k: i for i, k in enumerate(PII_KINDS)}
    return [_merged(sorted((m.start, m.end, rank[m.kind]) for m in ms), t)
            for ms, t in zip(found, texts, strict=True)]


def redaction_note(kinds: Sequence[str]) -> str:
    """What a reason adds once the cloud is sent placeholders for values of these kinds. Only a
    request that reaches the cloud says so: one the device answers after all (the budget is
    spent, the cloud is down, a cascade's device answer is kept) sent nothing anywhere."""
    return f"; {', '.join(kinds)} redacted for the cloud"


def pii_kinds_in_messages(messages: Sequence[Message]) -> list[str]:
    """The kinds found in any message: system, assistant and tool turns too, not only the user's."""
    found = {m.kind for ms in _matches_in_messages(messages) for m in ms}
    return [k for k in PII_KINDS if k in found]


def redact_messages(messages: Sequence[Message]) -> list[Message]:
    """Every message with each detected item replaced by its placeholder."""
    return [
        {**msg, "content": _redact(str(msg.get("content", "")), ms)}
        for msg, ms in zip(messages, _matches_in_messages(messages), strict=True)
    ]


# -- reversible redaction: numbered placeholders, restored in the answer ---------------------------


def _identity(kind: str, value: str) -> str:
    """What makes two matches the same value: an address in any case, a number in any grouping
    ("555-123-4567" and "555 123 4567"), a secret character for character."""
    if kind == "email":
        return value.casefold()
    if kind == "ip_address":  # 2001:DB8::1 and 2001:db8:0::1 are one address
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            return value
    if kind in ("phone", "card", "iban", "national_id"):  # ４１１１ (full-width) is 4111 too
        return "".join(str(unicodedata.decimal(ch)) if ch.isdecimal() else ch
                       for ch in value.upper() if ch.isalnum())
    return value


def pseudonymize_messages(messages: Sequence[Message]) -> tuple[list[Message], dict[str, str]]:
    """Every message with each detected item replaced by a numbered placeholder, and the map from
    placeholder (``"[EMAIL_1]"``) to the value it stands for, to keep on the device.

    One value gets one placeholder in every turn it appears in, numbered per kind in order of first
    appearance. A number whose name is anywhere in the prompt already, in any case and with or
    without brackets (the user wrote ``[EMAIL_1]`` or ``email_1``), is skipped, so the cloud's echo
    of the user's own text is never taken for a placeholder."""
    per_message = _matches_in_messages(messages)
    prompt = "\n".join(str(msg.get("content", "")) for msg in messages).casefold()
    names: dict[tuple[str, str], str] = {}
    last = dict.fromkeys(PII_KINDS, 0)
    values: dict[str, str] = {}
    out: list[Message] = []
    for msg, matches in zip(messages, per_message, strict=True):
        text = str(msg.get("content", ""))
        parts, pos = [], 0
        for m in matches:
            key = (m.kind, _identity(m.kind, m.text))
            if key not in names:
                label, n = PLACEHOLDER[m.kind][1:-1], last[m.kind] + 1
                while f"{label}_{n}".casefold() in prompt:
                    n += 1
                last[m.kind] = n
                names[key] = f"[{label}_{n}]"
                values[names[key]] = m.text
            parts += [text[pos : m.start], names[key]]
            pos = m.end
        parts.append(text[pos:])
        out.append({**msg, "content": "".join(parts)} if matches else msg)
    return out, values


class Restorer:
    """Puts the values back into an answer written against numbered placeholders.

    Restored forms: the placeholder itself (``[EMAIL_1]``) and its bare name as a whole word
    (``EMAIL_1``, as in ``<EMAIL_1>`` or ``(EMAIL_1)``), in any letter case. Anything else the model
    may make of it (``EMAIL 1``, ``[EMAIL-1]``, ``the first email``) is left as written.

    ``restore(text)`` does a whole answer. For a stream, ``feed(piece)`` returns what is safe to show
    now: the end of a piece that may be the start of a placeholder (``"write to [EMA"``, or a bare
    ``EMAIL_1`` that may yet become ``EMAIL_12``) is held back until the next piece tells, and
    ``flush()`` returns what is held at the end of the stream."""

    def __init__(self, placeholders: dict[str, str]) -> None:
        self._values = {name.strip("[]").casefold(): value for name, value in placeholders.items()}
        names = sorted(self._values, key=len, reverse=True)  # EMAIL_12 before EMAIL_1
        alt = "|".join(re.escape(n) for n in names)
        self._pattern = re.compile(rf"\[({alt})\]|(?<!\w)({alt})(?!\w)", re.IGNORECASE) if names else None
        self._bracketed = [f"[{n}]" for n in names]
        self._longest = max((len(b) for b in self._bracketed), default=0)
        self._held = ""
        self._before = ""  # the last character shown: whether a bare name may start right after it

    def __repr__(self) -> str:  # the values stay out of logs
        return f"Restorer({len(self._values)} placeholders)"

    def restore(self, text: str) -> str:
        return self._sub(text, 0, len(text))

    def _sub(self, text: str, start: int, end: int) -> str:
        """``text[start:end]`` restored; characters before ``start`` are context only."""
        if self._pattern is None:
            return text[start:end]
        out, pos = [], start
        for m in self._pattern.finditer(text, start, end):
            out += [text[pos : m.start()], self._values[(m.group(1) or m.group(2)).casefold()]]
            pos = m.end()
        out.append(text[pos:end])
        return "".join(out)

    def _may_start(self, text: str, i: int) -> bool:
        """Whether ``text[i:]`` may grow into a placeholder: a proper prefix of ``[NAME]``, or a
        prefix of a bare ``NAME`` (a whole one too: the next character decides) after a non-word."""
        tail = text[i:].casefold()
        if tail[0] == "[":
            return any(b.startswith(tail) and b != tail for b in self._bracketed)
        if i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_"):
            return False
        return any(n.startswith(tail) for n in self._values)

    def feed(self, piece: str) -> str:
        if self._pattern is None:
            return piece
        text = self._before + self._held + piece
        start = len(self._before)
        cut = len(text)
        for i in range(max(start, len(text) - self._longest + 1), len(text)):
            if self._may_start(text, i):
                cut = i
                break
        shown = self._sub(text, start, cut)
        self._held = text[cut:]
        self._before = text[cut - 1] if cut > 0 else self._before
        return shown

    def flush(self) -> str:
        text, self._held = self._before + self._held, ""
        shown = self._sub(text, len(self._before), len(text))
        self._before = text[-1:] or self._before
        return shown

    def cut(self) -> str:
        """The stream broke off: a held piece that is already a whole placeholder (a bare
        ``EMAIL_1`` that might have become ``EMAIL_12``) is restored and returned; one that only
        might have become a placeholder (``[EMA``) is dropped, since no one may see half a
        placeholder. Whoever continues the answer writes on from the text shown, and may go on
        feeding this restorer."""
        held, self._held = self._held, ""
        if not held or self._pattern is None or self._pattern.fullmatch(held) is None:
            return ""
        self._before = held[-1]
        return self._sub(held, 0, len(held))
