"""Something other than a model's file where that file belongs (review 28): a folder named like
the .gguf, a file where one of the model's folders belongs. Before, `models verify` called such a
model "missing: not pulled; run `hybridllm models pull ID`", and that pull copied the whole model
only to fail at the rename with "(Is a directory). Point HYBRIDLLM_HOME at a writable folder with
enough free space", neither of them true. A local path where an id belongs is named as one."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridllm import cli
from hybridllm._exceptions import ModelError
from hybridllm.models import store
from hybridllm.models.catalog import get_spec

SMOL = "smollm2-135m-instruct"
MINILM = "minilm-l6-v2"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path / "home"))

    def no_copy(*a, **k):
        raise AssertionError("a file was copied")
    monkeypatch.setattr(store, "_source_parts", no_copy)
    return tmp_path / "home"


def test_a_folder_where_the_gguf_belongs_is_said_and_never_copied_over(home, capsys):
    blocker = home / "models" / SMOL / get_spec(SMOL).main_file.name
    (blocker / "inside").mkdir(parents=True)
    assert cli.main(["models", "verify", SMOL]) == 1
    out = capsys.readouterr().out
    assert f"{SMOL}  corrupt  {blocker} is a folder, not a file: move it out of the way" in out
    assert "not pulled" not in out
    assert cli.main(["models", "verify"]) == 1  # all: a model that cannot be pulled is a failure
    assert cli.main(["models", "pull", SMOL]) == 1
    err = capsys.readouterr().err
    assert f"{blocker} is a folder, not a file. Move it out of the way" in err
    assert "HYBRIDLLM_HOME" not in err and err.count("\n") == 1
    assert (blocker / "inside").is_dir()  # what hybridllm did not write stays


def test_a_file_where_a_folder_belongs(home, capsys):
    pooling = home / "models" / MINILM / "1_Pooling"
    pooling.parent.mkdir(parents=True)
    pooling.write_text("not a folder")
    assert cli.main(["models", "verify", MINILM]) == 1
    assert f"{pooling} is a file, not a folder" in capsys.readouterr().out
    with pytest.raises(ModelError, match="1_Pooling is a file, not a folder"):
        store.pull(MINILM)
    # the model's own folder a file: both say so
    (home / "models" / SMOL).write_text("x")
    assert cli.main(["models", "verify", SMOL]) == 1
    assert f"{home / 'models' / SMOL} is a file, not a folder" in capsys.readouterr().out


def test_nothing_there_is_still_missing(home, capsys):
    assert cli.main(["models", "verify", SMOL]) == 1
    assert f"{SMOL}  missing  not pulled" in capsys.readouterr().out
    assert store.in_the_way(home / "models" / SMOL, get_spec(SMOL).main_file) is None


@pytest.mark.parametrize("action", ["verify", "pull", "remove"])
def test_a_local_path_where_an_id_belongs_is_named_as_one(home, tmp_path, capsys, action):
    folder = tmp_path / "my-model"
    folder.mkdir()
    assert cli.main(["models", action, str(folder), *(["--yes"] if action == "remove" else [])]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: Unknown model '{folder}' (a local folder, not a catalog id;")
    assert err.count("\n") == 1
