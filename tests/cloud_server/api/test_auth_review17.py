"""The cloud server's API key check over HTTP (fake engine, in-process): the scheme in any case, white
space before the key, and a 401 in OpenAI's shape whose message says what is wrong, never the key."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from cloud_server.api.server import create_app

from .fake_engine import FakeEngine

KEY = "sk-review17-secret"
BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "Hi"}]}


@pytest.fixture
def http() -> Iterator[TestClient]:
    with TestClient(create_app(lambda: FakeEngine(), api_keys=[KEY, "sk-other"])) as client:
        yield client


def ask(http: TestClient, authorization: str | None):
    headers = {} if authorization is None else {"authorization": authorization}
    return http.post("/v1/chat/completions", json=BODY, headers=headers)


@pytest.mark.parametrize("header", [f"Bearer {KEY}", f"bearer {KEY}", f"BEARER {KEY}",
                                    f"Bearer    {KEY}", f"Bearer\t{KEY}"])
def test_the_right_key_in_any_spelling_of_the_scheme_is_let_in(http, header):
    r = ask(http, header)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("header", "says"), [
    (None, "didn't provide an API key"),
    ("Bearer", "no API key after 'Bearer'"),
    ("Bearer    ", "no API key after 'Bearer'"),
    (f"Basic {KEY}", "must use the Bearer scheme"),
    (KEY, "must use the Bearer scheme"),  # the key sent bare: not "incorrect", it may be right
    ("Bearer sk-wrong", "Incorrect API key"),
])
def test_each_refusal_is_a_401_saying_what_is_wrong(http, header, says):
    r = ask(http, header)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == "invalid_api_key"
    assert says in err["message"] and KEY not in r.text, err


def test_no_key_reaches_a_log_line(http, caplog):
    with caplog.at_level(logging.DEBUG):
        for header in (f"Bearer {KEY}", f"Basic {KEY}", KEY, "Bearer sk-wrong-key"):
            ask(http, header)
    text = "\n".join(rec.getMessage() for rec in caplog.records)
    assert KEY not in text and "sk-wrong-key" not in text
