"""`hybridllm models remove` / `list` sizes and hybridllm.models.remove / disk_usage, on a temporary
data dir with a real pulled SmolLM2 GGUF (copied out of its installed PyPI package, not linked)
beside small fake prepared folders (the real ONNX build takes minutes)."""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hybridllm import ModelNotFoundError, cli
from hybridllm.models import RemoveIncompleteError, disk_usage, pull, remove
from hybridllm.models.onnx_store import onnx_dir
from hybridllm.models.remove import human_size
from hybridllm.models.store import _folder_lock

SMOL = "smollm2-135m-instruct"
MINILM = "minilm-l6-v2"
GGUF_BYTES = 98362432


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A data dir whose pulls copy, as on another file system than the venv's (where the venv shares
    it, a pull links the package's file instead: no bytes of its own, see
    ``tests/models/test_store_links_review39.py``), so the sizes below are the same everywhere."""
    root = tmp_path / "home"
    monkeypatch.setenv("HYBRIDLLM_HOME", str(root))

    def elsewhere(_src, _dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", elsewhere)
    return root


def _write(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.fixture
def smol(home) -> Path:
    """SmolLM2 pulled for real, an int4 ONNX folder, and a killed build's temporary folder."""
    gguf = pull(SMOL)
    _write(onnx_dir(SMOL, "int4") / "model.onnx", 300_000)
    _write(onnx_dir(SMOL, "int4") / "genai_config.json", 100)
    _write(gguf.parent / ".onnx-int8-cpu.4242.tmp" / "hf" / "model.safetensors", 50_000)
    return gguf


def _main(argv, monkeypatch, stdin_text=None, tty=False) -> int:
    if stdin_text is not None:
        fake = io.StringIO(stdin_text)
        fake.isatty = lambda: tty  # type: ignore[method-assign]
        monkeypatch.setattr(sys, "stdin", fake)
    return cli.main(argv)


def test_remove_frees_every_form_and_leaves_other_models(smol, home):
    folder = smol.parent
    other = _write(onnx_dir("gemma3-270m", "int4") / "model.onnx", 1234)  # another model's folder
    before = _tree_bytes(folder)
    assert before == GGUF_BYTES + 300_100 + 50_000 + len((folder / f".{smol.name}.verified").read_bytes())
    assert disk_usage(SMOL) == before

    gone = remove(SMOL)

    assert not folder.exists()  # the GGUF, its marker, the ONNX folder and the temporary one
    assert set(gone) == {smol, onnx_dir(SMOL, "int4"), folder / ".onnx-int8-cpu.4242.tmp"}
    assert disk_usage(SMOL) == 0
    assert other.read_bytes() == b"x" * 1234 and disk_usage("gemma3-270m") == 1234
    assert (home / "models").is_dir()  # the shared folders stay
    pull(SMOL)  # and it can be pulled again
    assert disk_usage(SMOL) > GGUF_BYTES


def test_remove_embedder_takes_its_cache_exports_only(home):
    src = pull(MINILM)
    embedder = _write(home / "embedders" / MINILM / "model.int8.onnx", 2000)
    reranker = _write(home / "rerankers" / f"{MINILM}-39327a15b5424671" / "model.onnx", 3000)
    stranger = _write(home / "rerankers" / "other-model-abc" / "model.onnx", 10)
    assert disk_usage(MINILM) == _tree_bytes(src) + 5000

    remove(MINILM)

    assert not src.exists() and not embedder.parent.exists() and not reranker.parent.exists()
    assert stranger.is_file() and (home / "embedders").is_dir()


def test_a_link_is_unlinked_never_followed(smol, home, tmp_path):
    outside = tmp_path / "outside"
    precious = _write(outside / "keep.bin", 7000)
    (smol.parent / "onnx-fp32-cpu").symlink_to(outside, target_is_directory=True)
    (smol.parent / "notes.txt").symlink_to(precious)
    assert disk_usage(SMOL) == _tree_bytes(smol.parent)  # what a link points at is not counted

    remove(SMOL)

    assert not os.path.lexists(smol.parent)
    assert precious.read_bytes() == b"x" * 7000


def test_a_model_folder_that_is_a_link_is_unlinked(home, tmp_path):
    outside = tmp_path / "elsewhere"
    precious = _write(outside / "SmolLM2-135M-Instruct.Q4_1.gguf", 5000)
    (home / "models").mkdir(parents=True)
    (home / "models" / SMOL).symlink_to(outside, target_is_directory=True)

    assert remove(SMOL) == [home / "models" / SMOL]

    assert not os.path.lexists(home / "models" / SMOL) and precious.is_file()


def test_a_folder_that_resolves_outside_the_data_dir_is_refused(home, tmp_path):
    outside = tmp_path / "other-disk"
    precious = _write(outside / f"{MINILM}-abcdef" / "model.onnx", 100)
    home.mkdir(parents=True)
    (home / "rerankers").symlink_to(outside, target_is_directory=True)

    with pytest.raises(RemoveIncompleteError, match="outside the data dir") as err:
        remove(MINILM)

    assert precious.is_file() and err.value.removed == []


