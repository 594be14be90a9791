"""Joining a cluster whose Serve already runs: its proxy keeps the host and port it started with
(``serve.start`` only logs that ours are ignored). Fakes of Ray and Serve only: no Ray starts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cloud_server.config import ClusterConfig, EngineConfig
from cloud_server.exceptions import ServerError

pytest.importorskip("ray.serve", reason="needs the [cluster] extra")


class _Deployed(Exception):
    """Raised by the fake build_app: the launcher went on to deploy."""


def _fake_serve(monkeypatch, http_config):
    import ray
    from ray import serve
    from ray.serve import context

    from cloud_server.cluster import app, launch

    started: list[dict] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(serve, "start", lambda **kw: started.append(kw))
    client = SimpleNamespace(http_config=http_config)
    monkeypatch.setattr(context, "_get_global_client", lambda *a, **kw: client)
    monkeypatch.setattr(serve, "status", lambda: SimpleNamespace(applications={}))

    def build_app(*_args, **_kwargs):
        raise _Deployed

    monkeypatch.setattr(app, "build_app", build_app)
    monkeypatch.setattr(launch, "_wait_healthy", lambda url: pytest.fail("polled /health"))
    return launch, started


def _start(launch, host="0.0.0.0", port=8000):
    launch.start(EngineConfig("m.gguf"), ClusterConfig(replicas=2, ray_address="head:6379"),
                 host=host, port=port)


def test_a_cluster_whose_proxy_listens_elsewhere_is_refused_at_once_saying_where(monkeypatch):
    # used to deploy, then poll http://0.0.0.0:9000/health for 300 s before a vague error
    launch, started = _fake_serve(monkeypatch, SimpleNamespace(host="0.0.0.0", port=8000))
    with pytest.raises(ServerError) as err:
        _start(launch, port=9000)
    message = str(err.value)
    assert "proxy listening on 0.0.0.0:8000" in message and "0.0.0.0:9000 asked for" in message
    assert "--host 0.0.0.0 --port 8000" in message and "serve shutdown" in message
    assert "head:6379" in message
    assert started == [{"http_options": {"host": "0.0.0.0", "port": 9000}}]


def test_a_proxy_on_another_host_is_refused_too(monkeypatch):
    # asked for 0.0.0.0 (reachable from other machines) but Serve listens on loopback only
    launch, _ = _fake_serve(monkeypatch, SimpleNamespace(host="127.0.0.1", port=8000))
    with pytest.raises(ServerError, match=r"listening on 127\.0\.0\.1:8000, not on the 0\.0\.0\.0:8000"):
        _start(launch)


def test_an_ipv6_proxy_is_named_in_brackets(monkeypatch):
    launch, _ = _fake_serve(monkeypatch, SimpleNamespace(host="::", port=8000))
    with pytest.raises(ServerError,
                       match=r"listening on \[::\]:8000, not on the \[::1\]:8000 .*--host :: --port"):
        _start(launch, host="::1")


def test_a_cluster_serve_without_a_proxy_is_refused(monkeypatch):
    launch, _ = _fake_serve(monkeypatch, SimpleNamespace(host=None, port=8000))
    with pytest.raises(ServerError, match="without an HTTP proxy"):
        _start(launch)


@pytest.mark.parametrize("host", ["0.0.0.0", "::1"])
def test_a_proxy_where_asked_goes_on_to_deploy(monkeypatch, host):
    launch, _ = _fake_serve(monkeypatch, SimpleNamespace(host=host, port=8000))
    with pytest.raises(_Deployed):
        _start(launch, host=host)


def test_an_unreadable_serve_config_goes_on_to_deploy(monkeypatch):
    from ray.serve import context

    launch, _ = _fake_serve(monkeypatch, None)

    def broken(*_args, **_kwargs):
        raise RuntimeError("no controller")

    monkeypatch.setattr(context, "_get_global_client", broken)
    with pytest.raises(_Deployed):
        _start(launch)


def test_the_health_wait_ignores_http_proxy_variables(monkeypatch):
    # with HTTP_PROXY set (a corporate network), /health of this machine's own Serve port went
    # through that proxy, which cannot reach it: 300 s of polling, then "did not become healthy"
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from cloud_server.cluster import launch

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the stdlib's name)
            body = b'{"status": "ok"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.setenv(name, "http://127.0.0.1:9")  # a proxy nobody runs
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        launch._wait_healthy(f"http://127.0.0.1:{server.server_port}", timeout_s=3.0)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_an_app_left_on_the_cluster_says_how_to_remove_it(monkeypatch, caplog, error):
    # a second Ctrl-C while the app drains (or a failed deletion) left its replicas on the
    # cluster, holding their CPUs and GPUs, with no word of how to get rid of them
    import logging

    import ray
    from ray import serve

    from cloud_server.cluster import launch

    def delete(name):
        raise error("interrupted")

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(serve, "delete", delete)
    monkeypatch.setattr(ray, "shutdown", lambda: pytest.fail("a joined cluster shut down"))
    with caplog.at_level(logging.WARNING, logger="cloud_server.cluster"), pytest.raises(error):
        launch.stop(ClusterConfig(replicas=1, ray_address="head:6379"), None)
    assert "'hybridllm' is left on the Ray cluster at head:6379" in caplog.text
    assert "--ray-address head:6379 --replace" in caplog.text


def test_a_bracketed_ipv6_host_is_refused_before_serve_starts(monkeypatch):
    # "[::1]" (as a URL writes it) went to Serve's proxies on the cluster, which cannot bind it
    launch, started = _fake_serve(monkeypatch, SimpleNamespace(host="[::1]", port=8000))
    with pytest.raises(ServerError,
                       match=r"--host \[::1\]: write an IPv6 address without brackets \(--host ::1\)"):
        _start(launch, host="[::1]")
    assert started == []


def test_another_serves_app_on_the_cluster_is_named_first(monkeypatch):
    # a second serve on the cluster on another port: the app already there is the reason to name
    from ray import serve

    launch, _ = _fake_serve(monkeypatch, SimpleNamespace(host="0.0.0.0", port=8000))
    app = SimpleNamespace(status="ApplicationStatus.RUNNING")
    monkeypatch.setattr(serve, "status", lambda: SimpleNamespace(applications={"hybridllm": app}))
    with pytest.raises(ServerError, match="already runs on the Ray cluster at head:6379 .*--replace"):
        _start(launch, port=9000)
