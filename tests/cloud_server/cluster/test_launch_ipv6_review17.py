"""The cluster launcher writes an IPv6 host as a URL does ([::1]:PORT), in its errors too."""

from __future__ import annotations

import socket

import pytest

from cloud_server.cluster import launch
from cloud_server.exceptions import ServerError


def test_a_taken_ipv6_port_is_named_in_brackets() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as held:
        try:
            held.bind(("::1", 0))
        except OSError:
            pytest.skip("no IPv6 loopback on this machine")
        held.listen(1)
        port = held.getsockname()[1]
        with pytest.raises(ServerError, match=rf"cannot listen on \[::1\]:{port}: "):
            launch._check_port("::1", port)  # it read "::1:PORT", where the port cannot be told
