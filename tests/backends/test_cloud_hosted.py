"""The cloud client against endpoints that are not our own server, over real HTTP: a hosted API that
rejects vLLM's sampling fields, a strict (pydantic) server, and a cloud that stays down for a long
time. The peer's behaviour is the first segment of the base URL (``http://127.0.0.1:PORT/<mode>``).
Our own server (``cloud_server`` on a fake engine) checks that its sampling is what it was."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hybridllm import (
    CloudUnavailableError,
    GenerationParams,
    HybridLLM,
    InvalidRequestError,
)
from hybridllm.backends.circuit import CircuitBreaker
from hybridllm.backends.cloud import CloudBackend
from hybridllm.backends.fake import FakeBackend

MSGS = [{"role": "user", "content": "hi"}]
FALLBACK = "edge (cloud unavailable)"
# the fields of OpenAI's chat completions API a request of ours may carry; anything else is unknown
OPENAI_FIELDS = {"model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
                 "temperature", "top_p", "seed", "stop", "n", "presence_penalty", "frequency_penalty",
                 "logprobs", "top_logprobs", "user", "logit_bias", "response_format", "tools"}
SSE = (f"data: {json.dumps({'choices': [{'delta': {'content': 'fine'}}]})}\n\n"
       f"data: {json.dumps({'choices': [{'delta': {}, 'finish_reason': 'stop'}]})}\n\n"
       "data: [DONE]\n\n").encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        mode = self.path.split("/")[1]
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
        self.server.hits.append((mode, body))  # type: ignore[attr-defined]
        unknown = sorted(set(body) - OPENAI_FIELDS)
        if mode == "openai" and unknown:  # api.openai.com: every unknown field in one message
            s = "s" if len(unknown) > 1 else ""
            return self._json(400, {"error": {
                "message": f"Unrecognized request argument{s} supplied: {', '.join(unknown)}",
                "type": "invalid_request_error", "param": None, "code": None}})
        if mode == "onebyone" and unknown:  # a server that names the first one only
            return self._json(400, {"error": {"message": f"Unknown parameter: '{unknown[0]}'.",
                                              "type": "invalid_request_error", "param": unknown[0]}})
        if mode == "pydantic" and unknown:  # FastAPI with extra="forbid": 422, no OpenAI error object
            return self._json(422, {"detail": [{"type": "extra_forbidden", "loc": ["body", name],
                                                "msg": "Extra inputs are not permitted", "input": body[name]}
                                               for name in unknown]})
        if mode == "badvalue":  # a field it knows, with a value it refuses: the caller's mistake
            return self._json(400, {"error": {"message": "Invalid value for 'top_k': must be at least 1.",
                                              "type": "invalid_request_error", "param": "top_k"}})
        if mode == "429":
            return self._json(429, {"error": {"message": "slow down"}}, {"Retry-After": "3600"})
        if mode.isdigit():
            return self._json(int(mode), {"error": {"message": f"status {mode}"}})
        self._raw(200, "text/event-stream", SSE)  # openai, onebyone, pydantic, vllm: accepted

    def _json(self, status: int, body: dict, headers: dict | None = None) -> None:
        self._raw(status, "application/json", json.dumps(body).encode(), headers)

    def _raw(self, status: int, ctype: str, body: bytes, headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.hits = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def hits(server):
    server.hits.clear()
    return server.hits


def _url(server, mode: str) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/{mode}"


def _closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def _device() -> FakeBackend:
    return FakeBackend(reply=lambda m: "from the device")


# -- sampling fields a hosted API does not know --------------------------------------------------


def test_a_hosted_api_that_rejects_top_k_answers_from_the_cloud_and_is_not_sent_it_again(
        server, hits, caplog):
    """Before: every cloud request sent top_k, api.openai.com answered 400 "Unrecognized request
    argument supplied: top_k", and the caller got InvalidRequestError on every cloud request."""
    with caplog.at_level(logging.WARNING, logger="hybridllm.cloud"), \
            HybridLLM(edge=_device(), cloud_url=_url(server, "openai"), cloud_model="gpt-4o-mini",
                      cache=False) as llm:
        first = llm.chat("hi", route="cloud")
        second = llm.chat("hi again", route="cloud")
        assert llm.cloud.endpoints[0].breaker.state == "closed"  # an answer, not a failure
    assert (first.text, first.route) == ("fine", "cloud") and (second.text, second.route) == ("fine", "cloud")
    assert [("top_k" in body) for _, body in hits] == [True, False, False]  # dropped once, remembered
    assert hits[0][1]["top_k"] == 40 and hits[1][1]["temperature"] == hits[0][1]["temperature"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "does not accept top_k" in warnings[0], warnings


@pytest.mark.parametrize(("mode", "posts"), [("openai", 2), ("onebyone", 4), ("pydantic", 2)])
def test_every_unknown_sampling_field_is_dropped_however_the_server_names_it(server, hits, mode, posts):
    """Before: openai and onebyone raised InvalidRequestError, pydantic's 422 CloudUnavailableError
    (the device answered every cloud request)."""
    cloud = CloudBackend(base_url=_url(server, mode), model="m", max_retries=0)
    params = GenerationParams(max_tokens=8, temperature=0.5, top_k=5, min_p=0.1, repeat_penalty=1.2,
                              seed=3, stop=["END"])
    assert cloud.generate(MSGS, params).text == "fine"
    assert len(hits) == posts, [sorted(b) for _, b in hits]
    assert cloud.generate(MSGS, params).text == "fine"
    assert len(hits) == posts + 1  # the next request goes without them at once
    last = hits[-1][1]
    assert not {"top_k", "min_p", "repetition_penalty"} & set(last)
    assert (last["seed"], last["stop"], last["temperature"], last["top_p"]) == (3, ["END"], 0.5, 0.95)


def test_an_endpoint_that_rejected_a_field_does_not_teach_another(server, hits):
    cloud = CloudBackend(base_url=[_url(server, "openai"), _url(server, "vllm")], model="m", max_retries=0)
    cloud.endpoints[1].add(100)  # the hosted one is the first pick
    assert cloud.generate(MSGS, GenerationParams(max_tokens=8)).text == "fine"
    cloud.endpoints[1].done(100)
    cloud.endpoints[0].add(100)
    assert cloud.generate(MSGS, GenerationParams(max_tokens=8)).text == "fine"
    assert [(mode, body.get("top_k")) for mode, body in hits] == [("openai", 40), ("openai", None),
                                                                  ("vllm", 40)]


def test_a_bad_value_of_a_known_field_stays_the_callers_error(server, hits):
    cloud = CloudBackend(base_url=_url(server, "badvalue"), model="m")
    with pytest.raises(InvalidRequestError, match=r"HTTP 400\): Invalid value for 'top_k'"):
        cloud.generate(MSGS, GenerationParams(max_tokens=8, top_k=3))
    assert len(hits) == 1 and hits[0][1]["top_k"] == 3  # not sent again without it


def test_vllm_gets_top_k_as_before_and_no_field_when_it_is_off(server, hits):
    """Before: top_k=0 (off) was sent as 0, which vLLM before 0.6 refuses ("top_k must be -1
    (disable), or at least 1"); leaving it out means off to vLLM and to our server alike."""
    cloud = CloudBackend(base_url=_url(server, "vllm"), model="m")
    cloud.generate(MSGS, GenerationParams(max_tokens=8))
    cloud.generate(MSGS, GenerationParams(max_tokens=8, top_k=0))
    cloud.generate(MSGS, GenerationParams(max_tokens=8, top_k=7, min_p=0.2, repeat_penalty=1.1))
    sent = [{k: b.get(k) for k in ("top_k", "min_p", "repetition_penalty")} for _, b in hits]
    assert sent == [{"top_k": 40, "min_p": None, "repetition_penalty": None},
                    {"top_k": None, "min_p": None, "repetition_penalty": None},
                    {"top_k": 7, "min_p": 0.2, "repetition_penalty": 1.1}]
    assert "top_k" not in hits[1][1]


def test_our_own_server_samples_as_before_and_is_sent_min_p():
    """Our server over real HTTP (fake engine): the default top_k 40 still reaches the engine (the
    server turns top_k off when it is absent, so leaving it out would change its answers), and
    min_p reaches the engine (our server serves it since review 31; before, it answered 400 "min_p
    is not supported by this server" and the client dropped the field for good)."""
    from cloud_server.api.server import create_app
    from tests.cloud_server.api.fake_engine import FakeEngine
    from tests.cloud_server.api.helpers import ThreadServer

    seen = []

    class Recording(FakeEngine):
        def generate(self, request_id, prompt, params, on_scheduled=None):
            seen.append(params)
            return super().generate(request_id, prompt, params, on_scheduled)

    engine = Recording(max_model_len=512)
    srv = ThreadServer(create_app(lambda: engine)).start()
    try:
        cloud = CloudBackend(base_url=srv.url, max_retries=0)
        assert cloud.generate(MSGS, GenerationParams(max_tokens=8)).text.strip()
        assert (seen[-1].top_k, seen[-1].top_p, seen[-1].temperature) == (40, 0.95, 0.7)
        assert cloud.generate(MSGS, GenerationParams(max_tokens=8, top_k=0)).text.strip()
        assert seen[-1].top_k in (-1, 0)  # off
        assert cloud.generate(MSGS, GenerationParams(max_tokens=8, top_k=9, min_p=0.1)).text.strip()
        assert seen[-1].top_k == 9 and seen[-1].min_p == 0.1
        assert cloud.generate(MSGS, GenerationParams(max_tokens=8, min_p=0.2)).text.strip()
        assert seen[-1].min_p == 0.2  # still sent: never taken for a field the server lacks
        assert cloud.endpoints[0].breaker.state == "closed"
        cloud.close()
    finally:
        srv.stop()


# -- a cloud that stays down ---------------------------------------------------------------------


def test_each_failed_probe_doubles_the_wait_up_to_the_cap_and_a_success_resets_it():
    now = [0.0]
    b = CircuitBreaker(threshold=3, cooldown_s=10, max_cooldown_s=60, clock=lambda: now[0],
                       rng=lambda: 0.0)  # no jitter: each wait is the whole cooldown
    b.trip()
    waits = []
    for _ in range(5):  # each wait: from opening to the next probe admitted
        opened = now[0]
        while not b.allow():
            now[0] += 1
        waits.append(now[0] - opened)
        b.trip()  # the probe failed too
    assert waits == [10, 20, 40, 60, 60]
    b.trip()  # a request that was in flight fails too: not a probe, the wait does not grow again
    assert b.cooldown_s == 60
    now[0] += 60
    assert b.allow()
    b.record_success()
    for _ in range(3):  # three failures in a row, none of them a probe
        b.record_failure()
    assert b.state == "open" and b.cooldown_s == 10  # back to the configured wait
    now[0] += 10
    assert b.allow()
    assert CircuitBreaker(cooldown_s=600).max_cooldown_s == 600  # the cap never shortens the setting


def test_an_offline_hour_costs_a_few_probes_not_one_every_cooldown():
    """Before: one probe every cloud_breaker_cooldown_s (10 s) for as long as the cloud was
    down: 360 connection attempts in an hour of requests every 10 s, each a 3 s connect timeout
    when the address is blackholed (18 minutes of waiting an hour). Now 10, 20, 40, ... 300 s."""
    now = [0.0]
    with HybridLLM(edge=_device(), cloud_url=_closed_port(), cloud_model="m", cache=False) as llm:
        ep = llm.cloud.endpoints[0]
        ep.breaker._clock = lambda: now[0]
        ep.breaker._rng = lambda: 0.0  # no jitter: each wait is the whole cooldown
        answers = []
        for _ in range(360):
            answers.append(llm.chat("hi", route="cloud"))
            now[0] += 10
    assert all(c.route == FALLBACK and c.text == "from the device" for c in answers)
    # probes after 10, 20, 40, 80, 160 s, then every 300 s: 6 + (3600 - 310) // 300 = 16
    assert 12 <= ep.requests <= 18, ep.requests
    assert ep.breaker.cooldown_s == 300


def test_a_probe_that_answers_brings_the_wait_back(server, hits):
    now = [0.0]
    cloud = CloudBackend(base_url=_url(server, "404"), model="m")
    breaker = cloud.endpoints[0].breaker
    breaker._clock = lambda: now[0]
    breaker._rng = lambda: 0.0  # no jitter: each wait is the whole cooldown
    for wait in (0, 10, 20, 40):
        now[0] += wait
        with pytest.raises(CloudUnavailableError, match=f"not asked again for {2 * wait or 10:g} s"):
            cloud.generate(MSGS, GenerationParams(max_tokens=8))
    assert len(hits) == 4 and breaker.cooldown_s == 80
    cloud.endpoints[0].base_url = _url(server, "vllm") + "/v1"  # the cloud is back
    now[0] += 80
    assert cloud.generate(MSGS, GenerationParams(max_tokens=8)).text == "fine"
    assert breaker.cooldown_s == 10 and breaker.state == "closed"


# -- what the reason says while the circuit is open ----------------------------------------------


def test_reasons_while_the_circuit_is_open_keep_what_the_cloud_did(server, hits):
    """Before: the first request said "HTTP 404", every later one only "circuit open, or its
    Retry-After not over"."""
    with HybridLLM(edge=_device(), cloud_url=_url(server, "404"), cloud_model="m", cache=False) as llm:
        first = llm.chat("hi", route="cloud")
        later = [llm.chat("hi again", route="cloud") for _ in range(2)]
        with pytest.raises(CloudUnavailableError, match=r"circuit open after: HTTP 404 from http://127"):
            llm.cloud.generate(MSGS, GenerationParams(max_tokens=8))  # a backend caller hears it too
    where = f"{_url(server, '404')}/v1/chat/completions"
    assert first.route == FALLBACK and "HTTP 404" in first.reason
    for c in later:
        assert c.route == FALLBACK and f"circuit open after: HTTP 404 from {where}" in c.reason, c.reason
    assert len(hits) == 1


def test_a_refused_connection_and_a_retry_after_say_so_while_they_last(server, hits):
    dead = _closed_port()
    with HybridLLM(edge=_device(), cloud_url=dead, cloud_model="m", cache=False) as llm:
        llm.chat("hi", route="cloud")
        later = llm.chat("hi again", route="cloud")
    assert later.route == FALLBACK and "circuit open after: " in later.reason
    assert f"(ConnectError) to {dead}/v1" in later.reason, later.reason
    with HybridLLM(edge=_device(), cloud_url=_url(server, "429"), cloud_model="m", cache=False) as llm:
        llm.chat("hi", route="cloud")
        later = llm.chat("hi again", route="cloud")
    assert later.route == FALLBACK, later
    assert f"Retry-After not over: HTTP 429 from {_url(server, '429')}/v1" in later.reason, later.reason


# -- the real device model ---------------------------------------------------------------------


@pytest.mark.real
def test_real_model_with_a_hosted_api_and_with_a_misconfigured_one(smollm2_path, server, hits):
    from hybridllm.backends.base import create_backend

    edge = create_backend("llama_cpp", model=str(smollm2_path), n_ctx=256, n_threads=1)
    with HybridLLM(edge=edge, cloud_url=_url(server, "openai"), cloud_model="gpt-4o-mini", cache=False,
                   max_tokens=8, temperature=0.0) as llm:
        hosted = llm.chat("Say hi.", route="cloud")
    assert (hosted.route, hosted.text) == ("cloud", "fine")
    edge = create_backend("llama_cpp", model=str(smollm2_path), n_ctx=256, n_threads=1)
    with HybridLLM(edge=edge, cloud_url=_url(server, "404"), cloud_model="m", cache=False,
                   max_tokens=8, temperature=0.0) as llm:
        t0 = time.perf_counter()
        answers = [llm.chat("Say hi.", route="cloud"), llm.chat("Say hello.", route="cloud")]
        took = time.perf_counter() - t0
    for c in answers:
        assert c.route == FALLBACK and c.text.strip() and c.usage.completion_tokens > 0, c
    assert "circuit open after: HTTP 404 from" in answers[1].reason, answers[1].reason
    assert took < 20, took
    assert [m for m, _ in hits] == ["openai", "openai", "404"]
