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
