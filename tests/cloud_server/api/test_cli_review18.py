"""``hybridllm-cloud serve``: the open-server warning's loopback rule, ``--access-log`` and the
autoscaling bounds' advice (in-process, no model, no Ray: fast).

Before: the warning for a server without a key compared ``--host`` with three strings, so
``127.0.0.2`` or ``0:0:0:0:0:0:0:1`` (loopback, and not warned of by ``hybridllm serve``) were
warned of; no request could be logged at all (uvicorn's access log was off, with no option); and
``--replicas 2 --min-replicas 0 --max-replicas 1`` advised ``--replicas`` from 0, which is refused."""

from __future__ import annotations

import io
import logging
import re
import socket
import urllib.request
from typing import Any

import pytest
import uvicorn

import cloud_server.__main__ as cli
from cloud_server.__main__ import build_parser
from cloud_server.api.auth import API_KEYS_ENV
from cloud_server.config import ClusterConfig
from cloud_server.exceptions import ConfigError
from tests._uvicorn_thread import serving

from .fake_engine import FakeEngine


class _Stop(Exception):
    """Raised where uvicorn would start: the test has what it needs by then."""


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``serve`` up to uvicorn: no model check, no device check; what reaches uvicorn.Config and
    the socket bound are recorded (the socket closed after the test)."""
    monkeypatch.delenv(API_KEYS_ENV, raising=False)
    for name in ("_check_model", "_check_model_header", "_check_device"):
        monkeypatch.setattr(cli, name, lambda *a, **k: None)
    seen: dict[str, Any] = {"socks": []}
    real_listen = cli.listen

    def listen(*args: Any) -> socket.socket:
        sock = real_listen(*args)
        seen["socks"].append(sock)
        return sock

    def config(app: Any, **kwargs: Any) -> None:
        seen["config"] = kwargs
        raise _Stop

    monkeypatch.setattr(cli, "listen", listen)
    monkeypatch.setattr(uvicorn, "Config", config)
    yield seen
    for sock in seen["socks"]:
        sock.close()


def _serve(*options: str) -> None:
    args = build_parser().parse_args(["serve", "--model", "smollm2-135m-instruct", "--port", "0", *options])
    with pytest.raises(_Stop):
        cli.serve(args)


def _open_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "no API key configured" in r.getMessage()]


@pytest.mark.parametrize("host", ["127.0.0.2", "0:0:0:0:0:0:0:1", "::1", "localhost", "127.0.0.1"])
def test_a_loopback_host_in_any_spelling_is_not_warned_of(served, caplog, host: str) -> None:
    caplog.set_level(logging.WARNING, logger="cloud_server")
    _serve("--host", host)
    assert _open_warnings(caplog) == []


def test_a_host_off_loopback_without_a_key_is_warned_of(served, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="cloud_server")
    _serve("--host", "0.0.0.0")
    assert _open_warnings(caplog) == [
        "no API key configured and listening on 0.0.0.0: anyone who can reach it can use it"]
    caplog.clear()
    _serve("--host", "0.0.0.0", "--api-key", "sk-1")
    assert _open_warnings(caplog) == []


@pytest.mark.parametrize("host, warned", [("127.0.0.2", False), ("0:0:0:0:0:0:0:1", False),
                                          ("0.0.0.0", True)])
def test_the_cluster_warns_by_the_same_rule(monkeypatch, served, caplog, host: str, warned: bool) -> None:
    import cloud_server.cluster.launch as launch

    monkeypatch.setattr(launch, "serve_cluster", lambda *a, **k: 0)
    caplog.set_level(logging.WARNING, logger="cloud_server")
    args = build_parser().parse_args(["serve", "--model", "smollm2-135m-instruct", "--port", "8123",
                                      "--replicas", "2", "--host", host])
    assert cli.serve(args) == 0
    assert bool(_open_warnings(caplog)) is warned


def test_access_log_is_off_by_default_and_on_with_the_flag(served) -> None:
    _serve()
    assert served["config"]["access_log"] is False
    _serve("--access-log")
    assert served["config"]["access_log"] is True
    fmt = served["config"]["log_config"]["formatters"]["access"]["fmt"]
    assert fmt.endswith(" [request_id=%(request_id)s]")


def test_access_log_with_replicas_is_a_usage_error(capsys) -> None:
    code = cli.main(["serve", "--model", "smollm2-135m-instruct", "--port", "8123", "--replicas", "2",
                     "--access-log"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--access-log" in err[0] and "--replicas" in err[0], err


def test_the_access_lines_carry_the_request_id(served) -> None:
    """The options serve gives uvicorn, on the cloud app (a fake engine): one line a request, ending
    with the id its answer carries."""
    _serve("--access-log")
    kwargs = served["config"]
    from cloud_server.api.server import create_app

    app = create_app(lambda: FakeEngine())
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    from uvicorn.config import Config  # the real one: uvicorn.Config is the fixture's recorder

    server = uvicorn.Server(Config(app, host="127.0.0.1", port=port, **kwargs))
    out = io.StringIO()
    (handler,) = logging.getLogger("uvicorn.access").handlers
    handler.setStream(out)
    with serving(server):
        url = f"http://127.0.0.1:{port}"
        urllib.request.urlopen(urllib.request.Request(f"{url}/v1/models", headers={"X-Request-Id": "p-7"}),
                               timeout=10)
        new = urllib.request.urlopen(f"{url}/v1/models", timeout=10)
    lines = [line for line in out.getvalue().splitlines() if "GET /v1/models" in line]
    assert len(lines) == 2, out.getvalue()
    assert lines[0].endswith(" [request_id=p-7]"), lines
    assert re.search(r"\[request_id=(\S+)\]$", lines[1]).group(1) == new.headers["x-request-id"]


@pytest.mark.parametrize("given, advice", [
    (dict(replicas=2, min_replicas=0, max_replicas=1), "give --replicas from 1 to 1"),
    (dict(replicas=5, min_replicas=0, max_replicas=3), "give --replicas from 1 to 3"),
    (dict(replicas=1, min_replicas=2), "give --replicas from 2 to 2"),
])
def test_the_replicas_advice_is_a_count_the_option_takes(given: dict[str, int], advice: str) -> None:
    with pytest.raises(ConfigError) as info:
        ClusterConfig(**given)
    assert str(info.value).endswith(advice), str(info.value)


def test_one_gpu_with_replicas_is_a_usage_error(monkeypatch, capsys) -> None:
    """Before: refused only by the deployment, after Ray had been imported, with exit status 1."""
    import cloud_server.cluster.launch as launch

    monkeypatch.setattr(launch, "serve_cluster", lambda *a, **k: 0)
    monkeypatch.setattr(cli, "_check_model_header", lambda *a, **k: None)
    code = cli.main(["serve", "--model", "smollm2-135m-instruct", "--port", "8123", "--replicas", "2",
                     "--device", "cuda:1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--device cuda:1 names one GPU" in err[0], err
