"""The model store reviewed as a user of `ollama pull/rm` and `huggingface-cli download` would: the
store's file given by the path `models path` printed, a package of another version whose files
moved, a data dir that cannot be entered, a damaged GGUF header. A one-model stand-in catalog with a
4 KiB file and a stand-in package folder keep it fast: nothing real is copied or hashed."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
import json
import os
import pathlib
import struct
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridllm import ModelCorruptError, ModelPackageMissingError
from hybridllm.cli import main
from hybridllm.models import _sources, catalog, store
from hybridllm.models.gguf_header import read_gguf_metadata

DATA = b"GGUF" + bytes(range(256)) * 15 + b"\0" * 252  # 4 KiB, fixed: a deterministic sha256
TINY = "tiny-review19"
NAME = "Tiny.Q4.gguf"


def _catalog(tmp_path: Path, **source) -> None:
    entry = {
        "id": TINY, "kind": "gguf", "description": "stand-in", "package": "no-such-package-19",
        "package_version": "1.0", "pip": "pip install no-such-package-19==1.0",
        "source": source or {"type": "file", "path": "tiny.gguf"},
        "files": {NAME: {"sha256": hashlib.sha256(DATA).hexdigest(), "size": len(DATA)}},
        "license": "MIT", "architecture": "llama", "chat_format": "template",
    }
    (tmp_path / "pkg" / "_data" / "catalog.json").write_text(json.dumps({"version": 1, "models": [entry]}))
    catalog.load_catalog.cache_clear()


@pytest.fixture
def tiny(tmp_path, monkeypatch) -> Iterator[Path]:
    """A shipped catalog with one model whose packaged file is DATA; returns the data dir."""
    home = tmp_path / "home"
    monkeypatch.setenv("HYBRIDLLM_HOME", str(home))
    (tmp_path / "pkg" / "_data").mkdir(parents=True)
    (tmp_path / "wheel").mkdir()
    (tmp_path / "wheel" / "tiny.gguf").write_bytes(DATA)
    _catalog(tmp_path)
    real_files = importlib.resources.files
    monkeypatch.setattr(importlib.resources, "files",
                        lambda pkg: tmp_path / "pkg" if pkg == "hybridllm" else real_files(pkg))
    monkeypatch.setattr(_sources, "_package_root", lambda spec: tmp_path / "wheel")
    yield home
    catalog.load_catalog.cache_clear()


def _flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    other = path.with_name(path.name + ".flipped")  # not into the file: it is the package's (a link)
    other.write_bytes(bytes(data))
    os.replace(other, path)


def test_the_stores_file_given_by_its_path_is_checked_as_its_id_is(tiny):
    """Before: the path `models path` prints, changed by one byte, was loaded with the catalog's
    settings (only the id was checked); now it is refused with the command that puts it back."""
    path = store.pull(TINY)
    assert store.resolve_gguf(str(path))[0] == TINY  # a good one loads
    _flip_one_byte(path)
    with pytest.raises(ModelCorruptError) as err:
        store.resolve_gguf(str(path))
    assert str(path) in str(err.value) and f"hybridllm models pull {TINY} --force" in str(err.value)
    # the id repairs it from the package; the path then loads again
    assert store.resolve_gguf(TINY)[1] == path and path.read_bytes() == DATA
    assert store.resolve_gguf(path)[0] == TINY


def test_a_copy_outside_the_store_stays_the_users_file(tiny, tmp_path):
    """Only the store's own file is checked: a file of the same name elsewhere is not hashed."""
    other = tmp_path / "mine" / NAME
    other.parent.mkdir()
    other.write_bytes(DATA[:100] + b"x" + DATA[101:])
    assert store.resolve_gguf(other)[:2] == (TINY, other)


def test_a_touched_but_intact_store_file_is_hashed_once_and_kept(tiny):
    path = store.pull(TINY)
    os.utime(path, ns=(1, 1))  # a copy that changed the times: the marker no longer matches
    assert store.resolve_gguf(path)[0] == TINY and store.pull_state(TINY) == store.PULLED


def test_a_package_of_another_version_without_the_file_names_both_versions(tiny, tmp_path, monkeypatch):
    """Before: "files missing from the installed package" with no word of the version installed."""
    (tmp_path / "wheel" / "tiny.gguf").unlink()  # the other version names its file differently
    real_version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "2.0" if name == "no-such-package-19" else real_version(name))
    with pytest.raises(ModelPackageMissingError) as err:
        store.pull(TINY)
    text = str(err.value)
    assert "no-such-package-19 is version 2.0" in text and "needs 1.0" in text
    assert "pip install no-such-package-19==1.0 --force-reinstall" in text


def test_a_chunks_package_of_another_version_is_a_clear_error(tiny, tmp_path, monkeypatch):
    """Before: AttributeError (an internal error) when the package's module has no chunk_paths."""
    _catalog(tmp_path, type="chunks", module="tiny_chunks_review19")
    monkeypatch.setitem(__import__("sys").modules, "tiny_chunks_review19",
                        types.ModuleType("tiny_chunks_review19"))
    with pytest.raises(ModelPackageMissingError, match="missing or of another version.*Install it with"):
        store.pull(TINY)


def test_verify_of_a_data_dir_that_cannot_be_entered_is_reported_not_a_crash(tiny, monkeypatch, capsys):
    """Before: PermissionError out of Path.is_file ("internal error") for another user's data dir."""
    store.pull(TINY)
    real_is_file = pathlib.Path.is_file

    def is_file(self):
        if tiny in self.parents:
            raise PermissionError(13, "Permission denied", str(self))
        return real_is_file(self)

    monkeypatch.setattr(pathlib.Path, "is_file", is_file)
    assert main(["models", "verify", TINY]) == 1
    out = capsys.readouterr()
    assert "corrupt" in out.out and "unreadable: Permission denied" in out.out
    assert "internal error" not in out.err


def _gguf(tmp_path: Path, body: bytes) -> Path:
    key = b"k"
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + body)
    return path


@pytest.mark.parametrize("body", [
    struct.pack("<I", 99) + b"\0" * 16,  # a value type no GGUF has
    struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 5000 + b"\0" * 16,  # arrays nested 5000 deep
], ids=["unknown-type", "deep-arrays"])
def test_a_damaged_gguf_header_is_a_value_error(tmp_path, body):
    """Before: KeyError and RecursionError, which the llama.cpp backend's header read let through."""
    with pytest.raises(ValueError, match="damaged GGUF metadata"):
        read_gguf_metadata(_gguf(tmp_path, body))
