"""`hybridllm models` as a user types it: a .gguf path or an empty id where a catalog id belongs,
an id in another case, and the end of input or Ctrl-C at `models remove`'s question. Fakes only:
nothing is pulled or removed for real."""

from __future__ import annotations

import importlib
import io
import sys
from pathlib import Path

import pytest

from hybridllm import cli
from hybridllm.models import store

remove_mod = importlib.import_module("hybridllm.models.remove")  # the package's `remove` is the function


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize("action", ["pull", "path", "verify", "prepare"])
def test_a_gguf_path_is_no_catalog_id_and_no_hint_to_pass_one(home, tmp_path, capsys, action):
    """Before: "Unknown model '.../x.gguf' ...; or pass the path to a local .gguf file", which is
    what the user had just done; these commands take catalog ids only."""
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    assert cli.main(["models", action, str(gguf)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"error: Unknown model '{gguf}'")
    assert "smollm2-135m-instruct" in err and ".gguf file" not in err
    assert err.count("\n") == 1


def test_verify_of_an_empty_id_is_refused_not_every_model(home, capsys):
    """`hybridllm models verify "$MODEL"` with MODEL unset: before, every model was verified, exit 0."""
    assert cli.main(["models", "verify", ""]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: Unknown model ''")


def test_an_id_in_another_case_is_pulled_and_labelled_by_its_catalog_id(home, monkeypatch, capsys):
    seen = []

    def pull(model_id, *, progress=None, force=False, on_wait=None):
        seen.append((model_id, progress.label))
        return Path("/data/m.gguf")
    monkeypatch.setattr(store, "pull", pull)
    assert cli.main(["models", "pull", " SmolLM2-135M-Instruct "]) == 0
    assert cli.main(["models", "path", "SMOLLM2-135M-INSTRUCT"]) == 0
    assert seen == [("smollm2-135m-instruct", "Pulling smollm2-135m-instruct")] * 2
    assert capsys.readouterr().out == "/data/m.gguf\n" * 2  # the path only: a pipe gets nothing else


class _TtyIn(io.StringIO):
    def isatty(self) -> bool:
        return True


class _CtrlC(_TtyIn):
    def readline(self, *a) -> str:
        raise KeyboardInterrupt


def _one_file_on_disk(monkeypatch, home) -> None:
    entry = remove_mod.Entry(home / "models" / "smollm2-135m-instruct" / "m.gguf", 1000)
    monkeypatch.setattr(remove_mod, "plan", lambda mid: [entry])
    monkeypatch.setattr(remove_mod, "remove", lambda *a, **k: pytest.fail("nothing may be removed"))


def test_end_of_input_at_the_question_ends_its_line(home, monkeypatch, capsys):
    """Ctrl-D at "[y/N] ": before, "nothing removed" followed on the question's line."""
    _one_file_on_disk(monkeypatch, home)
    monkeypatch.setattr(sys, "stdin", _TtyIn(""))
    assert cli.main(["models", "remove", "smollm2-135m-instruct"]) == 1
    err = capsys.readouterr().err
    assert err.endswith("? [y/N] \nnothing removed\n"), err


def test_ctrl_c_at_the_question_ends_its_line(home, monkeypatch, capsys):
    _one_file_on_disk(monkeypatch, home)
    monkeypatch.setattr(sys, "stdin", _CtrlC())
    assert cli.main(["models", "remove", "smollm2-135m-instruct"]) == 130
    err = capsys.readouterr().err
    assert err.endswith("? [y/N] \ninterrupted\n"), err


def test_an_answer_typed_with_its_enter_key_adds_no_empty_line(home, monkeypatch, capsys):
    _one_file_on_disk(monkeypatch, home)
    monkeypatch.setattr(sys, "stdin", _TtyIn("n\n"))
    assert cli.main(["models", "remove", "smollm2-135m-instruct"]) == 1
    assert capsys.readouterr().err.endswith("? [y/N] nothing removed\n")  # the terminal echoed the line end
