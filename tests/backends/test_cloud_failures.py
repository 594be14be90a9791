"""What the cloud client does when the cloud cannot serve, over real HTTP and real sockets: an
unreachable endpoint (refused, or blackholed: no answer to the connection at all) and the statuses
that are not a transient failure. Whatever the cloud does, ``HybridLLM`` answers on the device and
the reason says why; only a caller's own mistake (400) and a refused key (401/403) reach the caller.
The server's behaviour is the first segment of the base URL (``http://127.0.0.1:PORT/<mode>``)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hybridllm import (
    CloudAuthError,
    CloudUnavailableError,
    ContextWindowExceededError,
    GenerationParams,
    HybridLLM,
    InvalidRequestError,
)
from hybridllm.backends.cloud import CloudBackend
from hybridllm.backends.fake import FakeBackend

MSGS = [{"role": "user", "content": "hi"}]
P = GenerationParams(max_tokens=8, temperature=0)
FALLBACK = "edge (cloud unavailable)"
CONTEXT = {"message": "This model's maximum context length is 2048 tokens.", "type": "invalid_request_error",
           "code": "context_length_exceeded"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # /<mode>/v1/models
        mode = self.path.split("/")[1]
        self.server.hits.append(f"GET {mode}")  # type: ignore[attr-defined]
        if mode == "nomodels":
            return self._json(404, {"detail": "Not Found"})
        self._json(200, {"data": [{"id": "local-model"}]})

    def do_POST(self) -> None:
        mode = self.path.split("/")[1]
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.server.hits.append(mode)  # type: ignore[attr-defined]
        if mode in ("ok", "nomodels"):
            body = (f"data: {json.dumps({'choices': [{'delta': {'content': 'fine'}}]})}\n\n"
                    f"data: {json.dumps({'choices': [{'delta': {}, 'finish_reason': 'stop'}]})}\n\n"
                    "data: [DONE]\n\n").encode()
            self._raw(200, "text/event-stream", body)
        elif mode.startswith("redirect-"):  # to a live API: still not followed
            port = self.server.server_address[1]
            self._raw(int(mode[9:]), "text/plain", b"", {"location": f"http://127.0.0.1:{port}/ok/v1/chat/completions"})
        elif mode == "signin":  # a captive portal's page in place of the API
            self._raw(200, "text/html", b"<html><body>Please sign in</body></html>")
        elif mode == "context":
            self._json(400, {"error": CONTEXT})
        elif mode == "vllmcontext":  # vLLM's wording, without OpenAI's code
            self._json(400, {"error": {"message": "This model's maximum context length is 2048 tokens. "
                                       "However, you requested 5000 tokens.", "code": 400}})
        elif mode.isdigit():
            self._json(int(mode), {"error": {"message": f"status {mode}"}})
        else:
            self._json(500, {"error": {"message": f"no mode {mode}"}})

    def _json(self, status: int, body: dict) -> None:
        self._raw(status, "application/json", json.dumps(body).encode())

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


@pytest.fixture
def blackhole():
    """An address that never answers a connection: a listening socket whose accept queue is full,
    so the kernel drops every further SYN (a firewall that drops packets, a dead route)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(8):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        fillers.append(s)
    time.sleep(0.1)
    probe = socket.socket()
    probe.settimeout(0.5)
    try:
        probe.connect(("127.0.0.1", port))
        pytest.skip("this kernel accepts connections past a full accept queue: no blackhole to test with")
    except (TimeoutError, OSError):
        pass
    finally:
        probe.close()
    yield f"http://127.0.0.1:{port}"
    for s in [*fillers, listener]:
        s.close()


def _device(**kw) -> FakeBackend:
    return FakeBackend(reply=lambda m: "from the device", **kw)


# -- unreachable -------------------------------------------------------------------------------


def test_a_blackholed_cloud_costs_one_connect_timeout_then_the_device_answers(blackhole):
    """Before: 3 connection attempts of cloud_connect_timeout_s (3 s) each, about 9.5 s with the
    backoff, before the first cloud-routed request was answered on the device."""
    with HybridLLM(edge=_device(), cloud_url=blackhole, cloud_model="m", cache=False) as llm:
        assert (llm.config.cloud_connect_timeout_s, llm.config.cloud_max_retries) == (3.0, 2)  # defaults
        t0 = time.perf_counter()
        first = llm.chat("hi", route="cloud")
        took = time.perf_counter() - t0
        t0 = time.perf_counter()
        second = llm.chat("hi again", route="cloud")
        again = time.perf_counter() - t0
    assert took < 6, took  # one connect timeout (3 s), not three
    assert (first.text, first.route) == ("from the device", FALLBACK)
    assert "cannot be reached: no connection within 3 s (ConnectTimeout)" in first.reason, first.reason
    assert second.route == FALLBACK and "circuit open" in second.reason and again < 1


