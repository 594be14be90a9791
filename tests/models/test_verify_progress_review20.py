"""`hybridllm models verify` hashes every file again (a minute for the 1.1 GB model): a bar per
model on a terminal (stderr), nothing extra in a log, stdout the same table. A stand-in catalog
with tiny files keeps it fast: no hub, no real model hashed."""

from __future__ import annotations

import hashlib
import importlib.resources
import io
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridllm import _progress, cli
from hybridllm._progress import ProgressBar
from hybridllm.models import _sources, catalog, store

MODEL = "multi-verify-review20"
SINGLE = "single-verify-review20"
FILES = {"config.json": b"{}" * 10, "model.safetensors": bytes(range(256)) * 40,
         "1_Pooling/config.json": b"x" * 3000}
TOTAL = sum(len(d) for d in FILES.values())
ONE = {"one.bin": b"y" * 5000}


def _entry(mid: str, files: dict[str, bytes]) -> dict:
    return {
        "id": mid, "kind": "embedding", "description": "stand-in", "package": "no-such-package-20",
        "package_version": "1.0", "pip": "pip install no-such-package-20==1.0",
        "source": {"type": "dir", "path": "model"},
        "files": {n: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)} for n, d in files.items()},
        "license": "MIT", "architecture": "bert", "chat_format": None,
    }


@pytest.fixture
def home(tmp_path, monkeypatch) -> Iterator[Path]:
    """Both models in place (as a pull leaves them); 1 KiB blocks: several progress calls a file."""
    home = tmp_path / "home"
    monkeypatch.setenv("HYBRIDLLM_HOME", str(home))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(store, "_BLOCK", 1024)
    monkeypatch.setattr(_progress, "_open", None)
    (tmp_path / "pkg" / "_data").mkdir(parents=True)
    models = [_entry(MODEL, FILES), _entry(SINGLE, ONE)]
    (tmp_path / "pkg" / "_data" / "catalog.json").write_text(json.dumps({"version": 1, "models": models}))
    catalog.load_catalog.cache_clear()
    real_files = importlib.resources.files
    monkeypatch.setattr(importlib.resources, "files",
                        lambda pkg: tmp_path / "pkg" if pkg == "hybridllm" else real_files(pkg))
    monkeypatch.setattr(_sources, "_package_root", lambda spec: tmp_path / "wheel")
    for mid, files in ((MODEL, FILES), (SINGLE, ONE)):
        for name, data in files.items():
            (home / "models" / mid / name).parent.mkdir(parents=True, exist_ok=True)
            (home / "models" / mid / name).write_bytes(data)
    yield home
    catalog.load_catalog.cache_clear()


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _on_terminal(monkeypatch) -> _Tty:
    """stderr a terminal (in the test itself: pytest's capture sets its own after the fixtures),
    bars drawn from the first call, not after a second of quiet."""
    err = _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setitem(ProgressBar.__init__.__kwdefaults__, "quiet_for", 0.0)
    return err


def test_sha256_file_reports_the_bytes_hashed(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "_BLOCK", 1024)
    path = tmp_path / "f"
    path.write_bytes(b"z" * 2500)
    calls: list = []
    digest = store.sha256_file(path, lambda d, t: calls.append((d, t)))
    assert digest == hashlib.sha256(b"z" * 2500).hexdigest()
    assert calls == [(1024, 2500), (2048, 2500), (2500, 2500)]


def test_verify_reports_one_total_for_all_the_files_and_ends_once(home):
    """Before: `verify` took no progress at all (a minute of silence on the 1.1 GB model)."""
    calls: list = []
    [result] = store.verify(MODEL, progress=lambda d, t: calls.append((d, t)))
    assert result.status == "ok"
    assert {t for _, t in calls} == {TOTAL}
    dones = [d for d, _ in calls]
    assert dones == sorted(dones) and dones.count(TOTAL) == 1 and calls[-1] == (TOTAL, TOTAL)


def test_an_unreadable_file_still_ends_the_bar_and_is_reported(home, monkeypatch):
    real = store.sha256_file

    def unreadable(path, progress=None):
        if path.name == "model.safetensors":
            raise PermissionError(13, "Permission denied")
        return real(path, progress)

    monkeypatch.setattr(store, "sha256_file", unreadable)
    calls: list = []
    [result] = store.verify(MODEL, progress=lambda d, t: calls.append((d, t)))
    assert result.status == "corrupt" and "model.safetensors (unreadable: Permission denied)" in result.detail
    assert calls[-1] == (TOTAL, TOTAL) and [d for d, _ in calls].count(TOTAL) == 1


def test_verify_without_progress_hashes_as_before(home, monkeypatch):
    """No progress: `sha256_file(path)` as before (a stand-in of one argument still works)."""
    monkeypatch.setattr(store, "sha256_file", lambda p: hashlib.sha256(p.read_bytes()).hexdigest())
    assert [r.status for r in store.verify()] == ["ok", "ok"]


def test_the_cli_draws_a_bar_per_model_on_a_terminal_and_keeps_stdout(home, monkeypatch, capsys):
    terminal = _on_terminal(monkeypatch)
    """Before: nothing on stderr while hashing. Now one bar a model (ended with its newline,
    the file being hashed named for a model of several files); stdout is the table alone."""
    assert cli.main(["models", "verify"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[:2] for line in out.splitlines()] == [[MODEL, "ok"], [SINGLE, "ok"]]
    lines = terminal.getvalue().split("\n")
    assert lines[-1] == "" and len(lines) == 3, lines
    multi, single = (line.split("\r")[-1] for line in lines[:2])
    assert multi.startswith(f"Verifying {MODEL} [") and f"100% {TOTAL / 1e6:.1f}/" in multi
    assert multi.endswith("(1_Pooling/config.json)")
    assert single.startswith(f"Verifying {SINGLE} [") and "100%" in single and "(" not in single


def test_the_cli_writes_nothing_extra_to_a_log(home, monkeypatch, capsys):
    monkeypatch.setitem(ProgressBar.__init__.__kwdefaults__, "quiet_for", 0.0)
    assert cli.main(["models", "verify", MODEL]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.split()[:2] == [MODEL, "ok"]


def test_a_model_not_pulled_draws_no_bar(home, monkeypatch, capsys):
    terminal = _on_terminal(monkeypatch)
    (home / "models" / SINGLE / "one.bin").unlink()
    # exit 1: a model named and not pulled fails its verify (test_models_cli_review21)
    assert cli.main(["models", "verify", SINGLE]) == 1
    assert "missing" in capsys.readouterr().out and terminal.getvalue() == ""


def test_ctrl_c_while_hashing_ends_the_bar_line_before_interrupted(home, monkeypatch):
    terminal = _on_terminal(monkeypatch)
    real = store.sha256_file

    def interrupted(path, progress=None):
        if path.name == "model.safetensors":
            progress(100, None)
            raise KeyboardInterrupt
        return real(path, progress)

    monkeypatch.setattr(store, "sha256_file", interrupted)
    assert cli.main(["models", "verify", MODEL]) == 130
    err = terminal.getvalue()
    assert err.endswith("\ninterrupted\n") and err.startswith(f"\rVerifying {MODEL} ["), err
