"""`hybridllm ask --tools FILE` where no model can call them (a device model without a tool format,
no cloud): the error speaks the CLI's terms (`--model`, HYBRIDLLM_CLOUD_URL, `--tool-choice none`).
Before, it named the library's keyword arguments (``pass cloud_url=...``, an ``edge_model``), which
a CLI user cannot pass. ``--tool-choice none`` is a text answer the device gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridllm import HybridLLM, cli
from hybridllm.backends.fake import FakeBackend

from .test_cli_tools_review38 import WEATHER
from .test_tools_library_review36 import ToolDevice


@pytest.fixture
def tools_file(tmp_path: Path) -> str:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps([WEATHER]))
    return str(path)


def _device(monkeypatch: pytest.MonkeyPatch, edge: FakeBackend) -> None:
    monkeypatch.setattr("hybridllm._client.HybridLLM", lambda **_: HybridLLM(edge=edge, cache=False))


def test_no_model_to_call_them_is_said_in_the_clis_terms(
    tools_file: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _device(monkeypatch, FakeBackend(model="small-model", reply=lambda m: "hello"))
    assert cli.main(["ask", "--tools", tools_file, "Say hi."]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("error: --tools needs a model that calls tools, and the device model (small-model)")
    assert "--model qwen2.5-coder-0.5b-instruct" in err and "HYBRIDLLM_CLOUD_URL" in err
    assert "--tool-choice none" in err and "cloud_url=" not in err
    assert cli.main(["ask", "--tools", tools_file, "--tool-choice", "none", "Say hi."]) == 0
    assert capsys.readouterr().out == "hello\n"


def test_a_device_that_calls_tools_is_not_refused(
    tools_file: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _device(monkeypatch, ToolDevice())
    assert cli.main(["ask", "--tools", tools_file, "What's the weather in Paris?"]) == 0
    assert capsys.readouterr().out == 'get_weather({"city": "Paris"})\n'