def test_a_refused_connection_is_not_retried_and_another_endpoint_still_answers(server, hits, monkeypatch):
    """Before: with max_retries=0 a refused connection on one endpoint failed the request, though
    another endpoint was up; with retries, the dead one was asked again after the live one failed."""
    slept = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr("hybridllm.backends.cloud_retry._sleep", sleep)
    dead = _closed_port()
    cloud = CloudBackend(base_url=[dead, _url(server, "ok")], model="m", max_retries=0)
    cloud.endpoints[1].add(100)  # the dead one is the first pick
    assert cloud.generate(MSGS, P).text == "fine"
    assert hits == ["ok"] and slept == []
    assert cloud.endpoints[0].breaker.state == "open" and cloud.endpoints[1].breaker.state == "closed"
    alone = CloudBackend(base_url=dead, model="m", max_retries=3, breaker_threshold=10)
    alone.endpoints[0].breaker._rng = lambda: 0.0  # no jitter: the whole cooldown
    with pytest.raises(CloudUnavailableError, match=r"cannot be reached.*not asked again for 10 s"):
        alone.generate(MSGS, P)
    assert alone.endpoints[0].failures == 1 and alone.endpoints[0].breaker.state == "open"


def test_going_back_to_an_endpoint_that_failed_still_waits_its_backoff(server, hits, monkeypatch):
    """The 503 endpoint is retried without a wait while an untried one is left; once that one turns
    out to be unreachable, the retry of the 503 one waits its backoff as it would alone."""
    slept = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr("hybridllm.backends.cloud_retry._sleep", sleep)
    cloud = CloudBackend(base_url=[_url(server, "503"), _closed_port()], model="m", max_retries=1,
                         backoff_base_s=1.0, breaker_threshold=10)
    cloud.endpoints[1].add(100)  # the 503 one is the first pick
    with pytest.raises(CloudUnavailableError, match="after 2 attempts: HTTP 503"):
        cloud.generate(MSGS, P)
    assert hits == ["503", "503"]
    assert len(slept) == 2 and slept[0] == 0.0 and 0 < slept[1] <= 1.0, slept


# -- statuses that say the endpoint cannot serve -------------------------------------------------


@pytest.mark.parametrize("mode", ["404", "405", "410", "415", "402", "redirect-301", "redirect-307",
                                  "redirect-308", "signin"])
def test_an_endpoint_that_is_not_an_api_is_asked_once_and_the_device_answers(server, hits, mode, caplog):
    """Before: 3xx, 404, 405, 410, 415 raised CloudError at the caller on every cloud-routed
    request (no answer at all), and a sign-in page was asked three times."""
    status = "200" if mode == "signin" else mode.rsplit("-", 1)[-1]
    cloud = CloudBackend(base_url=_url(server, mode), model="m", max_retries=2)
    with caplog.at_level(logging.WARNING, logger="hybridllm.cloud"), \
            HybridLLM(edge=_device(), cloud=cloud, cache=False) as llm:
        first = llm.chat("hi", route="cloud")
        later = llm.chat("hi again", route="cloud")
        cloud.endpoints[0].breaker._opened_at -= 60  # the cooldown is over: one probe is sent
        probe = llm.chat("and again", route="cloud")
    assert (first.text, first.route) == ("from the device", FALLBACK)
    assert (f"HTTP {status}" if mode != "signin" else "text/html") in first.reason, first.reason
    assert later.route == FALLBACK and "circuit open" in later.reason  # not sent at all
    assert probe.route == FALLBACK
    assert hits == [mode, mode]  # the first request and the probe, never a retry
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"/{mode}/v1" in warnings[0].getMessage()  # once per endpoint


def test_redirects_are_not_followed_and_say_where_they_point(server, hits):
    cloud = CloudBackend(base_url=_url(server, "redirect-308"), model="m")
    with pytest.raises(CloudUnavailableError, match=r"HTTP 308, a redirect to http://127.*/ok/v1/chat/"
                                                    r"completions: set cloud_url to the address"):
        cloud.generate(MSGS, P)
    assert hits == ["redirect-308"]  # the live API it points to got nothing


