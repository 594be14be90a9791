"""A cloud endpoint's password never reaches the proxy's clients, its banner or `config show`.

Before: with ``--cloud-url http://user:secret@gpu-host:8000`` (an endpoint behind basic auth), a
request answered by the device because the cloud was down carried ``user:secret`` to whoever sent
it, in the ``x-hybridllm-reason`` header and in the ``hybridllm.reason`` field (the reason quotes
the endpoint it could not reach); the startup line printed it into the service's log, and
`hybridllm config show` ("secrets masked") printed it too.
"""

from __future__ import annotations

import argparse
import json
import socket

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from hybridllm import Decision, HybridLLM  # noqa: E402
from hybridllm._serve_cli import public_text  # noqa: E402
from hybridllm.backends.cloud import CloudBackend  # noqa: E402
from hybridllm.backends.fake import FakeBackend  # noqa: E402
from hybridllm.proxy import create_app  # noqa: E402

SECRET = "s3cr3t-pw"
MSGS = [{"role": "user", "content": "hi"}]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _ToCloud:  # the learned router's part: every question goes to the cloud
    def decide(self, messages, *, force=None, prompt_tokens=None, embedding=None):
        return Decision("cloud", "score 0.9", 0.9, messages)


def test_a_down_cloud_behind_basic_auth_shows_no_password_to_clients():
    url = f"http://proxyuser:{SECRET}@127.0.0.1:{_closed_port()}"
    cloud = CloudBackend(base_url=url, model="m", max_retries=0)
    llm = HybridLLM(edge=FakeBackend(reply=lambda m: "device answer"), cloud=cloud, policy=_ToCloud(),
                    cache=False)
    with TestClient(create_app(llm)) as http:
        plain = http.post("/v1/chat/completions", json={"model": "x", "messages": MSGS})
        streamed = http.post("/v1/chat/completions", json={"model": "x", "messages": MSGS, "stream": True})
    llm.close()
    for r in (plain, streamed):
        assert r.status_code == 200, r.text
        assert r.headers["x-hybridllm-route"].startswith("edge")
        assert SECRET not in str(r.headers) and "proxyuser" not in str(r.headers)
        assert SECRET not in r.text and "proxyuser" not in r.text
    # the reason still names the endpoint it could not reach: the operator can tell which
    reason = plain.json()["hybridllm"]["reason"]
    assert "127.0.0.1" in reason and "cannot be reached" in reason, reason
    assert "127.0.0.1" in plain.headers["x-hybridllm-reason"]
    last = [json.loads(ln[6:]) for ln in streamed.text.splitlines()
            if ln.startswith("data: {") and '"hybridllm"' in ln][-1]
    assert "127.0.0.1" in last["hybridllm"]["reason"]


@pytest.mark.parametrize(("text", "public"), [
    ("cloud at http://u:pw@h:8000/v1 down", "cloud at http://***@h:8000/v1 down"),
    ("https://tok@h.example/v1; http://a%40b:p@ss@h2/v1", "https://***@h.example/v1; http://***@h2/v1"),
    ("http://h:8000/v1 and bob@example.com", "http://h:8000/v1 and bob@example.com"),
    ("https://h/v1?next=a@b", "https://h/v1?next=a@b"),  # an @ after the host is no password
])
def test_public_text_masks_only_the_credentials_of_urls(text, public):
    assert public_text(text) == public


def test_the_startup_line_prints_no_password(monkeypatch, capsys):
    from hybridllm import _client, _serve_cli
    from hybridllm.wire import shutdown

    monkeypatch.setattr(_client, "HybridLLM", lambda **kw: HybridLLM(
        edge=FakeBackend(), cloud_url=kw["cloud_url"], cache=False))
    monkeypatch.setattr(shutdown.GracefulServer, "run", lambda self, sockets=None: None)
    parser = argparse.ArgumentParser()
    _serve_cli.register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--port", "0", "--no-cache",
                              "--cloud-url", f"https://proxyuser:{SECRET}@gpu.example:8000"])
    assert _serve_cli.cmd_serve(args) == 0
    out = capsys.readouterr().out
    assert "cloud=https://***@gpu.example:8000" in out, out
    assert SECRET not in out and "proxyuser" not in out


def test_config_show_masks_the_password_of_a_cloud_url(monkeypatch, capsys):
    from hybridllm import _serve_cli

    monkeypatch.setenv("HYBRIDLLM_CLOUD_URL", f"https://proxyuser:{SECRET}@gpu.example:8000,http://h2:9")
    assert _serve_cli.cmd_config_show(argparse.Namespace(config=None)) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["cloud_url"] == ["https://***@gpu.example:8000", "http://h2:9"]
