"""JSON null in any optional request field is the field left out, as vLLM reads it.

Before, ``"echo": null`` on ``/v1/completions`` (and ``ignore_eos`` or
``stream_options.include_usage`` null) was a 400 "Input should be a valid boolean": clients other
than OpenAI's own send null for every optional field they leave unset. Checked field by field over
both request models, in the JSON schema too, and against the real server (SmolLM2), whose key comes
from a key file saved with a BOM (Windows Notepad), which used to keep the BOM in the key.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from hybridllm.wire.errors import WireError
from hybridllm.wire.requests import ChatCompletionRequest, CompletionRequest, StreamOptions, parse_request

from .api.helpers import ROOT, free_port, stop_process, wait_healthy_url

BASE: dict[type[BaseModel], dict[str, Any]] = {
    ChatCompletionRequest: {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    CompletionRequest: {"model": "m", "prompt": "hi"},
    StreamOptions: {},
}
OPTIONAL = [(model, name) for model in BASE for name, info in model.model_fields.items()
            if not info.is_required()]


@pytest.mark.parametrize(("model", "name"), OPTIONAL, ids=[f"{m.__name__}.{n}" for m, n in OPTIONAL])
def test_null_is_the_field_left_out(model: type[BaseModel], name: str) -> None:
    absent = parse_request(model, dict(BASE[model]))
    null = parse_request(model, {**BASE[model], name: None})
    assert getattr(null, name) in (getattr(absent, name), None)
    if model.model_fields[name].default is None or name == "max_tokens":
        return  # a field whose null is its own value ("max_tokens": null: the server's default)
    assert getattr(null, name) == getattr(absent, name)


@pytest.mark.parametrize(("model", "name"), OPTIONAL, ids=[f"{m.__name__}.{n}" for m, n in OPTIONAL])
def test_the_schema_lists_null_for_every_optional_field(model: type[BaseModel], name: str) -> None:
    schema = model.model_json_schema()
    prop = schema["properties"][name]
    assert {"type": "null"} in prop.get("anyOf", []), (name, prop)


def test_null_does_not_stand_for_a_required_field_or_hide_a_refusal() -> None:
    with pytest.raises(WireError) as info:
        parse_request(CompletionRequest, {"model": None, "prompt": "hi"})
    assert info.value.param == "model"
    with pytest.raises(WireError) as info:
        parse_request(CompletionRequest, {"model": "m", "prompt": "hi", "echo": True})
    assert info.value.param == "echo" and "not supported" in str(info.value)
    with pytest.raises(WireError) as info:  # stream null is stream false: no stream_options
        parse_request(CompletionRequest, {"model": "m", "prompt": "hi", "stream": None,
                                          "stream_options": {"include_usage": True}})
    assert info.value.param == "stream_options"


def _all_null(request: type[BaseModel], **given: Any) -> dict[str, Any]:
    return {**{name: None for m, name in OPTIONAL if m is request}, **given}


KEY = "sk-notepad-key"
MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text(f"{KEY}\r\n", encoding="utf-8-sig")  # a BOM, and CRLF, as Notepad saves
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cloud_server", "serve", "--model", str(smollm2_path), "--port", str(port),
         "--num-threads", "1", "--max-model-len", "256", "--api-key-file", str(key_file),
         "--served-model-name", MODEL],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy_url(url, 120, proc)
        yield url
    finally:
        stop_process(proc)


@pytest.mark.real
def test_the_real_server_reads_nulls_as_absent_and_the_bom_keys_first_key(server: str) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    completion = _all_null(CompletionRequest, model=MODEL, prompt="Hello", max_tokens=3)
    response = httpx.post(f"{server}/v1/completions", json=completion, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] <= 3

    chat = _all_null(ChatCompletionRequest, model=MODEL, max_tokens=3,
                     messages=[{"role": "user", "content": "Hi", "name": None}])
    response = httpx.post(f"{server}/v1/chat/completions", json=chat, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["role"] == "assistant"

    streamed = {**chat, "stream": True, "stream_options": {"include_usage": None}}
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=streamed, headers=headers,
                      timeout=60) as response:
        assert response.status_code == 200, response.read()
        assert any(line == "data: [DONE]" for line in response.iter_lines())

    wrong = httpx.post(f"{server}/v1/completions", json=completion, timeout=60,
                       headers={"Authorization": f"Bearer {KEY}x"})
    assert wrong.status_code == 401  # keys are still checked
