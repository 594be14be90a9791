"""`hybridllm ask --tools FILE [--tool-choice ...]` (review 38): the file's tools (OpenAI's array, an
object holding one, or bare functions) are checked before any model loads (a usage error naming the
file and what is wrong), reach the client, and each call prints as one ``name({arguments})`` line on
stdout; text answers print as before. Before: ask took no tools. Fast: a fake device that reads
tools; the real run is in the README's CLI table (Qwen2.5-Coder-0.5B on the device)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridllm import HybridLLM, cli
from hybridllm._cli_sampling import _sampling
from hybridllm.cli import build_parser

from .test_tools_library_review36 import ToolDevice

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _file(tmp_path: Path, doc: object) -> str:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("doc", [[WEATHER], {"tools": [WEATHER]}, [WEATHER["function"]], WEATHER["function"]])
def test_the_file_may_hold_the_array_an_object_with_it_or_bare_functions(tmp_path: Path, doc: object) -> None:
    args = build_parser().parse_args(["ask", "--tools", _file(tmp_path, doc), "q"])
    assert _sampling(args)["tools"] == [WEATHER]
    args = build_parser().parse_args(
        ["ask", "--tools", _file(tmp_path, doc), "--tool-choice", "get_weather", "q"]
    )
    assert _sampling(args)["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"tools": 3}, "must hold a JSON array of tools"),
        ([], "must hold a JSON array of tools"),
        ([{"type": "function", "function": {"name": "a b"}}], "tools[0].function.name"),
        (None, "is not JSON"),
    ],
)
def test_a_bad_file_is_a_usage_error_before_any_model_loads(
    tmp_path: Path, doc: object, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _file(tmp_path, doc)
    if doc is None:
        Path(path).write_text("[{")
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["ask", "--tools", path, "q"])
    assert info.value.code == 2 and "argument --tools" in (err := capsys.readouterr().err) and says in err, (
        err
    )


def test_tool_choice_needs_tools(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["ask", "--tool-choice", "auto", "q"]) == 2
    assert "--tool-choice: it needs --tools FILE" in capsys.readouterr().err


def test_ask_prints_each_call_on_its_own_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    edge = ToolDevice()
    monkeypatch.setattr("hybridllm._client.HybridLLM", lambda **_: HybridLLM(edge=edge, cache=False))
    path = _file(tmp_path, [WEATHER])
    assert cli.main(["ask", "--tools", path, "What's the weather in Paris?"]) == 0
    assert capsys.readouterr().out == 'get_weather({"city": "Paris"})\n'
    assert edge.params[-1].tools == (WEATHER,)
    assert cli.main(["ask", "--tools", path, "--json", "weather?"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert (
        done["finish_reason"] == "tool_calls" and done["tool_calls"][0]["function"]["name"] == "get_weather"
    )
    assert cli.main(["ask", "--tools", path, "--tool-choice", "none", "weather?"]) == 0
    assert edge.params[-1].tool_choice == "none"
