"""Secrets: API keys, private-key blocks, tokens, credentials in URLs, key=value assignments."""

from __future__ import annotations

import re

# Every unbounded run below starts where a run of its characters starts (a lookbehind for the same
# class) or is bounded, so that a scan is linear in the prompt: a 1 MB prompt takes well under a
# second whatever it holds (an unanchored e-mail pattern took minutes on "1-1-1-...").
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
    # credentials in a URL: postgres://admin:s3cret@db.example.com, or a password alone
    # (redis://:s3cret@cache:6379, Redis's AUTH without a user name)
    r"|(?<=://)[^\s/:@]{0,256}:[^\s/@]{1,256}(?=@)"
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
