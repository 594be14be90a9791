"""The cloud server's opt-in CORS (``--allow-origin``, as ``hybridllm serve`` has): without it no
page may read an answer (no CORS headers; a preflight is refused); with it the pages named may,
preflight included, and the API key is still checked. A refused preflight is OpenAI's JSON error
saying what to do, not a bare text."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from cloud_server.api.server import create_app
from cloud_server.cli_parser import build_parser

from .fake_engine import FakeEngine

PAGE = "https://chat.example:3000"
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
PREFLIGHT = {"Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"}


def _client(**options) -> Iterator[TestClient]:
    engine = FakeEngine(step_s=0.0, max_model_len=128)
    with TestClient(create_app(lambda: engine, **options)) as client:
        deadline = time.monotonic() + 10
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "the fake engine did not come up"
            time.sleep(0.01)
        yield client


@pytest.fixture(scope="module")
def allowed() -> Iterator[TestClient]:
    yield from _client(api_keys=["sk-1"], allow_origins=[PAGE + "/"])


@pytest.fixture(scope="module")
def closed() -> Iterator[TestClient]:
    yield from _client(api_keys=["sk-1"])


def test_an_allowed_page_passes_its_preflight(allowed: TestClient) -> None:
    r = allowed.options("/v1/chat/completions", headers={"Origin": PAGE, **PREFLIGHT})
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == PAGE
    assert "POST" in r.headers["access-control-allow-methods"]


def test_an_allowed_page_reads_the_answer_and_its_request_id(allowed: TestClient) -> None:
    r = allowed.post("/v1/chat/completions", json=CHAT,
                     headers={"Origin": PAGE, "Authorization": "Bearer sk-1"})
    assert r.status_code == 200, r.text
    assert r.headers["access-control-allow-origin"] == PAGE
    assert "x-request-id" in r.headers["access-control-expose-headers"].lower()


def test_the_key_is_still_checked_and_its_401_readable(allowed: TestClient) -> None:
    r = allowed.post("/v1/chat/completions", json=CHAT, headers={"Origin": PAGE})
    assert r.status_code == 401
    assert r.headers["access-control-allow-origin"] == PAGE  # the page can tell the user why


def test_another_pages_preflight_is_a_json_error_naming_the_option(allowed: TestClient) -> None:
    r = allowed.options("/v1/chat/completions", headers={"Origin": "https://evil.example", **PREFLIGHT})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "origin_not_allowed" and "--allow-origin https://evil.example" in err["message"]
    assert "access-control-allow-origin" not in r.headers


def test_off_by_default(closed: TestClient) -> None:
    r = closed.post("/v1/chat/completions", json=CHAT,
                    headers={"Origin": PAGE, "Authorization": "Bearer sk-1"})
    assert r.status_code == 200
    assert "access-control-allow-origin" not in r.headers
    pre = closed.options("/v1/chat/completions", headers={"Origin": PAGE, **PREFLIGHT})
    assert "access-control-allow-origin" not in pre.headers


def test_the_cli_takes_the_option_repeatable_and_normalized() -> None:
    args = build_parser().parse_args(["serve", "--model", "m", "--allow-origin", "HTTPS://Chat.Example:443/",
                                      "--allow-origin", "*"])
    assert args.allow_origin == ["https://chat.example", "*"]
    assert build_parser().parse_args(["serve", "--model", "m"]).allow_origin == []
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model", "m", "--allow-origin", "chat.example/path"])


class _Stop(Exception):
    """Raised where the server would be built: the test has what it needs by then."""


def test_serve_hands_the_origins_to_the_app_and_to_the_cluster(monkeypatch) -> None:
    import cloud_server.__main__ as cli
    import cloud_server.api.server as server
    import cloud_server.cluster.launch as launch
    from cloud_server.api.auth import API_KEYS_ENV

    monkeypatch.delenv(API_KEYS_ENV, raising=False)
    for name in ("_check_model", "_check_model_header", "_check_device"):
        monkeypatch.setattr(cli, name, lambda *a, **k: None)
    seen: dict[str, object] = {}

    def app(*args: object, **kwargs: object) -> None:
        seen.update(kwargs)
        raise _Stop

    def cluster(*args: object, app_options: dict, **kwargs: object) -> int:
        seen["cluster"] = app_options.get("allow_origins")
        return 0

    monkeypatch.setattr(server, "create_app", app)
    monkeypatch.setattr(launch, "serve_cluster", cluster)
    base = ["serve", "--model", "smollm2-135m-instruct", "--allow-origin", PAGE]
    with pytest.raises(_Stop):
        cli.serve(build_parser().parse_args([*base, "--port", "0"]))
    assert seen["allow_origins"] == [PAGE]
    assert cli.serve(build_parser().parse_args([*base, "--port", "8123", "--replicas", "2"])) == 0
    assert seen["cluster"] == [PAGE]