def test_cli_asks_on_a_terminal_and_no_keeps_everything(smol, monkeypatch, capsys):
    before = disk_usage(SMOL)
    assert _main(["models", "remove", SMOL], monkeypatch, "n\n", tty=True) == 1
    err = capsys.readouterr().err
    assert str(smol) in err and str(onnx_dir(SMOL, "int4")) in err
    assert f"3 path(s) of {SMOL}, {human_size(before)}? [y/N]" in err and "nothing removed" in err
    assert disk_usage(SMOL) == before

    assert _main(["models", "rm", SMOL], monkeypatch, "y\n", tty=True) == 0
    out = capsys.readouterr().out
    assert out.strip() == f"removed {SMOL}: 3 paths, {human_size(before)}"
    assert not smol.parent.exists()


def test_cli_piped_without_yes_refuses_and_says_so(smol, home):
    env = {**os.environ, "HYBRIDLLM_HOME": str(home)}
    run = subprocess.run([sys.executable, "-m", "hybridllm.cli", "models", "remove", SMOL],
                         input="y\n", capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 2 and "--yes" in run.stderr and "Traceback" not in run.stderr
    assert smol.is_file()
    run = subprocess.run([sys.executable, "-m", "hybridllm.cli", "models", "remove", SMOL, "--yes"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"removed {SMOL}: 3 paths, 98.") and not smol.parent.exists()


def test_cli_unknown_id_is_refused_before_anything_goes(smol, monkeypatch, capsys):
    assert _main(["models", "remove", SMOL, "no-such-model", "--yes"], monkeypatch) == 1
    err = capsys.readouterr().err
    assert "Unknown model 'no-such-model'" in err and SMOL in err and "gemma3-270m" in err
    assert smol.is_file()
    with pytest.raises(ModelNotFoundError):
        remove("no-such-model")


def test_cli_known_id_with_nothing_on_disk(home, monkeypatch, capsys):
    assert _main(["models", "remove", "gemma3-270m"], monkeypatch, "", tty=False) == 0
    assert capsys.readouterr().out.strip() == "gemma3-270m: nothing on disk"
    assert remove("gemma3-270m") == [] and disk_usage("gemma3-270m") == 0


def test_a_removal_that_fails_half_way_reports_both_sides(smol, monkeypatch, capsys):
    real_unlink = os.unlink

    def unlink(path, *a, **kw):
        if os.fspath(path) == "model.onnx":  # rmtree unlinks by name within the folder's fd
            raise PermissionError(13, "Permission denied")
        return real_unlink(path, *a, **kw)

    monkeypatch.setattr(os, "unlink", unlink)
    assert _main(["models", "remove", SMOL, "--yes"], monkeypatch) == 1
    err = capsys.readouterr().err
    assert "Could not remove all of" in err and "Permission denied" in err and "Traceback" not in err
    assert str(smol) in err.split("Removed:")[1] and "MB freed" in err
    assert "Directory not empty" not in err  # the one real cause, not its knock-on effects
    assert not smol.exists() and (onnx_dir(SMOL, "int4") / "model.onnx").is_file()


def test_remove_waits_for_the_folder_lock(smol):
    waited = threading.Event()
    with _folder_lock(smol.parent):  # a pull or prepare in progress
        worker = threading.Thread(target=remove, args=(SMOL,), kwargs={"on_wait": waited.set})
        worker.start()
        assert waited.wait(5)
        time.sleep(0.2)
        assert smol.is_file() and worker.is_alive()
    worker.join(10)
    assert not worker.is_alive() and not smol.parent.exists()


def test_a_lock_waiter_gets_a_live_folder_after_a_removal(home):
    folder = home / "models" / SMOL
    folder.mkdir(parents=True)
    inside = []

    def waiter():
        with _folder_lock(folder):
            inside.append(folder.is_dir())

    with _folder_lock(folder):
        worker = threading.Thread(target=waiter)
        worker.start()
        time.sleep(0.3)
        folder.rmdir()  # what remove does while it holds the lock
    worker.join(10)
    assert inside == [True]


def test_list_shows_sizes_on_disk_and_a_total(smol, monkeypatch, capsys):
    _write(Path(os.environ["HYBRIDLLM_HOME"]) / "embedders" / MINILM / "model.onnx", 4000)
    assert _main(["models", "list", "--json"], monkeypatch) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[SMOL]["disk_bytes"] == _tree_bytes(smol.parent) > GGUF_BYTES
    assert rows[MINILM]["disk_bytes"] == 4000 and rows["gemma3-270m"]["disk_bytes"] == 0

    assert _main(["models", "list"], monkeypatch) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "ON DISK" in lines[0]
    smol_line = next(line for line in lines if line.startswith(SMOL))
    assert human_size(rows[SMOL]["disk_bytes"]) in smol_line
    total = lines[-1].split()
    assert total[:3] == ["total", "on", "disk"] and " ".join(total[3:]) == human_size(
        rows[SMOL]["disk_bytes"] + 4000)
    at = lines[0].index("ON DISK") + len("ON DISK")  # right-aligned under the column
    assert smol_line[:at].endswith(human_size(rows[SMOL]["disk_bytes"])) and lines[-1].endswith(total[-1])
    assert len(lines[-1]) == at
