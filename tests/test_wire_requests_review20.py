"""Edge cases of the shared OpenAI request model (``hybridllm.wire``), as OpenAI (or vLLM) answers them:
a blank ``model`` is a 400, ``"tools": []`` is a 400 naming tools, a ``json_schema`` beside type
``text`` is a 400, a body that is not UTF-8 is told so, vLLM's ``continuous_usage_stats: false`` is
accepted, and stop lists longer than OpenAI's 4 (IDE plugins send them) up to ``MAX_STOP``."""

from __future__ import annotations

import json

import pytest

from cloud_server.api.protocol import CloudChatCompletionRequest, CloudCompletionRequest
from hybridllm.wire.body import decode_json_object
from hybridllm.wire.errors import WireError
from hybridllm.wire.requests import MAX_STOP, ChatCompletionRequest, parse_request

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MODELS = [ChatCompletionRequest, CloudChatCompletionRequest]


def _refused(model, body) -> WireError:
    with pytest.raises(WireError) as info:
        parse_request(model, body)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize("name", ["", "   "])
@pytest.mark.parametrize("model", [*MODELS, CloudCompletionRequest])
def test_a_blank_model_is_a_400_saying_it_is_missing(model, name: str) -> None:
    body = {**CHAT, "model": name} if model is not CloudCompletionRequest else {"model": name, "prompt": "hi"}
    err = _refused(model, body)
    assert err.param == "model" and "must provide a model" in err.message


@pytest.mark.parametrize("model", MODELS)
def test_an_empty_tools_array_is_a_400_naming_tools(model) -> None:
    err = _refused(model, {**CHAT, "tools": []})
    assert err.param == "tools" and "empty array" in err.message
    assert parse_request(model, {**CHAT, "tools": None}).tools is None  # null is still "no tools"


@pytest.mark.parametrize("model", MODELS)
def test_a_json_schema_beside_type_text_is_a_400(model) -> None:
    body = {**CHAT, "response_format": {"type": "text", "json_schema": {"name": "x", "schema": {}}}}
    err = _refused(model, body)
    assert err.param == "response_format.json_schema"
    ok = parse_request(model, {**CHAT, "response_format": {"type": "text"}})
    assert ok.response_format is not None and ok.response_format.type == "text"


@pytest.mark.parametrize("body", [b'{"model": "caf\xe9"}', b'\xef\xbb\xbf{"a": "\xff"}',
                                  json.dumps(CHAT).encode("utf-16")])
def test_a_body_that_is_not_utf8_is_told_so(body: bytes) -> None:
    with pytest.raises(WireError) as info:
        decode_json_object(body)
    assert "not valid UTF-8" in info.value.message
    assert "Content-Type" not in info.value.message  # the client had sent it
    bad = body.find(b"\xe9") if b"\xe9" in body else body.find(b"\xff")
    assert f"offset {bad}" in info.value.message


def test_broken_json_still_says_send_valid_json() -> None:
    with pytest.raises(WireError, match="valid JSON"):
        decode_json_object(b'{"model": ')


@pytest.mark.parametrize("model", MODELS)
def test_vllm_continuous_usage_stats_false_is_accepted_and_true_refused(model) -> None:
    base = {**CHAT, "stream": True}
    req = parse_request(model, {**base, "stream_options": {"include_usage": True,
                                                             "continuous_usage_stats": False}})
    assert req.include_usage()
    err = _refused(model, {**base, "stream_options": {"continuous_usage_stats": True}})
    assert err.param == "stream_options.continuous_usage_stats"
    assert "not supported" in err.message


@pytest.mark.parametrize("model", MODELS)
def test_more_stop_strings_than_openais_four_are_accepted_up_to_the_bound(model) -> None:
    stops = [f"s{i}" for i in range(9)]  # Continue's autocomplete sends 9
    assert parse_request(model, {**CHAT, "stop": stops}).stop_list() == stops
    many = [f"s{i}" for i in range(MAX_STOP)]
    assert parse_request(model, {**CHAT, "stop": many}).stop_list() == many
    err = _refused(model, {**CHAT, "stop": [*many, "one more"]})
    assert err.param == "stop" and str(MAX_STOP) in err.message


def test_the_schema_documents_the_new_rules() -> None:
    props = ChatCompletionRequest.model_json_schema()["properties"]
    assert props["model"]["minLength"] == 1
    assert props["stop"]["anyOf"][1]["maxItems"] == MAX_STOP
