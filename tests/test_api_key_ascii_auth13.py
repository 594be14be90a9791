"""An API key with a character past ASCII (or a control character) is refused when the keys are
loaded. Before, it was accepted and could never match: the server reads a header value as
latin-1 and hashes the key as UTF-8, so every request, the right key included, got a 401."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from hybridllm.wire.auth import ApiKeyChecker, load_api_keys


def test_a_non_ascii_key_could_never_match_through_http():
    """Why: the same key sent by a client, as its UTF-8 bytes, fails the check."""
    app = FastAPI()
    checker = ApiKeyChecker(["clé-secrète"])

    @app.get("/")
    def root(request: Request):
        try:
            checker.check(request.headers.get("authorization"))
        except Exception:
            return {"ok": False}
        return {"ok": True}

    with TestClient(app) as client:
        sent = {"authorization": "Bearer clé-secrète".encode()}
        assert client.get("/", headers=sent).json() == {"ok": False}


@pytest.mark.parametrize("key", ["clé-secrète", "key\x07bell", "ключ"])
@pytest.mark.parametrize("where", ["cli", "env", "file"])
def test_keys_a_header_cannot_carry_are_refused_at_load(key, where, tmp_path):
    kw: dict = {"env_var": "K", "environ": {}}
    if where == "cli":
        kw["cli_keys"] = [key]
    elif where == "env":
        kw["environ"] = {"K": f"good-key,{key}"}
    else:
        path = tmp_path / "keys"
        path.write_text(f"good-key\n{key}\n", encoding="utf-8")
        kw["key_file"] = path
    with pytest.raises(ValueError, match="printable ASCII"):
        load_api_keys(**kw)


def test_ordinary_keys_still_load():
    keys = load_api_keys(["sk-abc_123.XYZ~!@#$%^&*()"], environ={"K": "k2, k3"}, env_var="K")
    assert keys == ["sk-abc_123.XYZ~!@#$%^&*()", "k2", "k3"]
