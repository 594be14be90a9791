"""The command line as a first-time user meets it (review 40):

- `ask --tools FILE` with a `--tool-choice` naming no tool in FILE, or with a format option
  (`--json-object`, `--json-schema`, `--choice`, `--regex`) and no `--tool-choice none`, is a usage
  error (exit 2) naming the options; before, an error of the run (exit 1) in the library's terms
  (`Invalid 'tool_choice': no function named ... in 'tools'`, `... tool_choice='none'`). A blank
  `--tool-choice` is refused as parsed.
- a `router` input file given as a folder (`--data`, `--cascade-data`, `--prompts`) is a usage
  error saying it is a folder; before, "DIR does not exist" (exit 1), for a path that is there.
- `hybridllm router` without its action names it ACTION, as the other groups do; before,
  "the following arguments are required: router_command".
- `models remove` given one model twice in two spellings removes and reports it once; before, a
  second "removed ID: 0 paths, 0 B" line under the user's spelling.

Fast: argument checks before anything loads, and a pull that links the package's file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridllm import cli

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
}


@pytest.fixture
def tools_file(tmp_path: Path) -> str:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps([WEATHER]))
    return str(path)


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks must come before the client is built: building one fails the test."""

    def refuse(_args: object) -> None:
        raise AssertionError("the client was built before the options were checked")

    monkeypatch.setattr("hybridllm._chat_cli._client", refuse)


def test_a_tool_choice_naming_no_tool_in_the_file_is_a_usage_error(
    tools_file: str, no_model: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["ask", "--tools", tools_file, "--tool-choice", "get_wether", "q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hybridllm ask: error: argument --tool-choice:")
    assert "'get_wether'" in err and "get_weather" in err and len(err.splitlines()) == 1


def test_a_blank_tool_choice_is_refused_as_parsed(tools_file: str, no_model: None) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["ask", "--tools", tools_file, "--tool-choice", "", "q"])
    assert info.value.code == 2


@pytest.mark.parametrize(
    "option",
    [["--json-object"], ["--choice", "yes", "--choice", "no"], ["--regex", "[a-z]+"]],
)
def test_tools_with_a_format_option_is_a_usage_error_in_the_options_terms(
    tools_file: str, no_model: None, option: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["ask", "--tools", tools_file, *option, "q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hybridllm ask: error: --tools cannot be combined with {option[0]}")
    assert "--tool-choice none" in err and "response_format" not in err


def test_tool_choice_none_still_takes_a_format(tools_file: str) -> None:
    from hybridllm._cli_sampling import _sampling

    args = cli.build_parser().parse_args(
        ["ask", "--tools", tools_file, "--tool-choice", "none", "--json-object", "q"]
    )
    assert _sampling(args)["response_format"] == {"type": "json_object"}
    args = cli.build_parser().parse_args(["ask", "--tools", tools_file, "--tool-choice", "get_weather", "q"])
    assert _sampling(args)["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize(
    "command",
    [
        ["router", "eval", "--data", "{dir}"],
        ["router", "train", "--data", "{dir}", "--out", "{dir}/r"],
        ["router", "train", "--data", "{file}", "--cascade-data", "{dir}", "--out", "{dir}/r"],
        ["router", "calibrate", "--prompts", "{dir}", "--cloud-fraction", "0.3", "--out", "{dir}/r"],
        ["router", "label", "--data", "{dir}", "--edge", "x", "--cloud", "http://127.0.0.1:9"],
    ],
)
def test_a_router_input_file_given_as_a_folder_is_said_to_be_one(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "l.csv").write_text("prompt,weak,strong\nhi,True,True\n")
    argv = [w.format(dir=tmp_path, file=tmp_path / "l.csv") for w in command]
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"{tmp_path} is a folder, not a file" in err and "does not exist" not in err
    assert not (tmp_path / "r").exists()


def test_a_router_input_file_that_is_missing_is_still_said_to_be(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["router", "eval", "--data", str(tmp_path / "no.csv")]) == 1
    assert "no.csv does not exist" in capsys.readouterr().err


def test_one_model_named_twice_in_two_spellings_is_removed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hybridllm.models import pull

    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path / "home"))
    smol = "smollm2-135m-instruct"
    pull(smol)
    capsys.readouterr()
    assert cli.main(["models", "remove", smol, smol.upper(), " SmolLM2-135M-Instruct", "--yes"]) == 0
    out = capsys.readouterr().out
    assert out.count("removed") == 1 and out.startswith(f"removed {smol}:"), out
    assert "0 paths" not in out
    assert cli.main(["models", "rm", smol.upper(), "--yes"]) == 0
    assert capsys.readouterr().out == f"{smol}: nothing on disk\n"  # the catalog's spelling


@pytest.mark.parametrize("group", ["models", "router", "config", "cache"])
def test_a_group_without_its_action_names_it_as_the_others_do(
    group: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: `hybridllm router` alone said "the following arguments are required: router_command",
    the attribute's name in the code, where the other groups say ACTION."""
    with pytest.raises(SystemExit) as info:
        cli.main([group])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"hybridllm {group}: error: the following arguments are required: ACTION" in err
