"""`hybridllm serve`'s access log names each request's X-Request-Id (fakes, fast).

Before: uvicorn's access line (``--log-level info``) had no id, so the line of a request a client
reported by its X-Request-Id could not be found, while the proxy's own error lines ended with
``[request_id=ID]``. Now the access line ends with it too (``-`` outside a request)."""

from __future__ import annotations

import io
import logging
import re
import socket
import urllib.request

import pytest

pytest.importorskip("fastapi")
import uvicorn  # noqa: E402

from hybridllm import HybridLLM, cli  # noqa: E402
from hybridllm._request_id import REQUEST_ID  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402
from hybridllm.wire.middleware import access_log_config  # noqa: E402
from hybridllm.wire.shutdown import GracefulServer  # noqa: E402
from tests._uvicorn_thread import serving  # noqa: E402


def _access_output() -> io.StringIO:
    """The access handler's output (uvicorn's formatter and filters), into a buffer."""
    out = io.StringIO()
    (handler,) = logging.getLogger("uvicorn.access").handlers
    handler.setStream(out)
    return out


def test_a_real_servers_access_lines_carry_the_request_id():
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "one two"), cache=False)
    app = create_app(llm)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="info",
                            log_config=access_log_config())
    out = _access_output()
    server = GracefulServer(config, app.state.drain, 0.3)
    try:
        with serving(server):
            url = f"http://127.0.0.1:{port}"
            given = urllib.request.urlopen(urllib.request.Request(
                f"{url}/health", headers={"X-Request-Id": "trace-5"}), timeout=10)
            new = urllib.request.urlopen(f"{url}/v1/models", timeout=10)
    finally:
        llm.close()
    assert given.headers["x-request-id"] == "trace-5"
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    assert len(lines) == 2, lines
    assert '"GET /health HTTP/1.1" 200' in lines[0] and lines[0].endswith(" [request_id=trace-5]"), lines
    assert re.search(r"\[request_id=([0-9a-f]{32})\]$", lines[1]).group(1) == new.headers["x-request-id"]


def test_an_access_line_outside_a_request_says_dash():
    uvicorn.Config(lambda *a: None, log_level="info", log_config=access_log_config())
    out = _access_output()
    logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', "1.2.3.4:5", "GET", "/", "1.1", 200)
    assert out.getvalue().rstrip().endswith('"GET / HTTP/1.1" 200 OK [request_id=-]'), out.getvalue()


def test_hybridllm_serve_configures_the_access_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))  # no config.toml of the machine's
    monkeypatch.delenv("HYBRIDLLM_CONFIG", raising=False)
    monkeypatch.delenv("HYBRIDLLM_SERVE_API_KEYS", raising=False)
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "hi"), cache=False)
    monkeypatch.setattr("hybridllm._client.HybridLLM", lambda **kw: llm)
    written: list[str] = []

    class Server:  # what uvicorn would write for a request, instead of serving
        def __init__(self, config, drain, grace_s):
            self.config = config

        def run(self, sockets):
            out = _access_output()
            token = REQUEST_ID.set("trace-8")
            try:
                logging.getLogger("uvicorn.access").info(
                    '%s - "%s %s HTTP/%s" %d', "1.2.3.4:5", "GET", "/health", "1.1", 200)
            finally:
                REQUEST_ID.reset(token)
            written.append(out.getvalue())

    monkeypatch.setattr("hybridllm.wire.shutdown.GracefulServer", Server)
    assert cli.main(["serve", "--port", "0", "--log-level", "info"]) == 0
    line = written[0].rstrip() if written else ""
    assert line.endswith('"GET /health HTTP/1.1" 200 OK [request_id=trace-8]'), written
