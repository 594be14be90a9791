"""The CLI honours the settings: edge_model from config.toml, every sampling flag."""

from __future__ import annotations

import pytest

from hybridllm import cli


class Recorder:
    """Stands in for HybridLLM: records how the CLI built it and what it asked."""

    built: list[dict] = []
    asked: list[dict] = []

    def __init__(self, **kw):
        from hybridllm._config import load_config

        load_config(**{k: v for k, v in kw.items() if k not in ("progress",)})  # validates
        Recorder.built.append(kw)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def chat(self, prompt, **params):
        from hybridllm import Completion

        Recorder.asked.append(params)
        return Completion(text="ok", route="edge", reason="r", model="m")


@pytest.fixture
def recorder(monkeypatch):
    Recorder.built, Recorder.asked = [], []
    monkeypatch.setattr("hybridllm._client.HybridLLM", Recorder)
    return Recorder


def test_edge_model_comes_from_config_toml_unless_model_is_given(tmp_path, monkeypatch, recorder):
    """Before: the CLI always passed edge_model (its own default), so config.toml was ignored."""
    from hybridllm._config import load_config

    toml = tmp_path / "config.toml"
    toml.write_text('edge_model = "gemma3-270m"\n')
    monkeypatch.setenv("HYBRIDLLM_CONFIG", str(toml))
    monkeypatch.delenv("HYBRIDLLM_EDGE_MODEL", raising=False)
    assert cli.main(["ask", "hi", "--json"]) == 0
    assert recorder.built[-1]["edge_model"] is None  # not overridden: the settings decide
    assert load_config(edge_model=recorder.built[-1]["edge_model"]).edge_model == "gemma3-270m"
    assert cli.main(["ask", "hi", "--json", "--model", "smollm2-135m-instruct"]) == 0
    assert recorder.built[-1]["edge_model"] == "smollm2-135m-instruct"


def test_sampling_flags_reach_the_request(recorder):
    assert (
        cli.main(
            [
                "ask",
                "hi",
                "--json",
                "--top-k",
                "5",
                "--min-p",
                "0.1",
                "--repeat-penalty",
                "1.2",
                "--seed",
                "3",
            ]
        )
        == 0
    )
    asked = recorder.asked[-1]
    assert (asked["top_k"], asked["min_p"], asked["repeat_penalty"], asked["seed"]) == (5, 0.1, 1.2, 3)


def test_the_default_model_id_is_written_once():
    import pathlib

    import hybridllm

    root = pathlib.Path(hybridllm.__file__).parent
    # models/ is the catalog's own code (its messages name catalog ids as examples)
    hits = [
        p.relative_to(root).as_posix()
        for p in root.rglob("*.py")
        if "smollm2-135m-instruct" in p.read_text() and p.parent.name != "models"
    ]
    assert hits == ["_config.py"], hits


def test_models_list_columns_line_up_for_long_ids(capsys):
    # the catalog's longest id (qwen2.5-coder-1.5b-instruct) is longer than the old fixed column
    assert cli.main(["models", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 5
    # where the second column (KIND) begins on each line: after the id and its padding
    cols = [len(line) - len(line[line.index(" ") :].lstrip()) for line in lines]
    assert len(set(cols)) == 1, lines


def test_threads_below_one_are_refused(recorder, capsys):
    """Before: --threads -3 (or n_threads=-3) went to llama.cpp as it was."""
    assert cli.main(["ask", "hi", "--json", "--threads", "-3"]) == 1
    assert "n_threads must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("action", ["stats", "clear"])
def test_cache_commands_on_a_missing_path_say_so_and_create_nothing(tmp_path, capsys, action):
    """Before: a mistyped --path made a new empty cache there (folders included) and reported
    '0 entries' / 'removed 0 entries'; a folder given as --path was moved aside as 'corrupt'."""
    missing = tmp_path / "typo" / "cache.sqlite3"
    assert cli.main(["cache", action, "--path", str(missing)]) == 1
    assert "no cache database" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    assert cli.main(["cache", action, "--path", str(tmp_path)]) == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flags", [["--port", "99999"], ["--port", "-1"], ["--max-body-bytes", "-1"],
                                   ["--log-level", "loud"], ["--shutdown-timeout", "-1"],
                                   ["--shutdown-timeout", "nan"]])
def test_serve_refuses_bad_values_as_usage_errors(flags, capsys):
    """Before: --port 99999 loaded the model and then hung; --max-body-bytes -1 answered every
    request 413; --log-level loud loaded the model, then died with 'internal error: KeyError'."""
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(["serve", *flags])
    assert exit_.value.code == 2 and flags[0] in capsys.readouterr().err


def test_serve_on_a_busy_port_says_so_before_loading_the_model(monkeypatch, capsys):
    """Before: the model loaded, the banner claimed the address, then uvicorn exited with status 3."""
    import socket

    pytest.importorskip("uvicorn")

    def no_model(**kw):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("hybridllm._client.HybridLLM", no_model)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli.main(["serve", "--port", str(port), "--no-cache"]) == 1
    assert f"Cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


@pytest.mark.parametrize("content", [b"hybridllm = 5\n", b"\xff\xfe", None])
def test_config_files_that_cannot_be_read_are_one_line_errors(tmp_path, capsys, content):
    """Before: a non-table [hybridllm], a file that is not UTF-8 and a folder given as --config
    gave 'internal error: TypeError / UnicodeDecodeError / IsADirectoryError'."""
    path = tmp_path / "config.toml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    assert cli.main(["config", "show", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "internal error" not in err and str(path) in err


@pytest.mark.parametrize(("content", "problem"), [
    ("temperature = 9", "temperature must be between 0 and 2, got 9"),
    ("top_p = 0", "top_p must be in (0, 1], got 0"),
    ("[hybridllm]\nmax_tokens = -1", "max_tokens must be at least 1, got -1"),
    ("cloud_url = 5", "cloud_url must be a string or a list of strings, got 5"),
    ("cache = 1", "cache must be true or false, got 1"),
])
def test_bad_values_in_a_config_file_fail_at_load_naming_the_file(tmp_path, capsys, content, problem):
    """Before: sampling defaults out of range were shown by `config show` and failed only at the
    first request, as an InvalidRequestError without the file; cloud_url = 5 gave "Invalid
    settings: 'int' object is not iterable"."""
    path = tmp_path / "config.toml"
    path.write_text(content + "\n")
    assert cli.main(["config", "show", "--config", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"error: Config file {path}: {problem}"), err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("flags", "problem"), [
    (["--temperature", "5"], "temperature must be between 0 and 2, got 5.0"),
    (["--top-p", "0"], "top_p must be in (0, 1], got 0.0"),
    (["--max-tokens", "-1"], "max_tokens must be at least 1, got -1"),
    (["--repeat-penalty", "0"], "repeat_penalty must be in (0, 10]"),
])
def test_bad_sampling_options_are_usage_errors_before_anything_loads(monkeypatch, capsys, flags, problem):
    """Before: `hybridllm ask --temperature 5 hi` copied and loaded the model, then refused."""
    def no_model(**kw):
        raise AssertionError("the client was built")

    monkeypatch.setattr("hybridllm._client.HybridLLM", no_model)
    for command in (["ask", *flags, "hi"], ["chat", *flags]):
        with pytest.raises(SystemExit) as exit_:
            cli.main(command)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {flags[0]}: {problem}" in err, err
    stops = [arg for i in range(5) for arg in ("--stop", f"s{i}")]
    assert cli.main(["ask", *stops, "hi"]) == 1  # the options together: checked before loading too
    assert "stop takes at most 4 strings" in capsys.readouterr().err