def test_a_server_without_a_model_list_lets_the_device_answer_and_says_to_set_cloud_model(server, hits):
    """Before: the 404 from /v1/models raised CloudError on every cloud-routed request."""
    with HybridLLM(edge=_device(), cloud_url=_url(server, "nomodels"), cache=False) as llm:
        c = llm.chat("hi", route="cloud")
    assert c.route == FALLBACK and "models answered HTTP 404" in c.reason and "set cloud_model" in c.reason
    assert hits == ["GET nomodels"]


def test_another_endpoint_answers_when_one_is_misconfigured(server, hits):
    cloud = CloudBackend(base_url=[_url(server, "404"), _url(server, "ok")], model="m", max_retries=0)
    cloud.endpoints[1].add(100)  # the wrong one is the first pick
    assert cloud.generate(MSGS, P).text == "fine"
    assert hits == ["404", "ok"] and cloud.endpoints[0].breaker.state == "open"


# -- statuses that refuse this request only ------------------------------------------------------


@pytest.mark.parametrize("mode", ["413"])
def test_a_request_the_cloud_cannot_take_is_answered_on_the_device_and_the_endpoint_stays_in_use(
        server, hits, mode, caplog):
    """Before: 413 raised CloudError at the caller. (A 422 is a window refusal only when it says
    so: tests/test_cloud_422_api9.py.)"""
    with caplog.at_level(logging.WARNING, logger="hybridllm.cloud"), \
            HybridLLM(edge=_device(), cloud_url=_url(server, mode), cloud_model="m", cache=False) as llm:
        answers = [llm.chat("hi", route="cloud"), llm.chat("hi again", route="cloud")]
        assert llm.cloud.endpoints[0].breaker.state == "closed"
    assert all(c.route == FALLBACK and f"HTTP {mode}" in c.reason for c in answers), answers
    assert hits == [mode, mode]  # not retried; the next request still asks
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


@pytest.mark.parametrize("mode", ["context", "vllmcontext"])
def test_the_clouds_context_window_refusal_is_answered_on_the_device_when_the_prompt_fits(server, hits, mode):
    """Before: InvalidRequestError at the caller, though the device could answer."""
    with HybridLLM(edge=_device(), cloud_url=_url(server, mode), cloud_model="m", cache=False) as llm:
        c = llm.chat("hi", route="cloud")
        assert llm.cloud.endpoints[0].breaker.state == "closed"
    assert c.route == FALLBACK and "context_length_exceeded" in c.reason
    assert hits == [mode]  # a context window is not retried


def test_the_clouds_context_window_refusal_of_a_prompt_the_device_cannot_hold_says_so(server, hits):
    long = "word " * 40
    with HybridLLM(edge=_device(context_length=16), cloud_url=_url(server, "context"), cloud_model="m",
                   cache=False) as llm:
        with pytest.raises(ContextWindowExceededError, match=r"(?s)cloud failed.*context_length_exceeded"):
            llm.chat(long)  # too long for the device: it goes to the cloud, which refuses it too
    assert hits == ["context"]


def test_a_bad_request_and_a_refused_key_stay_loud(server, hits):
    with HybridLLM(edge=_device(), cloud_url=_url(server, "400"), cloud_model="m", cache=False) as llm:
        with pytest.raises(InvalidRequestError, match=r"rejected the request \(HTTP 400\): status 400"):
            llm.chat("hi", route="cloud")
    with HybridLLM(edge=_device(), cloud_url=_url(server, "401"), cloud_model="m", cache=False) as llm:
        with pytest.raises(CloudAuthError, match="refused the API key"):
            llm.chat("hi", route="cloud")
    assert hits == ["400", "401"]


# -- the real device model ---------------------------------------------------------------------


@pytest.mark.real
def test_real_model_answers_when_the_cloud_is_blackholed_or_misconfigured(smollm2_path, server, hits,
                                                                          blackhole):
    from hybridllm.backends.base import create_backend

    for url in (blackhole, _url(server, "404"), _url(server, "context")):
        edge = create_backend("llama_cpp", model=str(smollm2_path), n_ctx=256, n_threads=1)
        with HybridLLM(edge=edge, cloud_url=url, cloud_model="m", cache=False, max_tokens=8,
                       temperature=0.0) as llm:
            t0 = time.perf_counter()
            c = llm.chat("Say hi.", route="cloud")
            took = time.perf_counter() - t0
        assert took < 8, (url, took)  # one connect timeout (3 s) at most, and 8 tokens; before: 9.5 s
        assert c.route == FALLBACK and c.text.strip() and c.model != "m", (url, c)
        assert c.usage.completion_tokens > 0
        assert ("ConnectTimeout" if url == blackhole else "HTTP 404" if "404" in url
                else "context_length_exceeded") in c.reason
    assert hits == ["404", "context"]
