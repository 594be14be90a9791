"""The cloud client against a real local HTTP server that misbehaves on purpose: each endpoint's
behaviour is the first segment of its base URL (``http://127.0.0.1:PORT/<mode>``)."""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hybridllm import (
    CloudRateLimitError,
    CloudUnavailableError,
    GenerationParams,
)
from hybridllm.backends.cloud import CloudBackend

MSGS = [{"role": "user", "content": "hi"}]
P = GenerationParams(max_tokens=8, temperature=0)


def _event(text: str | None = None, finish: str | None = None) -> bytes:
    delta = {"content": text} if text is not None else {}
    return f"data: {json.dumps({'choices': [{'delta': delta, 'finish_reason': finish}]})}\n\n".encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # /<mode>/v1/models
        mode = self.path.split("/")[1]
        self.server.hits.append(f"GET {mode}")  # type: ignore[attr-defined]
        if mode == "slowmodels":
            time.sleep(3)
        elif mode == "nomodels":
            return self._json(404, {"detail": "Not Found"})
        self._json(200, {"data": [{"id": "local-model"}]})

    def do_POST(self) -> None:
        mode = self.path.split("/")[1]
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.server.hits.append(mode)  # type: ignore[attr-defined]
        if mode in ("ok", "slowmodels", "nomodels"):
            self._sse(_event("fine"), _event(finish="stop"), b"data: [DONE]\n\n")
        elif mode.startswith("429-"):  # 429-<Retry-After>, "date" for an HTTP date an hour ahead
            after = mode[4:]
            if after == "date":
                after = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 3600))
            self._json(429, {"error": {"message": "slow down"}}, {"Retry-After": after})
        elif mode == "html":  # a web page, not an API (a proxy's login page, a wrong path)
            body = b"<html><body>Please sign in</body></html>"
            self._raw(200, "text/html", body)
        elif mode == "plainjson":  # a server that ignores stream=true
            self._json(200, {"choices": [{"message": {"role": "assistant", "content": "whole"},
                                          "finish_reason": "stop"}], "usage": {"prompt_tokens": 2,
                                                                               "completion_tokens": 1}})
        elif mode == "hang":  # accepts, reads the request, never answers
            time.sleep(30)
        elif mode == "stallfirst":  # headers, then nothing
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            self.wfile.flush()
            time.sleep(30)
        elif mode == "breaks":  # two tokens, then the connection drops
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            self.wfile.write(_event("Hel") + _event("lo"))
            self.wfile.flush()
            self.close_connection = True
        elif mode == "slow":  # a long answer, a token every 50 ms
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.end_headers()
            try:
                for i in range(100):
                    self.wfile.write(_event(f"t{i} "))
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:  # the client went away
                pass
            self.close_connection = True
        elif mode == "inband":
            self._sse(_event("Hel"), b'data: {"error": {"message": "engine died"}}\n\n')
        elif mode == "junk":
            self._sse(b": comment\n\nevent: ping\n\n", _event("ok"), b"data: {not json\n\n")
        elif mode.isdigit():
            self._json(int(mode), {"error": {"message": f"status {mode}"}})
        else:
            self._json(404, {"error": {"message": f"no mode {mode}"}})

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

    def _sse(self, *events: bytes) -> None:
        self._raw(200, "text/event-stream", b"".join(events))


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        """A client that gave up (a test's timeout) before a slow answer was written is expected.
        socketserver printed its traceback from the handler thread, seconds later, into whichever
        test was capturing stderr then (a CLI test that counts its stderr lines failed on it)."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


@pytest.fixture(scope="module")
def server():
    httpd = _Server(("127.0.0.1", 0), _Handler)
    httpd.hits = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _url(server, mode: str) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/{mode}"


@pytest.fixture
def slept(monkeypatch):
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr("hybridllm.backends.cloud_retry._sleep", sleep)
    return waits


def test_a_long_retry_after_cools_that_endpoint_down_and_the_other_answers_without_waiting(server, slept):
    """Before: every request slept min(Retry-After, 60) = 60 s before trying the healthy endpoint,
    and went back to the rate-limited one on the next request."""
    server.hits.clear()
    cloud = CloudBackend(base_url=[_url(server, "429-3600"), _url(server, "ok")], model="m",
                         breaker_threshold=10)
    cloud.endpoints[1].add(100)  # the rate-limited endpoint is the first pick
    for _ in range(3):
        assert cloud.generate(MSGS, P).text == "fine"
    assert [w for w in slept if w > 0] == []
    assert server.hits == ["429-3600", "ok", "ok", "ok"]  # asked once, then left alone


@pytest.mark.parametrize("after", ["3600", "date"])
def test_a_long_retry_after_on_the_only_endpoint_fails_at_once_and_the_device_answers(server, slept, after):
    """Before: the app blocked 60 s per retry (3 minutes with 3 retries) on an hour's Retry-After."""
    from hybridllm import HybridLLM
    from hybridllm.backends.fake import FakeBackend

    server.hits.clear()
    cloud = CloudBackend(base_url=_url(server, f"429-{after}"), model="m", max_retries=3)
    t0 = time.perf_counter()
    waits = r"asked to wait.*Retry-After; it gets no request for (300|299) s more"  # capped at 5 min
    with pytest.raises(CloudRateLimitError, match=waits):
        cloud.generate(MSGS, P)
    assert sum(slept) < 1 and time.perf_counter() - t0 < 5
    assert server.hits == [f"429-{after}"] and not cloud.is_available()
    with HybridLLM(edge=FakeBackend(reply=lambda m: "device"), cloud=cloud, cache=False) as llm:
        c = llm.chat("hi", route="cloud")  # still cooling: not sent at all
    assert (c.text, c.route) == ("device", "edge (cloud unavailable)")
    assert server.hits == [f"429-{after}"]


