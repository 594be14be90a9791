"""Joining a cluster with Ray Client (``ray://HEAD:10001``), whose Serve proxy runs on the cluster,
not here; and a cluster whose Serve runs without HTTP proxies. Fakes of Ray and Serve only: no Ray
starts."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest

from cloud_server.config import ClusterConfig, EngineConfig
from cloud_server.exceptions import ServerError

pytest.importorskip("ray.serve", reason="needs the [cluster] extra")


class _Deployed(Exception):
    """Raised by the fake build_app: the launcher went on to deploy."""


def _fake_serve(monkeypatch, http_config, *, details=None, deploy=False):
    """Serve already running with ``http_config`` (and ``details``, Serve's instance details);
    ``deploy``: the app deploys (else build_app raises _Deployed). Returns launch and the URLs
    its health wait polled."""
    import ray
    from ray import serve
    from ray.serve import context

    from cloud_server.cluster import app, launch

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(serve, "start", lambda **kw: None)
    client = SimpleNamespace(http_config=http_config)
    if details is not None:
        client.get_serve_details = lambda: details
    monkeypatch.setattr(context, "_get_global_client", lambda *a, **kw: client)
    monkeypatch.setattr(serve, "status", lambda: SimpleNamespace(applications={}))

    def build_app(*_args, **_kwargs):
        if not deploy:
            raise _Deployed
        return object()

    monkeypatch.setattr(app, "build_app", build_app)
    monkeypatch.setattr(serve, "run", lambda *a, **kw: None)
    polled: list[str] = []

    def wait(url, *_args, **_kwargs):
        polled.append(url)
        return True

    monkeypatch.setattr(launch, "_wait_healthy", wait)
    return launch, polled


def _start(launch, address, host="0.0.0.0", port=8000):
    return launch.start(EngineConfig("m.gguf"), ClusterConfig(replicas=2, ray_address=address),
                        host=host, port=port)


# -- Ray Client: where the health wait polls ---------------------------------------------------

@pytest.mark.parametrize(("address", "host", "want"), [
    ("ray://head.example:10001", "0.0.0.0", "http://head.example:8000"),
    ("ray://[fd00::1]:10001", "::", "http://[fd00::1]:8000"),
    ("ray://head.example:10001", "10.0.0.5", "http://10.0.0.5:8000"),  # an address of its own
])
def test_ray_client_polls_the_proxy_on_the_cluster_not_this_machine(monkeypatch, address, host, want):
    # used to poll http://0.0.0.0:8000 (this machine, where no proxy runs) for 300 s, then fail
    launch, polled = _fake_serve(monkeypatch, SimpleNamespace(host=host, port=8000), deploy=True)
    assert _start(launch, address, host=host) == want
    assert polled == [want]


def test_ray_client_with_a_loopback_proxy_is_not_polled_and_says_where_it_is(monkeypatch, caplog):
    # 127.0.0.1 (the default --host) binds the head's loopback: nothing here can reach it
    launch, polled = _fake_serve(monkeypatch, SimpleNamespace(host="127.0.0.1", port=8000), deploy=True)
    with caplog.at_level(logging.WARNING, logger="cloud_server.cluster"):
        url = _start(launch, "ray://head.example:10001", host="127.0.0.1")
    assert polled == [] and url == "http://127.0.0.1:8000"
    assert "served on the Ray cluster at ray://head.example:10001" in caplog.text
    assert "curl http://127.0.0.1:8000/health" in caplog.text and "--host 0.0.0.0" in caplog.text


def test_ray_client_proxy_out_of_reach_is_named_instead_of_failing(monkeypatch, caplog):
    # a firewall between here and the head: the app runs there; say where to check it
    launch, _ = _fake_serve(monkeypatch, SimpleNamespace(host="0.0.0.0", port=8000), deploy=True)
    calls: list[tuple] = []
    monkeypatch.setattr(launch, "_wait_healthy", lambda url, **kw: calls.append((url, kw)) or False)
    with caplog.at_level(logging.WARNING, logger="cloud_server.cluster"):
        assert _start(launch, "ray://head.example:10001") == "http://head.example:8000"
    assert calls == [("http://head.example:8000", {"unanswered_s": launch.REMOTE_UNANSWERED_S})]
    assert "does not answer from this machine" in caplog.text
    assert "curl http://127.0.0.1:8000/health" in caplog.text


@pytest.mark.parametrize("address", [None, "auto", "head:6379"])
def test_a_driver_on_a_node_still_polls_its_own_proxy(monkeypatch, address):
    launch, polled = _fake_serve(monkeypatch, SimpleNamespace(host="127.0.0.1", port=8000), deploy=True)
    if address is None:
        monkeypatch.setattr(launch, "_check_port", lambda *a: None)
    assert _start(launch, address, host="127.0.0.1") == "http://127.0.0.1:8000"
    assert polled == ["http://127.0.0.1:8000"]


def test_the_health_wait_gives_up_early_on_a_port_that_never_answers():
    from cloud_server.cluster import launch

    port = launch.free_port()  # nothing listens there
    began = time.monotonic()
    assert launch._wait_healthy(f"http://127.0.0.1:{port}", timeout_s=60.0, unanswered_s=0.5) is False
    assert time.monotonic() - began < 10.0


# -- Serve without HTTP proxies ------------------------------------------------------------------

@pytest.mark.parametrize(("http_config", "details"), [
    # newer Rays: the HTTP options as ever, the location beside them
    (SimpleNamespace(host="0.0.0.0", port=8000), {"proxy_location": "Disabled"}),
    # older Rays: the location in the HTTP options (its enum, spelled NoServer)
    (SimpleNamespace(host="0.0.0.0", port=8000, location=SimpleNamespace(value="NoServer")), None),
])
def test_a_cluster_serve_with_proxy_location_disabled_is_refused_at_once(monkeypatch, http_config,
                                                                         details):
    # its host and port matched ours, so it deployed, then polled a port nobody serves for 300 s
    launch, polled = _fake_serve(monkeypatch, http_config, details=details)
    with pytest.raises(ServerError) as err:
        _start(launch, "head:6379")
    message = str(err.value)
    assert "without an HTTP proxy" in message and "proxy_location" in message
    assert "EveryNode" in message and "head:6379" in message
    assert polled == []


def test_a_cluster_serve_with_proxies_goes_on_to_deploy(monkeypatch):
    launch, _ = _fake_serve(monkeypatch, SimpleNamespace(host="0.0.0.0", port=8000),
                            details={"proxy_location": "EveryNode"})
    with pytest.raises(_Deployed):
        _start(launch, "head:6379")


# -- what to check when Ray Client cannot connect ------------------------------------------------

def test_a_ray_client_address_that_fails_is_told_about_ray_client_not_the_gcs(monkeypatch):
    import ray

    from cloud_server.cluster import launch

    monkeypatch.setattr(launch, "_check_reachable", lambda address: None)

    def init(**_kwargs):
        raise ConnectionError("ray client connection timeout")

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(ServerError) as err:
        launch.init_ray("ray://head.example:10001")
    message = str(err.value)
    assert "Ray Client server" in message and "10001" in message and "Python versions" in message
    assert "GCS" not in message
