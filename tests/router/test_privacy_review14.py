"""Review 14: the privacy screen's misses and false alarms. Before: a German number with a slash
(030/1234567) was not found, so the prompt went to the cloud with it; a URL's user name
(https://jane@github.com) was taken for an e-mail address, and a version an upgrade goes to
("upgrade to 1.2.3.4") for an IP address, so an ordinary coding question stayed on the device."""

from __future__ import annotations

import pytest

from hybridllm.router.policy import RoutingPolicy
from hybridllm.router.privacy import detect_pii

from .fakes import length_router


def _found(text: str) -> list[tuple[str, str]]:
    return [(m.kind, m.text) for m in detect_pii(text)]


@pytest.mark.parametrize(("text", "number"), [
    ("Ruf mich an: 030/1234567", "030/1234567"),
    ("Büro 0711 / 123 45 67, ab 9 Uhr", "0711 / 123 45 67"),
    ("mobil 0171/12345678.", "0171/12345678"),
    ("Wien: 01/5134567", "01/5134567"),
])
def test_a_german_number_with_a_slash_is_a_phone(text: str, number: str) -> None:
    assert _found(text) == [("phone", number)]


@pytest.mark.parametrize("text", [
    "the report for 07/2023 and 01/01/2024",  # dates: too few digits
    "open /srv/data/0123/4567890/index.html",  # a path's parts
    "ratio 3/4567890",  # no area code
])
def test_dates_and_paths_with_slashes_are_not_phones(text: str) -> None:
    assert _found(text) == []


@pytest.mark.parametrize("text", [
    "git clone https://jane@github.com/org/app.git fails",
    "see https://user@github.com",
    "ftp://anonymous@ftp.example.org/pub/file.txt",
])
def test_a_urls_user_name_is_not_an_email(text: str) -> None:
    assert _found(text) == []


def test_addresses_near_urls_are_still_emails() -> None:
    assert _found("mailto:jane@example.com") == [("email", "jane@example.com")]
    # a URL whose user name is itself an address
    assert _found("https://jane@gmail.com@host.example/") == [("email", "jane@gmail.com")]
    # credentials in a URL stay a secret up to the host, as before
    assert _found("postgres://admin:s3cretpass@db.example.com:5432/app") == [
        ("secret", "admin:s3cretpass@db.example.com")]


@pytest.mark.parametrize("text", [
    "upgrade to 1.2.3.4 and the error goes away",
    "Upgrading: from 1.2.3.4 to 1.2.3.5 broke the build",
    "bump numpy from 1.2.3.4 to 1.2.3.5",
    "I downgraded the driver to 81.2.69.160",
    "please update to 1.2.3.4",
])
def test_a_version_an_upgrade_goes_to_is_not_an_ip_address(text: str) -> None:
    assert _found(text) == []


@pytest.mark.parametrize(("text", "ip"), [
    ("my server is 1.2.3.4", "1.2.3.4"),
    ("update the A record to 81.2.69.160", "81.2.69.160"),
    ("upgrade the web server farm at 81.2.69.160", "81.2.69.160"),
    ("move the site from 81.2.69.160 to 81.2.69.161", "81.2.69.160"),
    ("ssh root@81.2.69.160 then upgrade", "81.2.69.160"),
])
def test_real_ip_addresses_are_still_found(text: str, ip: str) -> None:
    assert ("ip_address", ip) in _found(text)


def test_an_upgrade_question_may_go_to_the_cloud_and_a_slashed_phone_may_not() -> None:
    policy = RoutingPolicy(length_router(0.0))
    assert policy.decide("After I upgrade to 1.2.3.4 my tests fail. Why?").route == "cloud"
    assert policy.decide("Clone https://jane@github.com/org/app.git for me").route == "cloud"
    kept = policy.decide("Schreib an Frau Meier, Tel 030/1234567")
    assert kept.route == "edge" and kept.pii_kinds == ["phone"]
