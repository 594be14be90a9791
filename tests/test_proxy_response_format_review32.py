"""`hybridllm serve` and the cloud route carry OpenAI's ``response_format`` (review 32): the proxy
accepts json_object and json_schema (before: a 400 "only 'text' is") and passes the normalized format
to the client; a schema the core refuses is a 400 naming the schema's field and reaches no backend;
the cloud route sends the format in its request body, and a cloud that refuses it says so and what
to do. Fast: a recording fake device model and a mock cloud."""

from __future__ import annotations

import json

import pytest

from hybridllm import HybridLLM, InvalidRequestError

from .test_response_format_review32 import OBJECT, SCHEMA, Recording

pytest.importorskip("hybridllm._structured")
MSGS = [{"role": "user", "content": "Who wrote the first program?"}]


def _mock_cloud(bodies: list[dict], *, refuse: bytes | None = None):  # type: ignore[no-untyped-def]
    """A cloud backend on a mock transport that records each request body and answers a JSON
    object, or ``refuse`` as an HTTP 400 body."""
    import httpx

    from hybridllm.backends.cloud import CloudBackend

    text = '{"name": "Ada", "age": 36}'
    sse = (f"data: {json.dumps({'choices': [{'delta': {'content': text}}]})}\n\n"
           f"data: {json.dumps({'choices': [{'delta': {}, 'finish_reason': 'stop'}]})}\n\n"
           "data: [DONE]\n\n").encode()

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        if refuse is not None:
            return httpx.Response(400, content=refuse, headers={"content-type": "application/json"})
        return httpx.Response(200, content=sse, headers={"content-type": "text/event-stream"})

    return CloudBackend(base_url="http://cloud.test/v1", model="m", transport=httpx.MockTransport(handler),
                        remember_refusals=False, max_retries=0)


def test_serve_accepts_structured_formats_and_passes_them_to_the_device() -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hybridllm.proxy import create_app

    edge = Recording()
    llm = HybridLLM(edge=edge, cache=False)
    try:
        with TestClient(create_app(llm)) as http:
            def post(**fields: object):  # type: ignore[no-untyped-def]
                return http.post("/v1/chat/completions", json={"model": "x", "messages": MSGS, **fields})

            r = post(response_format=OBJECT)
            assert r.status_code == 200, r.text
            assert edge.params[-1].response_format == {"type": "json_object"}
            assert json.loads(r.json()["choices"][0]["message"]["content"]) == {"name": "Ada", "age": 36}
            r = post(response_format=SCHEMA, stream=True)
            assert r.status_code == 200 and "[DONE]" in r.text, r.text
            assert edge.params[-1].response_format["json_schema"]["schema"] == SCHEMA["json_schema"]["schema"]
            assert post(response_format={"type": "text"}).status_code == 200
            assert edge.params[-1].response_format is None
            seen = len(edge.params)
            bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
                "type": "object", "properties": {"code": {"type": "string", "pattern": "^([A-Z])\\1$"}}}}}
            r = post(response_format=bad)
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == "response_format.json_schema.schema.properties.code.pattern", err
            assert "pattern" in err["message"] and err["type"] == "invalid_request_error"
            r = post(response_format={"type": "json_object", "json_schema": {"name": "x", "schema": {}}})
            assert r.status_code == 400 and r.json()["error"]["param"] == "response_format.json_schema"
            r = post(response_format={"type": "yaml"})
            assert r.status_code == 400 and r.json()["error"]["param"] == "response_format.type"
            assert len(edge.params) == seen  # no refused request reached the device
            schema = http.get("/openapi.json").json()
    finally:
        llm.close()
    text = json.dumps(schema)
    assert '"json_object"' in text and '"json_schema"' in text  # the document lists the three types


def test_the_cloud_route_sends_the_format_and_plain_requests_do_not() -> None:
    bodies: list[dict] = []
    with HybridLLM(edge=Recording(), cloud=_mock_cloud(bodies), cache=False) as llm:
        c = llm.chat(MSGS, route="cloud", response_format=SCHEMA)
        assert c.route == "cloud" and json.loads(c.text)["name"] == "Ada"
        assert bodies[-1]["response_format"]["type"] == "json_schema"
        assert bodies[-1]["response_format"]["json_schema"]["schema"] == SCHEMA["json_schema"]["schema"]
        llm.chat(MSGS, route="cloud", response_format=OBJECT)
        assert bodies[-1]["response_format"] == {"type": "json_object"}
        llm.chat(MSGS, route="cloud")
        assert "response_format" not in bodies[-1]  # plain text: the body is as it was


def test_serve_sends_the_format_to_the_cloud_route() -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hybridllm.proxy import create_app

    bodies: list[dict] = []
    llm = HybridLLM(edge=Recording(), cloud=_mock_cloud(bodies), cache=False)
    try:
        with TestClient(create_app(llm)) as http:
            r = http.post("/v1/chat/completions", json={
                "model": "x", "messages": MSGS, "response_format": OBJECT, "hybridllm": {"route": "cloud"}})
        assert r.status_code == 200 and r.headers["x-hybridllm-route"] == "cloud", r.text
        assert bodies[-1]["response_format"] == {"type": "json_object"}
    finally:
        llm.close()


@pytest.mark.parametrize(("refusal", "ask", "says"), [
    # OpenAI's words for a model without structured output, with the field as param
    ({"error": {"message": "Invalid parameter: 'response_format' of type 'json_schema' is not supported "
                           "with this model.", "type": "invalid_request_error", "param": "response_format",
                "code": None}}, {"response_format": SCHEMA}, "refused response_format 'json_schema'"),
    # a server that knows no such field (pydantic's 422-style text in a 400)
    ({"detail": [{"type": "extra_forbidden", "loc": ["body", "response_format"],
                  "msg": "Extra inputs are not permitted"}]},
     {"response_format": SCHEMA}, "refused response_format 'json_schema'"),
    # review 38: a hosted API asked for vLLM's field (a choice has no OpenAI form), with what serves it
    ({"error": {"message": "Unrecognized request argument supplied: structured_outputs",
                "type": "invalid_request_error", "param": None, "code": None}},
     {"structured_outputs": {"choice": ["yes", "no"]}}, "refused structured_outputs 'choice'"),
])
def test_a_cloud_that_refuses_the_format_says_so_and_what_to_do(refusal: dict, ask: dict, says: str) -> None:
    bodies: list[dict] = []
    cloud = _mock_cloud(bodies, refuse=json.dumps(refusal).encode())
    with HybridLLM(edge=Recording(), cloud=cloud, cache=False) as llm:
        with pytest.raises(InvalidRequestError) as info:
            llm.chat(MSGS, route="cloud", **ask)
    message = str(info.value)
    assert says in message and "route='edge'" in message, message
    if "structured_outputs" in ask:
        assert "(hybridllm-cloud, vLLM)" in message
    assert len(bodies) == 1  # not sent again without it: a free-text answer is not what was asked
