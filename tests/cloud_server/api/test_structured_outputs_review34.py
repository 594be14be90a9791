"""vLLM's structured output fields on the cloud server's HTTP API, so a vLLM client runs unchanged:
``structured_outputs`` (``choice``, ``regex``, ``json``) and the older ``guided_choice``,
``guided_regex`` and ``guided_json``, on /v1/chat/completions and /v1/completions, streamed and not,
sampled and with n > 1, served by the real engine on a tiny random model whose vocabulary is JSON
pieces (in-process uvicorn). Every answer fits; what cannot be served is a 400 naming the field.
Before, each of these fields was a 400 (an unknown field)."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from ..engine.test_structured_output_review32 import JSON_SCHEMA, fits_schema
from . import test_structured_output_review32 as _tiny
from .helpers import sse_payloads

server = _tiny.server  # the tiny engine's in-process server, a fixture of this module too
http = _tiny.client  # and an httpx client of it

MSGS = [{"role": "user", "content": "pick one"}]
BASE = {"model": "tiny-json", "max_tokens": 60}
COLOURS = ["red", "green", "blue", "é"]
PATTERN = r"[a-f]{2,5}-\d{1,3}"


def _chat(http: httpx.Client, **body: Any) -> httpx.Response:
    return http.post("/v1/chat/completions", json={**BASE, "messages": MSGS, **body})


def _texts(r: httpx.Response) -> list[str]:
    assert r.status_code == 200, r.text
    out = []
    for c in r.json()["choices"]:
        assert c["finish_reason"] == "stop", c
        out.append(c["message"]["content"] if "message" in c else c["text"])
    return out


@pytest.mark.parametrize("field", [{"structured_outputs": {"choice": COLOURS}}, {"guided_choice": COLOURS}])
def test_a_choice_answers_one_of_the_strings(http: httpx.Client, field: dict) -> None:
    texts = _texts(_chat(http, n=6, temperature=1.0, seed=5, **field))
    assert all(t in COLOURS for t in texts), texts
    assert len(set(texts)) > 1  # sampled among them, not one forced answer


@pytest.mark.parametrize("field", [{"structured_outputs": {"regex": PATTERN}}, {"guided_regex": PATTERN}])
def test_a_regex_holds_the_whole_answer(http: httpx.Client, field: dict) -> None:
    for text in _texts(_chat(http, n=4, temperature=1.0, seed=2, **field)):
        assert re.fullmatch(PATTERN, text), text


@pytest.mark.parametrize("field", [{"structured_outputs": {"json": JSON_SCHEMA["json_schema"]["schema"]}},
                                   {"guided_json": JSON_SCHEMA["json_schema"]["schema"]},
                                   {"guided_json": json.dumps(JSON_SCHEMA["json_schema"]["schema"])}])
def test_json_gives_a_value_of_the_schema(http: httpx.Client, field: dict) -> None:
    body = {**BASE, "max_tokens": 250}
    r = http.post("/v1/chat/completions", json={**body, "messages": MSGS, "temperature": 0.7, "seed": 1,
                                                  **field})
    for text in _texts(r):
        assert fits_schema(json.loads(text)), text


def test_streamed_and_on_completions(http: httpx.Client) -> None:
    with http.stream("POST", "/v1/completions", json={
            **BASE, "prompt": "x", "stream": True, "n": 2, "temperature": 0.9, "seed": 4,
            "structured_outputs": {"regex": PATTERN}}) as r:
        assert r.status_code == 200
        events = sse_payloads(r.iter_lines())
    texts = ["", ""]
    for e in events[:-1]:
        for c in e.get("choices") or []:
            texts[c["index"]] += c.get("text") or ""
    assert all(re.fullmatch(PATTERN, t) for t in texts), texts
    r = http.post("/v1/completions", json={**BASE, "prompt": "x", "temperature": 0,
                                             "guided_choice": COLOURS, "logprobs": 1})
    assert _texts(r)[0] in COLOURS


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize(("body", "param", "words"), [
    ({"structured_outputs": {"regex": "(a"}}, "structured_outputs.regex", "unclosed group"),
    ({"guided_regex": "(a"}, "guided_regex", "unclosed group"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "non-empty strings"),
    ({"structured_outputs": {"grammar": "root ::= x"}}, "structured_outputs.grammar", "not served"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one"),
    ({"structured_outputs": {"json": {"type": "number", "minimum": 0.5}}}, "structured_outputs.json",
     "minimum"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "Only one of"),
    ({"guided_choice": ["a"], "response_format": {"type": "json_object"}}, "guided_choice",
     "cannot both be given"),
    ({"guided_choice": "a"}, "guided_choice", ""),
    ({"structured_outputs": ["a"]}, "structured_outputs", ""),
])
def test_what_cannot_be_served_is_a_400_naming_the_field(http: httpx.Client, path: str, body: dict,
                                                         param: str, words: str) -> None:
    extra = {"messages": MSGS} if "chat" in path else {"prompt": "x"}
    r = http.post(path, json={**BASE, **extra, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] is not None and err["param"].startswith(param), err
    assert words in err["message"] and "Traceback" not in err["message"], err


def test_a_text_response_format_beside_a_choice_is_no_conflict(http: httpx.Client) -> None:
    texts = _texts(_chat(http, temperature=0, guided_choice=COLOURS, response_format={"type": "text"}))
    assert texts[0] in COLOURS