def test_a_short_retry_after_is_still_waited_for(server, slept):
    server.hits.clear()
    cloud = CloudBackend(base_url=_url(server, "429-2"), model="m", max_retries=1)
    with pytest.raises(CloudRateLimitError, match="after 2 attempts"):
        cloud.generate(MSGS, P)
    assert slept == [2.0] and server.hits == ["429-2", "429-2"]


def test_a_dead_endpoint_is_skipped_without_a_backoff_wait(server, slept):
    """Before: a refused connection on one endpoint cost a backoff sleep before the live one."""
    from tests.cloud_server.api.helpers import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    cloud = CloudBackend(base_url=[dead, _url(server, "ok")], model="m", backoff_base_s=1.0)
    cloud.endpoints[1].add(100)  # the dead one is the first pick
    assert cloud.generate(MSGS, P).text == "fine"
    assert slept == []
    assert cloud.endpoints[0].failures == 1 and cloud.endpoints[0].breaker.state == "open"


def test_an_endpoint_that_answers_a_web_page_says_so(server, slept):
    """Before: 'the stream ... ended before the answer did', which points nowhere near the cause."""
    cloud = CloudBackend(base_url=_url(server, "html"), model="m", max_retries=0)
    with pytest.raises(CloudUnavailableError, match=r"web page \(text/html\).*OpenAI-compatible"):
        cloud.generate(MSGS, P)


def test_a_server_that_ignores_stream_true_still_answers(server, slept):
    cloud = CloudBackend(base_url=_url(server, "plainjson"), model="m", max_retries=0)
    g = cloud.generate(MSGS, P)
    assert (g.text, g.finish_reason, g.usage.completion_tokens) == ("whole", "stop", 1)


@pytest.mark.parametrize("status", [408, 520, 524, 529])
def test_transient_statuses_beyond_the_usual_five_are_retried_and_the_device_answers(server, slept, status):
    """Before: a Cloudflare 524 (origin timeout) or a 529 (overloaded) raised CloudError at the caller,
    with no retry and no answer from the device."""
    from hybridllm import HybridLLM
    from hybridllm.backends.fake import FakeBackend

    server.hits.clear()
    cloud = CloudBackend(base_url=_url(server, str(status)), model="m", max_retries=1, breaker_threshold=10)
    with pytest.raises(CloudUnavailableError, match=f"after 2 attempts: HTTP {status}"):
        cloud.generate(MSGS, P)
    assert server.hits == [str(status)] * 2
    with HybridLLM(edge=FakeBackend(reply=lambda m: "device"), cloud=cloud, cache=False) as llm:
        assert llm.chat("hi", route="cloud").route == "edge (cloud unavailable)"


@pytest.mark.parametrize("mode", ["inband", "junk"])
def test_a_sync_stream_broken_off_mid_answer_leaves_nothing_pending(server, mode, caplog, capfd):
    """Before: 'Task was destroyed but it is pending!' on stderr after each such stream (httpx's inner
    line reader was closed by a task of a loop that was then closed unrun)."""
    import gc

    cloud = CloudBackend(base_url=_url(server, mode), model="m", max_retries=0)
    pieces = []
    with pytest.raises(CloudUnavailableError, match="broke off"):
        for delta in cloud.stream(MSGS, P):
            pieces.append(delta.text)
    gc.collect()
    assert pieces and "destroyed but it is pending" not in caplog.text + capfd.readouterr().err


