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

Separators pasted from web pages and word processors (no-break and thin spaces, en dashes, the
full-width forms of + @ ( ) .) are read as their ASCII forms: "4111\u00a01111..." is a card too.

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
from ._privacy_addresses import _emails, _ip_addresses

# iban_ok, luhn_ok: public names that lived here, re-exported (tests/router/test_privacy.py)
from ._privacy_numbers import _cards, _ibans, _national_ids, _phones, iban_ok, luhn_ok  # noqa: F401
from ._privacy_secrets import _secrets

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


_DETECTORS: dict[str, Callable[[str], list[tuple[int, int]]]] = {
    "secret": _secrets,
    "iban": _ibans,
    "card": _cards,
    "national_id": _national_ids,
    "email": _emails,
    "phone": _phones,
    "ip_address": _ip_addresses,
}


# Unicode separators that pasted numbers carry (a web page's or French typography's no-break
# spaces, a word processor's en dash, full-width forms), one character for one, so that the ASCII
# patterns see "4111\u00a01111..." as "4111 1111..." and every span still indexes the text as given
_SEPARATORS = str.maketrans({
    **dict.fromkeys("\u00a0\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
                    "\u202f\u205f\u3000", " "),
    **dict.fromkeys("\u2010\u2011\u2012\u2013\u2212\ufe63\uff0d", "-"),
    "\uff0b": "+", "\uff20": "@", "\uff08": "(", "\uff09": ")", "\uff0e": ".",
})


def detect_pii(text: str, *, kinds: Sequence[str] = PII_KINDS) -> list[PIIMatch]:
    """Non-overlapping matches in text order. Matches that overlap are merged into one that covers
    them all, of the earliest of their kinds in ``PII_KINDS`` (so a redaction leaves no part of
    either: "postgres://admin:s3cret@db.example.com" is a secret up to the host's end)."""
    unknown = set(kinds) - set(PII_KINDS)
    if unknown:
        raise ValueError(f"Unknown PII kind(s) {sorted(unknown)}; known: {', '.join(PII_KINDS)}.")
    plain = text.translate(_SEPARATORS)  # as long as text: its spans are text's
    spans = sorted(
        (start, end, rank)
        for rank, kind in enumerate(PII_KINDS)
        if kind in kinds
        for start, end in _DETECTORS[kind](plain)
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
    """The kinds found in any message: system, assistant and tool turns too, not only the user's,
    and the arguments of the tools an assistant turn called."""
    found = {m.kind for ms in _matches_in_messages(messages) for m in ms}
    found |= {m.kind for msg in messages for args in _arguments(msg) for m in detect_pii(args)}
    return [k for k in PII_KINDS if k in found]


def _arguments(msg: Message) -> list[str]:
    """The arguments (JSON text) of each tool an assistant turn called."""
    return [str(call["function"].get("arguments") or "") for call in msg.get("tool_calls") or ()]


def _with_arguments(msg: Message, rewrite: Callable[[str], str]) -> Message:
    """``msg`` with each of its tool calls' arguments rewritten (a copy; ``msg`` as it is when it
    called none)."""
    if not msg.get("tool_calls"):
        return msg
    calls = [{**call, "function": {**call["function"], "arguments": rewrite(args)}}
             for call, args in zip(msg["tool_calls"], _arguments(msg), strict=True)]
    return {**msg, "tool_calls": calls}


def redact_messages(messages: Sequence[Message]) -> list[Message]:
    """Every message with each detected item replaced by its placeholder (in the arguments of the
    tools a turn called too)."""
    return [
        _with_arguments({**msg, "content": _redact(str(msg.get("content", "")), ms)}, redact_pii)
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
    prompt = "\n".join([str(msg.get("content", "")) for msg in messages]
                       + [args for msg in messages for args in _arguments(msg)]).casefold()
    names: dict[tuple[str, str], str] = {}
    last = dict.fromkeys(PII_KINDS, 0)
    values: dict[str, str] = {}

    def pseudonymized(text: str, matches: Sequence[PIIMatch]) -> str:
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
        return "".join(parts)

    out: list[Message] = []
    for msg, matches in zip(messages, per_message, strict=True):
        turn = {**msg, "content": pseudonymized(str(msg.get("content", "")), matches)} if matches else msg
        # the values in the arguments of an earlier call get the same placeholders; the answer's
        # calls are restored on the device (the pipeline), so the app runs them with the values
        out.append(_with_arguments(turn, lambda args: pseudonymized(args, detect_pii(args))))
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
