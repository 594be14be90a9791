"""A token-id prompt with an id past the vocabulary is a 400 naming the id and where it is (review 40).

Before, the engine's refusal reached the client as "prompt token ids out of the vocabulary" (param
``prompt``): neither which id nor the vocabulary's range, where ``/detokenize`` and ``logit_bias``
name both. The engine is the real engine code around a fake model runner (vocabulary 0..25).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from cloud_server.api.server import create_app

from .api.helpers import ThreadServer
from .test_n_capacity_review40 import MODEL, _engine


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadServer]:
    srv = ThreadServer(create_app(lambda: _engine(4, 8), served_model_name=MODEL, energy="off")).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize(
    ("prompt", "param"),
    [([1, 2, 30, 40], "prompt[2]"), ([[1, 26]], "prompt[0][1]")],
)
def test_an_id_past_the_vocabulary_is_named(server: ThreadServer, prompt: list, param: str) -> None:
    r = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    bad = param.rsplit("[", 1)[1].rstrip("]")
    assert "is not a token id of this model (its vocabulary is 0..25)" in error["message"], error
    assert f"{(prompt[0] if param.startswith('prompt[0]') else prompt)[int(bad)]} is not" in error["message"]


def test_ids_in_the_vocabulary_are_served(server: ThreadServer) -> None:
    r = httpx.post(
        f"{server.url}/v1/completions",
        json={"model": MODEL, "prompt": [0, 1, 25], "max_tokens": 2, "ignore_eos": True},
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 3
