"""`hybridllm serve`'s messages at start.

Before: ``--allow-origin '*'`` without an API key started silently, though every web page the user
opens may then call the proxy (the device model, and the cloud and its budget); and a port that
could not be bound on an IPv6 address read ``Cannot listen on ::1:8080`` (the port cannot be told
from the address) instead of ``[::1]:8080``, in both servers' messages (``_cli_options.listen``).
"""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("uvicorn")

from hybridllm import cli  # noqa: E402
from hybridllm._cli_options import listen  # noqa: E402
from hybridllm._exceptions import ConfigError  # noqa: E402


@pytest.fixture
def no_model(monkeypatch, tmp_path):
    """``hybridllm serve`` up to the model's load, which fails: what it printed before is kept."""
    monkeypatch.setenv("HOME", str(tmp_path))  # no config.toml of the machine's
    monkeypatch.delenv("HYBRIDLLM_CONFIG", raising=False)
    monkeypatch.delenv("HYBRIDLLM_SERVE_API_KEYS", raising=False)

    def load(**kw):
        raise ConfigError("no model here")
    monkeypatch.setattr("hybridllm._client.HybridLLM", load)


def _serve(capsys, *argv: str) -> list[str]:
    assert cli.main(["serve", "--port", "0", *argv]) == 1  # the model's load failed, after the warnings
    return capsys.readouterr().err.splitlines()


def test_any_origin_without_a_key_warns_before_the_model_loads(no_model, capsys):
    err = _serve(capsys, "--allow-origin", "*")  # on loopback: the browser is on this machine
    warnings = [line for line in err if line.startswith("hybridllm serve: warning: ")]
    assert len(warnings) == 1 and "--allow-origin '*'" in warnings[0], err
    assert "HYBRIDLLM_SERVE_API_KEYS" in warnings[0], err
    assert err[-1] == "error: no model here", err  # printed before the load


@pytest.mark.parametrize("argv", [
    ["--allow-origin", "https://app.example:3000"],  # one page the operator names
    ["--allow-origin", "*", "--api-key", "k1"],  # a page still needs the key
    [],
])
def test_no_warning_for_a_named_origin_or_with_a_key(no_model, capsys, argv):
    err = _serve(capsys, *argv)
    assert not [line for line in err if "warning" in line], err


def _busy_ipv6_port() -> socket.socket:
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.bind(("::1", 0))
        sock.listen(1)
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    return sock


def test_an_ipv6_address_that_cannot_be_bound_is_bracketed(no_model, capsys):
    busy = _busy_ipv6_port()
    port = busy.getsockname()[1]
    try:
        with pytest.raises(ConfigError, match=rf"^Cannot listen on \[::1\]:{port}: "):
            listen("::1", port, ConfigError)
        assert cli.main(["serve", "--host", "::1", "--port", str(port)]) == 1
    finally:
        busy.close()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: Cannot listen on [::1]:{port}: "), err


@pytest.mark.parametrize(("host", "says"), [
    ("fe80::1%nosuch", "Cannot listen on [fe80::1%nosuch]:8080: "),  # the other message, bracketed too
    ("[::1]", "Cannot listen on [::1]:8080: "),  # brackets given are not doubled
    ("nosuch.example", "Cannot listen on nosuch.example:8080: "),
])
def test_a_host_that_cannot_be_resolved_is_written_as_a_url_writes_it(monkeypatch, host, says):
    def no_such_host(*args, **kwargs):  # no name service asked: the same answer on any machine
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    with pytest.raises(ConfigError) as error:
        listen(host, 8080, ConfigError)
    assert str(error.value) == f"{says}Name or service not known.", error.value


@pytest.mark.parametrize(("given", "page"), [
    ("https://App.Example:443", "https://app.example"),  # a browser drops the default port
    ("HTTP://chat.example:80/", "http://chat.example"),
    ("http://app.example:8443", "http://app.example:8443"),  # another port is kept
    ("https://[::1]:443", "https://[::1]"),
])
def test_an_allowed_origin_is_kept_in_the_spelling_a_browser_sends(given, page):
    """Before: the option was kept as written and compared as a string with the ``Origin`` header,
    so ``--allow-origin https://App.Example:443`` let nothing in: the page got 403s."""
    from fastapi.testclient import TestClient

    from hybridllm import HybridLLM
    from hybridllm.backends.fake import FakeBackend
    from hybridllm.proxy import create_app

    args = cli.build_parser().parse_args(["serve", "--allow-origin", given])
    assert args.allow_origin == [page]
    llm = HybridLLM(edge=FakeBackend(), cache=False)
    try:
        with TestClient(create_app(llm, allow_origins=args.allow_origin)) as http:
            answer = http.get("/v1/models", headers={"origin": page})
    finally:
        llm.close()
    assert answer.status_code == 200, answer.text
    assert answer.headers["access-control-allow-origin"] == page
