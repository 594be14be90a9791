"""What may be shown of a setting or a text: the credentials of URLs (``user:password@``, a key in
the query string) and secrets masked, for logs, terminals and the proxy's answers."""

from __future__ import annotations

import re
from typing import Any

# the userinfo (user:password) of a URL (a cloud endpoint behind basic auth), between "://" and
# the "@" before the host; the last "@" of the authority ends it, as in urllib's netloc
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/?#]*)@")


# a secret in a URL's query string (``?key=``, Azure's ``api-key=``, a SAS ``sig=``, ``token=``): a
# parameter whose name is, or ends in (after - _ or .), one of these words; its value ends at the
# next & or # (or a space or quote, in a message that quotes the URL)
_URL_QUERY_SECRET = re.compile(
    r"(?P<name>[?&;](?:[\w.-]*[-_.])?(?:key|apikey|token|sig|signature|secret|password|passwd|pwd"
    r"|auth|authorization|credentials?)=)[^&;#\s'\"<>]+", re.IGNORECASE)


def split_userinfo(url: str) -> tuple[str, tuple[str, str] | None]:
    """(``url`` without its ``user:password@``, (user, password) percent-decoded, or None when it
    has none): the cloud sends them as basic auth and names the endpoint without them."""
    from urllib.parse import unquote

    m = _URL_USERINFO.match(url)
    if m is None:
        return url, None
    user, _, password = m["userinfo"].partition(":")
    return m["scheme"] + url[m.end():], (unquote(user), unquote(password))


def public_value(value: Any, *, secret: bool = False) -> Any:
    """``value`` as it may be shown (a log, a terminal, the proxy's answers): a ``secret`` (the API
    key) as ``***`` and, when longer than 8 characters, its last 4; any other text with the
    credentials of every URL in it masked (``https://***@host/v1``, ``?api-key=***``); lists and
    dicts item by item (``cloud_endpoints``' URLs)."""
    if isinstance(value, str):
        if secret:
            return ("***" + value[-4:] if len(value) > 8 else "***") if value else value
        value = _URL_USERINFO.sub(r"\g<scheme>***@", value)
        return _URL_QUERY_SECRET.sub(r"\g<name>***", value)
    if isinstance(value, list | tuple):
        return [public_value(v, secret=secret) for v in value]
    if isinstance(value, dict):
        return {k: public_value(v, secret=secret) for k, v in value.items()}
    return value


def public_text(text: str) -> str:
    """``text`` with the credentials of every URL in it masked (:func:`public_value`): what the
    proxy sends its clients (a route's reason quotes the cloud endpoint it could not reach) and
    what goes to a log or a terminal."""
    return public_value(text)
