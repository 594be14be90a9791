"""The CPU kernels' build folder after a build killed mid-way (SIGKILL: no ``finally`` runs): its
half-written temporary is never loaded, the next build succeeds and removes it, and a build that
waited for another finds the library built. A fake compiler (``CXX``) stands in for g++."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytest.importorskip("torch")

from cloud_server.layers import cpu_kernels  # noqa: E402

if os.name != "posix":  # pragma: no cover
    pytest.skip("a shell script stands in for the compiler", allow_module_level=True)


def _compiler(tmp_path, *, sleep: float = 0.0):
    """A compiler that writes a half library into its ``-o`` file, sleeps, then finishes it."""
    script = tmp_path / f"fake-cxx-{sleep}"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        while [ "$#" -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done
        printf 'half' > "$out"
        sleep {sleep}
        printf '\\177ELF whole' > "$out"
        """))
    script.chmod(0o755)
    return str(script)


def test_a_build_killed_mid_way_leaves_nothing_loaded_and_the_next_build_cleans_up(tmp_path, monkeypatch):
    folder = tmp_path / "kernels"
    lib = folder / "cpu_kernels.0123456789abcdef.so"
    env = {**os.environ, "CXX": _compiler(tmp_path, sleep=60)}
    code = ("from pathlib import Path; from cloud_server.layers import cpu_kernels; "
            f"cpu_kernels._build(Path({str(lib)!r}))")
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not [p for p in folder.glob(".*.tmp") if p.stat().st_size] and time.monotonic() < deadline:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # the build and its compiler, mid-way
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    (left,) = folder.glob(".*.tmp")
    assert not lib.exists()  # the half library never had the name a loader opens
    monkeypatch.setenv("CXX", _compiler(tmp_path))
    cpu_kernels._build(lib)
    assert lib.read_bytes().startswith(b"\x7fELF")
    # before: every killed build's temporary stayed in the folder for good
    assert not left.exists()
    assert sorted(p.name for p in folder.iterdir()) == [".build.lock", lib.name]


def test_a_leftover_of_another_key_is_removed_too_but_not_other_files(tmp_path, monkeypatch):
    folder = tmp_path / "kernels"
    folder.mkdir()
    old = folder / ".cpu_kernels.fedcba9876543210.so.1a2b3c4d.4242.tmp"
    old.write_bytes(b"half")
    keep = folder / "cpu_kernels.fedcba9876543210.so"
    keep.write_bytes(b"\x7fELF other torch")
    monkeypatch.setenv("CXX", _compiler(tmp_path))
    lib = folder / "cpu_kernels.0123456789abcdef.so"
    cpu_kernels._build(lib)
    assert lib.is_file() and keep.is_file() and not old.exists()


def test_a_build_that_finds_the_library_built_meanwhile_does_not_compile_again(tmp_path, monkeypatch):
    folder = tmp_path / "kernels"
    folder.mkdir()
    lib = folder / "cpu_kernels.0123456789abcdef.so"
    lib.write_bytes(b"\x7fELF built by the process this one waited for")
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))  # before: run, and failed
    cpu_kernels._build(lib)
    assert lib.read_bytes() == b"\x7fELF built by the process this one waited for"