def test_a_stream_that_breaks_mid_answer_is_finished_by_the_device(server):
    from hybridllm import HybridLLM
    from hybridllm.backends.fake import FakeBackend

    cloud = CloudBackend(base_url=_url(server, "breaks"), model="m", backoff_base_s=0)
    with HybridLLM(edge=FakeBackend(reply=lambda m: " world"), cloud=cloud, cache=False) as llm:
        c = llm.chat("hi", route="cloud")
    assert c.route == "cloud->edge" and c.text.startswith("Hello") and "broke" in c.reason


def test_hung_servers_are_bounded_by_the_read_timeout(server):
    for mode in ("hang", "stallfirst"):
        cloud = CloudBackend(base_url=_url(server, mode), model="m", read_timeout_s=0.3, max_retries=0)
        t0 = time.perf_counter()
        with pytest.raises(CloudUnavailableError, match="ReadTimeout"):
            cloud.generate(MSGS, P)
        assert time.perf_counter() - t0 < 3


def test_closing_a_stream_mid_answer_frees_its_connection_at_once(server):
    """Before: the inner stream was left to the garbage collector, so its connection stayed checked
    out (ACTIVE in the pool) after aclose() returned, until some later turn of the loop."""
    import asyncio

    cloud = CloudBackend(base_url=_url(server, "slow"), model="m")

    async def read_one_then_close() -> list:
        stream = cloud.astream(MSGS, P)
        async for _ in stream:
            break
        await stream.aclose()
        busy = [c for c in cloud._client()._transport._pool.connections if not c.is_closed()]
        await cloud.aclose()
        return busy

    assert asyncio.run(read_one_then_close()) == []
    assert cloud.endpoints[0].outstanding_tokens == 0 and cloud.endpoints[0].breaker.state == "closed"


def test_a_slow_model_list_is_not_waited_on_for_the_whole_read_timeout(server, slept, monkeypatch):
    """Before: discovery waited up to cloud_read_timeout_s (120 s by default) per attempt."""
    monkeypatch.setattr("hybridllm.backends.cloud_request.MODELS_TIMEOUT_S", 0.3)
    server.hits.clear()
    cloud = CloudBackend(base_url=_url(server, "slowmodels"), read_timeout_s=60, max_retries=0)
    t0 = time.perf_counter()
    with pytest.raises(CloudUnavailableError, match="could not list models.*ReadTimeout"):
        cloud.generate(MSGS, P)
    assert time.perf_counter() - t0 < 2.5
    cloud = CloudBackend(base_url=_url(server, "slowmodels"), read_timeout_s=60, max_retries=0, model="m")
    assert cloud.generate(MSGS, P).text == "fine"  # a named model needs no list


def test_a_server_without_a_model_list_says_to_set_cloud_model(server):
    from hybridllm import CloudError

    cloud = CloudBackend(base_url=_url(server, "nomodels"), max_retries=2)
    with pytest.raises(CloudError, match=r"nomodels/v1/models answered HTTP 404.*set cloud_model"):
        cloud.generate(MSGS, P)
    assert CloudBackend(base_url=_url(server, "nomodels"), model="m").generate(MSGS, P).text == "fine"


def test_retry_after_dates_are_gmt_and_absurd_values_do_not_ban_an_endpoint(server, slept, monkeypatch):
    """Before: a '-0000' date was read in the machine's time zone (hours off), 'inf' left the endpoint
    without a request for ever, and a day-long Retry-After left it alone for a day."""
    import email.utils

    from hybridllm.backends import cloud as cloud_mod
    from hybridllm.backends import cloud_retry

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        when = email.utils.formatdate(time.time() + 100).rsplit(" ", 1)[0] + " -0000"
        assert 95 < cloud_mod.parse_retry_after(when) <= 100
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert cloud_mod.parse_retry_after("inf") is None and cloud_mod.parse_retry_after("nan") is None
    monkeypatch.setattr(cloud_retry, "COOL_MAX_S", 0.0)  # stands for 5 minutes
    cloud = CloudBackend(base_url=_url(server, "429-86400"), model="m", max_retries=0)
    with pytest.raises(CloudRateLimitError):
        cloud.generate(MSGS, P)
    assert cloud.is_available()  # the cap has passed: it is asked again


def test_a_sync_stream_read_to_its_end_leaves_nothing_pending(server, caplog, capfd):
    """Before: every whole answer through the sync stream() logged asyncio's 'Task was destroyed
    but it is pending!' (ERROR): closing the loop's generators dropped one more of httpx's, whose
    close task the loop never ran."""
    import gc

    cloud = CloudBackend(base_url=_url(server, "ok"), model="m", max_retries=0)
    for _ in range(2):
        assert "".join(d.text for d in cloud.stream(MSGS, P)) == "fine"
    gc.collect()
    assert "destroyed but it is pending" not in caplog.text + capfd.readouterr().err
