"""vLLM's ``/tokenize`` and ``/detokenize`` on the cloud server (review 35): a prompt or a chat
counted as the completion routes count it, ids turned back into text, bad input a 400 naming its
field, the API key required. Before, both were 404s. The fake engine's tokenizer is one id a
character; ``test_real_tokenize_review35.py`` checks the real tokenizers."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from cloud_server.api.server import create_app

from .fake_engine import FakeEngine

KEY = "sk-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
ASK = [{"role": "user", "content": "Hi there"}]


@pytest.fixture()
def client() -> Any:
    with TestClient(create_app(lambda: FakeEngine(step_s=0.0), api_keys=[KEY])) as c:
        yield c


def test_tokenize_counts_as_the_completion_routes_do(client: Any) -> None:
    r = client.post("/tokenize", json={"prompt": "abc"}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json() == {"count": 3, "max_model_len": 512, "tokens": [97, 98, 99], "token_strs": None}
    body = client.post(
        "/tokenize", json={"model": "fake-model", "messages": ASK, "return_token_strs": True}, headers=AUTH
    ).json()
    chat = client.post(
        "/v1/chat/completions", json={"model": "fake-model", "messages": ASK, "max_tokens": 2}, headers=AUTH
    ).json()
    assert body["count"] == chat["usage"]["prompt_tokens"] == len(body["tokens"])
    assert "".join(body["token_strs"]) == "<user>Hi there\n<assistant>"  # the fake's template
    assert client.post("/tokenize", json={"prompt": ""}, headers=AUTH).json()["count"] == 0  # as vLLM


def test_detokenize_gives_the_text_back(client: Any) -> None:
    ids = client.post("/tokenize", json={"prompt": "Grüße"}, headers=AUTH).json()["tokens"]
    assert client.post("/detokenize", json={"tokens": ids}, headers=AUTH).json() == {"prompt": "Grüße"}


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": ASK}, 400, "messages"),
        (
            "/tokenize",
            {"prompt": "a", "tools": [{"type": "function", "function": {"name": "f"}}]},
            400,
            "tools",
        ),
        ("/tokenize", {"messages": [{"role": "user"}]}, 400, "messages[0]"),
        ("/tokenize", {"messages": ASK, "tools": [{"type": "function"}]}, 400, "tools[0].function"),
        ("/tokenize", {"prompt": "a", "unknown": 1}, 400, "unknown"),
        ("/tokenize", {"prompt": "a", "model": "other"}, 404, None),  # model_not_found, as chat's
        ("/detokenize", {"tokens": [-1]}, 400, "tokens[0]"),
        ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
        ("/detokenize", {"tokens": [1], "model": "other"}, 404, None),
    ],
)
def test_bad_input_is_an_error_naming_its_field(
    client: Any, path: str, body: dict, status: int, param: str | None
) -> None:
    r = client.post(path, json=body, headers=AUTH)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param, r.json()
    if status == 404:
        assert r.json()["error"]["code"] == "model_not_found"


def test_the_api_key_guards_them(client: Any) -> None:
    assert client.post("/tokenize", json={"prompt": "a"}).status_code == 401
    assert client.post("/detokenize", json={"tokens": [97]}).status_code == 401


def test_the_openapi_document_lists_them(client: Any) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/tokenize", "/detokenize"):
        assert {"200", "400", "401", "404", "503"} <= set(paths[path]["post"]["responses"]), path


def test_ids_that_make_no_text_are_refused_or_replaced(client: Any) -> None:
    # found by the fuzzer: an id past the vocabulary was a 500, and so was a text the JSON answer
    # could not encode (the fake reads id 0xD800 as half a surrogate pair)
    r = client.post("/detokenize", json={"tokens": [0x110000]}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens[0]", r.text
    assert client.post("/detokenize", json={"tokens": [97, 0xD800]}, headers=AUTH).json() == {
        "prompt": "a\ufffd"
    }
    r = client.post(
        "/tokenize",
        json={"prompt": "ab", "add_special_tokens": False, "return_token_strs": True},
        headers=AUTH,
    )
    assert r.json()["token_strs"] == ["a", "b"], r.text
