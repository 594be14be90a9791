"""Review 13: privacy detection on common formats: image names at a pixel density (logo@2x.png)
are not e-mail addresses, an IPv6 network (2a00:1450::/32) is no one's address, as an IPv4 one
is not, and PWD= (the shell's working directory) is not a password."""

from __future__ import annotations

import pytest

from hybridllm.router.privacy import detect_pii


@pytest.mark.parametrize("text", [
    "use logo@2x.png on retina screens",
    "<img srcset='icon@1.5x.webp 1.5x, icon@3x.JPG 3x'>",
    "Logo@2X.PNG",
    "sprite@2x.svg and banner@4x.jpeg",
])
def test_image_names_at_a_pixel_density_are_not_emails(text: str) -> None:
    assert detect_pii(text) == []


@pytest.mark.parametrize("text", ["jane@example.com", "jane@2x.com", "bob@pngs.io"])
def test_addresses_are_still_emails(text: str) -> None:
    assert [m.kind for m in detect_pii(text)] == ["email"]


@pytest.mark.parametrize("text", [
    "allow 2a00:1450::/32 in the firewall",
    "route 2a00:1450:4009:80b::/64 via eth0",
    "prefix 2606:4700::/29",
])
def test_ipv6_networks_are_not_addresses(text: str) -> None:
    assert detect_pii(text) == []


@pytest.mark.parametrize("text", [
    "2a00:1450:4009:80b::200e/128",  # one host is an address
    "connect to 2a00:1450:4009:80b::200e",
    "[2a00:1450:4009:80b::200e]:443",
])
def test_ipv6_addresses_are_still_found(text: str) -> None:
    assert [m.kind for m in detect_pii(text)] == ["ip_address"]


@pytest.mark.parametrize("text", [
    "PWD=/home/jane/project",
    "env:\nHOME=/root\nPWD=/var/www/app\nSHELL=/bin/bash",
    "pwd: ~/src/app",
])
def test_the_working_directory_is_not_a_password(text: str) -> None:
    assert detect_pii(text) == []


@pytest.mark.parametrize("text", ["pwd: s3cr3t!", "PWD=hunter2", "password: /etc/x9!"])
def test_passwords_are_still_found(text: str) -> None:
    assert [m.kind for m in detect_pii(text)] == ["secret"]
