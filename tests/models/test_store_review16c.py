"""The model store and catalog, reviewed as an Ollama / huggingface_hub user would: a model folder
given as the model path, ids typed in another case or pasted with spaces, a `models remove` that
deletes the folder while a pull is about to lock it. A one-model stand-in catalog with a 4 KiB file
and a stand-in package folder keep it fast: nothing real is copied or hashed."""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridllm import ModelNotFoundError
from hybridllm.models import _sources, catalog, store
from hybridllm.models.remove import plan, remove, spec_of

DATA = b"GGUF" + os.urandom(4092)
TINY = "tiny-review16c"


@pytest.fixture
def tiny(tmp_path, monkeypatch) -> Iterator[Path]:
    """A shipped catalog with one model whose packaged file is DATA; returns the data dir."""
    home = tmp_path / "home"
    monkeypatch.setenv("HYBRIDLLM_HOME", str(home))
    (tmp_path / "pkg" / "_data").mkdir(parents=True)
    (tmp_path / "wheel").mkdir()
    (tmp_path / "wheel" / "tiny.gguf").write_bytes(DATA)
    entry = {
        "id": TINY, "kind": "gguf", "description": "stand-in", "package": "no-such-package-16c",
        "package_version": "0", "pip": "pip install no-such-package-16c",
        "source": {"type": "file", "path": "tiny.gguf"},
        "files": {"Tiny.Q4.gguf": {"sha256": hashlib.sha256(DATA).hexdigest(), "size": len(DATA)}},
        "license": "MIT", "architecture": "llama", "chat_format": "template",
    }
    (tmp_path / "pkg" / "_data" / "catalog.json").write_text(json.dumps({"version": 1, "models": [entry]}))
    real_files = importlib.resources.files
    monkeypatch.setattr(importlib.resources, "files",
                        lambda pkg: tmp_path / "pkg" if pkg == "hybridllm" else real_files(pkg))
    monkeypatch.setattr(_sources, "_package_root", lambda spec: tmp_path / "wheel")
    catalog.load_catalog.cache_clear()
    yield home
    catalog.load_catalog.cache_clear()


def test_a_model_folder_is_named_a_folder_with_the_gguf_files_inside(tiny, tmp_path, monkeypatch):
    """Before: "Model file /tmp/x does not exist." for a folder that exists."""
    snap = tmp_path / "snapshot"
    snap.mkdir()
    (snap / "model.Q4_K_M.gguf").write_bytes(DATA)
    (snap / "model.Q8_0.gguf").write_bytes(DATA)
    (snap / "README.md").write_text("card")
    with pytest.raises(ModelNotFoundError) as err:
        store.resolve_gguf(str(snap))
    text = str(err.value)
    assert "is a folder, not a .gguf file" in text and "does not exist" not in text
    assert "model.Q4_K_M.gguf, model.Q8_0.gguf" in text and "README" not in text
    # a folder without any .gguf file says so; a folder given without a slash is no unknown id
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelNotFoundError, match="is a folder.*holds no .gguf file"):
        store.resolve_gguf(empty)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelNotFoundError, match="is a folder"):
        store.resolve_gguf("empty")
    # the file inside it works
    name, path, spec = store.resolve_gguf(snap / "model.Q8_0.gguf")
    assert (name, path, spec) == ("model.Q8_0", snap / "model.Q8_0.gguf", None)


def test_a_device_is_not_called_missing(tiny):
    with pytest.raises(ModelNotFoundError, match="/dev/null is not a regular file"):
        store.resolve_gguf("/dev/null")


def test_an_empty_model_is_still_an_unknown_id_not_the_current_folder(tiny):
    for text in ("", "  "):
        with pytest.raises(ModelNotFoundError, match="Unknown model"):
            store.resolve_gguf(text)


@pytest.mark.parametrize("typed", [TINY.upper(), f" {TINY}\n", "Tiny-Review16C"])
def test_an_id_in_another_case_or_with_spaces_is_the_catalog_model(tiny, typed):
    """Before: "Unknown model 'TINY-REVIEW16C'" although the catalog has it (Ollama and the Hub
    take names case aside); now it resolves to the catalog's spelling and its one folder."""
    assert catalog.get_spec(typed).id == TINY
    name, path, spec = store.resolve_gguf(typed)
    assert name == TINY and spec is not None and spec.id == TINY
    assert path == tiny / "models" / TINY / "Tiny.Q4.gguf" and path.read_bytes() == DATA
    assert store.pull_state(typed) == store.PULLED
    assert [r.id for r in store.verify(typed)] == [TINY]  # reported under the catalog's id
    assert [e.path for e in plan(typed)] == [path]
    assert remove(typed) == [path] and not path.exists()


def test_an_unknown_id_still_lists_the_known_ones(tiny):
    with pytest.raises(ModelNotFoundError, match=f"Unknown model 'tiny'. Known models: {TINY}"):
        catalog.get_spec("tiny")
    with pytest.raises(ModelNotFoundError, match=f"Known models: {TINY}"):
        spec_of("tiny")


def test_a_remove_between_the_pulls_mkdir_and_its_lock_is_no_error(tiny, monkeypatch):
    """Before: the pull failed with "Cannot copy ... (No such file or directory). Point
    HYBRIDLLM_HOME at a writable folder": a `models remove` had deleted the folder just made."""
    folder = tiny / "models" / TINY
    real_open = os.open
    removed = []

    def open_after_a_remove(path, flags, *args, **kwargs):
        if Path(path) == folder and not removed:
            removed.append(True)
            shutil.rmtree(folder)  # what `models remove` does at this moment
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(store.os, "open", open_after_a_remove)
    path = store.pull(TINY)
    assert removed and path.read_bytes() == DATA and store.pull_state(TINY) == store.PULLED
