"""E-mail and IP addresses: their patterns, less the logins, images, versions and servers like them."""

from __future__ import annotations

import ipaddress
import re

# Every unbounded run below starts where a run of its characters starts (a lookbehind for the same
# class) or is bounded, so that a scan is linear in the prompt: a 1 MB prompt takes well under a
# second whatever it holds (an unanchored e-mail pattern took minutes on "1-1-1-...").
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
