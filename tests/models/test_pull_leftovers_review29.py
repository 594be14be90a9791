"""A failed `models pull` leaves no folder it made: before, a pull whose package was not installed
(or whose copy failed) left an empty ``models/<id>/`` in the data dir. A stand-in catalog of one
two-file model (the second in a subfolder) and a stand-in package folder keep it fast."""

from __future__ import annotations

import hashlib
import importlib.resources
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridllm import ModelCorruptError
from hybridllm.cli import main
from hybridllm.models import _sources, catalog, store

MAIN = b"GGUF" + bytes(range(256)) * 4
EXTRA = b"extra file " * 20
PACKAGE_ROOT = _sources._package_root  # the real one: "no-such-package-29" is not installed
TINY = "tiny-review29"


@pytest.fixture
def tiny(tmp_path, monkeypatch) -> Iterator[Path]:
    """A shipped catalog with one model (Tiny.gguf and sub/extra.bin, copied from the stand-in
    package folder ``wheel/m``); returns the data dir. The package counts as installed only once
    a test points ``_package_root`` at the folder."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HYBRIDLLM_HOME", str(home))
    (tmp_path / "pkg" / "_data").mkdir(parents=True)
    (tmp_path / "wheel" / "m" / "sub").mkdir(parents=True)
    (tmp_path / "wheel" / "m" / "Tiny.gguf").write_bytes(MAIN)
    (tmp_path / "wheel" / "m" / "sub" / "extra.bin").write_bytes(EXTRA)
    entry = {
        "id": TINY, "kind": "gguf", "description": "stand-in", "package": "no-such-package-29",
        "package_version": "1.0", "pip": "pip install no-such-package-29==1.0",
        "source": {"type": "dir", "path": "m"},
        "files": {name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
                  for name, data in (("Tiny.gguf", MAIN), ("sub/extra.bin", EXTRA))},
        "license": "MIT", "architecture": "llama", "chat_format": "template",
    }
    (tmp_path / "pkg" / "_data" / "catalog.json").write_text(json.dumps({"version": 1, "models": [entry]}))
    catalog.load_catalog.cache_clear()
    real_files = importlib.resources.files
    monkeypatch.setattr(importlib.resources, "files",
                        lambda pkg: tmp_path / "pkg" if pkg == "hybridllm" else real_files(pkg))
    yield home
    catalog.load_catalog.cache_clear()


def _installed(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(_sources, "_package_root", lambda spec: tmp_path / "wheel")


def _tree(home: Path) -> list[str]:
    return sorted(str(p.relative_to(home)) for p in home.rglob("*"))


def test_a_pull_whose_package_is_missing_leaves_the_data_dir_as_it_was(tiny, capsys):
    """Before: `models/tiny-review29/` stayed behind, empty."""
    assert main(["models", "pull", TINY]) == 1
    assert "pip install no-such-package-29==1.0" in capsys.readouterr().err
    assert _tree(tiny) == []


def test_a_failed_copy_removes_the_folders_it_made(tiny, tmp_path, monkeypatch):
    """The second file fails its checksum: the first, copied and verified, stays (a pull again
    copies only the rest), and the subfolder this pull made for the second goes."""
    _installed(monkeypatch, tmp_path)
    (tmp_path / "wheel" / "m" / "sub" / "extra.bin").write_bytes(EXTRA[::-1])
    with pytest.raises(ModelCorruptError, match="sub/extra.bin"):
        store.pull(TINY)
    root = f"models/{TINY}"
    assert _tree(tiny) == ["models", root, f"{root}/.Tiny.gguf.verified", f"{root}/Tiny.gguf"]
    (tmp_path / "wheel" / "m" / "sub" / "extra.bin").write_bytes(EXTRA)
    assert store.pull(TINY) == tiny / root / "Tiny.gguf"
    assert (tiny / root / "sub" / "extra.bin").read_bytes() == EXTRA


def test_a_failed_pull_keeps_what_a_previous_pull_left(tiny, tmp_path, monkeypatch):
    """A model pulled before whose copy is forced again without its package: its folders and
    files are kept, and so is a folder that was there before, empty."""
    _installed(monkeypatch, tmp_path)
    store.pull(TINY)
    before = _tree(tiny)
    (tiny / "models" / "other-model").mkdir()
    monkeypatch.setattr(_sources, "_package_root", PACKAGE_ROOT)  # the package is uninstalled
    assert main(["models", "pull", TINY, "--force"]) == 1
    assert _tree(tiny) == sorted([*before, "models/other-model"])
