"""`hybridllm serve` accepts presence_penalty and frequency_penalty and passes them to the client,
which applies them on the device and sends them to the cloud (review 31; before: a 400 "only 0 is
supported by this server"); logit_bias stays a 400 saying why. A recording fake device model and
a mock cloud, then (marked real) SmolLM2 behind a real socket, driven by the official openai client."""

from __future__ import annotations

import pytest

from hybridllm import HybridLLM

from .test_penalties_review31 import MSGS, Recording


def test_serve_accepts_the_penalties_and_passes_them_on() -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hybridllm.proxy import create_app

    edge = Recording()
    llm = HybridLLM(edge=edge, cache=False)
    try:
        with TestClient(create_app(llm)) as http:
            def post(**fields: object):  # type: ignore[no-untyped-def]
                return http.post("/v1/chat/completions", json={"model": "x", "messages": MSGS, **fields})

            r = post(presence_penalty=0.6, frequency_penalty=1.5)
            assert r.status_code == 200, r.text
            assert (edge.params[-1].presence_penalty, edge.params[-1].frequency_penalty) == (0.6, 1.5)
            r = post(stream=True, frequency_penalty=-2)
            assert r.status_code == 200 and "[DONE]" in r.text, r.text
            assert edge.params[-1].frequency_penalty == -2.0
            assert post(presence_penalty=None).status_code == 200  # null: left out
            assert edge.params[-1].presence_penalty == 0.0
            for bad in ({"presence_penalty": 2.5}, {"frequency_penalty": "1"}):
                r = post(**bad)
                assert r.status_code == 400 and r.json()["error"]["param"] == next(iter(bad)), r.text
            # logit_bias's token ids would mean different tokens on the device and the cloud: refused
            r = post(logit_bias={"42": 5})
            assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", r.text
            assert "token ids differ" in r.json()["error"]["message"]
            schema = http.get("/openapi.json").json()
        assert len(edge.params) == 3
    finally:
        llm.close()
    body = next(s for n, s in schema["components"]["schemas"].items()
                if "presence_penalty" in s.get("properties", {}))
    text = str({k: body["properties"][k] for k in ("presence_penalty", "frequency_penalty")})
    assert "'maximum': 0" not in text and "'maximum': 2" in text and "'minimum': -2" in text, text


def _mock_cloud(bodies: list[dict]):  # type: ignore[no-untyped-def]
    """A cloud backend on a mock transport that records each request body and answers "fine"."""
    import json

    import httpx

    from hybridllm.backends.cloud import CloudBackend

    sse = (f"data: {json.dumps({'choices': [{'delta': {'content': 'fine'}}]})}\n\n"
           f"data: {json.dumps({'choices': [{'delta': {}, 'finish_reason': 'stop'}]})}\n\n"
           "data: [DONE]\n\n").encode()

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, content=sse, headers={"content-type": "text/event-stream"})

    return CloudBackend(base_url="http://cloud.test/v1", model="m", transport=httpx.MockTransport(handler),
                        remember_refusals=False, max_retries=0)


def test_serve_passes_the_penalties_to_the_cloud_route() -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hybridllm.proxy import create_app

    bodies: list[dict] = []
    llm = HybridLLM(edge=Recording(), cloud=_mock_cloud(bodies), cache=False)
    try:
        with TestClient(create_app(llm)) as http:
            r = http.post("/v1/chat/completions", json={
                "model": "x", "messages": MSGS, "presence_penalty": 0.4, "frequency_penalty": -0.5,
                "hybridllm": {"route": "cloud"}})
        assert r.status_code == 200 and r.headers["x-hybridllm-route"] == "cloud", r.text
        assert (bodies[-1]["presence_penalty"], bodies[-1]["frequency_penalty"]) == (0.4, -0.5)
    finally:
        llm.close()


REPEAT = [{"role": "user", "content": "Repeat the word 'apple' fifty times, separated by spaces."}]


@pytest.mark.real
def test_the_openai_client_sends_presence_penalty_through_serve(smollm2_path) -> None:  # type: ignore[no-untyped-def]
    """SmolLM2 on llama.cpp behind the proxy on a real socket: the official client's
    presence_penalty changes the device's answer to a repeating prompt, and reaches the cloud."""
    openai = pytest.importorskip("openai")
    from hybridllm.backends.base import create_backend
    from hybridllm.proxy import create_app
    from tests.cloud_server.api.helpers import ThreadServer

    bodies: list[dict] = []
    edge = create_backend("llama_cpp", model=str(smollm2_path), n_ctx=1024, n_threads=2)
    llm = HybridLLM(edge=edge, cloud=_mock_cloud(bodies), cache=False)
    server = ThreadServer(create_app(llm)).start()
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)

        def ask(**kw):  # type: ignore[no-untyped-def]
            return client.chat.completions.create(model="hybridllm", messages=REPEAT, max_tokens=40,
                                                  temperature=0, seed=7, **kw)

        edge_only = {"extra_body": {"hybridllm": {"route": "edge"}}}
        plain = ask(**edge_only).choices[0].message.content
        penalised = ask(presence_penalty=2, **edge_only).choices[0].message.content
        assert plain.lower().count("apple") >= 10, plain
        assert penalised.lower().count("apple") < plain.lower().count("apple") / 2, (plain, penalised)
        streamed = "".join(e.choices[0].delta.content or "" for e in ask(
            presence_penalty=2, stream=True, **edge_only) if e.choices)
        assert streamed == penalised
        cloud = ask(presence_penalty=1.5, extra_body={"hybridllm": {"route": "cloud"}})
        assert cloud.choices[0].message.content == "fine" and bodies[-1]["presence_penalty"] == 1.5
    finally:
        server.stop()
        llm.close()
