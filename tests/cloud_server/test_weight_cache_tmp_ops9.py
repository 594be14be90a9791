"""The weight cache's partial file: removed on every way out, and swept when left by a dead process.

Before, the file being written (``.{name}.{pid}.tmp``) stayed behind when the server was shut down
while the load wrote it (``os._exit`` skips every cleanup), and nothing ever removed it: one
model's worth of disk per interrupted start. Now the write goes into a locked folder of that name,
removed by the exit, and the next write removes folders whose lock is free and plain ``.tmp``
files of pids that are gone, never one another live process still holds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from cloud_server.models import weight_cache
from cloud_server.models.weight_cache import WeightCache

ROOT = Path(__file__).resolve().parents[2]


def _cache(folder: Path) -> WeightCache:
    return WeightCache(folder / "model.int8-bfloat16.0123456789abcdef.safetensors", "0123456789abcdef")


def _partials(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid  # reaped: no process has it (until the kernel hands it out again)


def test_a_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import safetensors.torch

    def fails(tensors: dict, path: str, metadata: dict) -> None:
        Path(path).write_bytes(b"half")
        raise KeyboardInterrupt  # not an Exception: the old cleanup did not run for it

    monkeypatch.setattr(safetensors.torch, "save_file", fails)
    with pytest.raises(KeyboardInterrupt):
        _cache(tmp_path).write({"w": torch.zeros(4)})
    assert list(tmp_path.iterdir()) == []


def test_the_next_write_sweeps_what_dead_writers_left(tmp_path: Path) -> None:
    name = "model.int8-bfloat16.0123456789abcdef.safetensors"
    dead = _dead_pid()
    left_folder = tmp_path / f".{name}.{dead}.tmp"  # a writer killed mid-write: its lock is gone
    left_folder.mkdir()
    (left_folder / "weights.safetensors").write_bytes(b"x" * 100)
    left_file = tmp_path / f".other.safetensors.{dead}.tmp"  # as older versions wrote it
    left_file.write_bytes(b"x" * 100)
    unrelated = tmp_path / ".notes.tmp"  # no pid in the name: not ours
    unrelated.write_text("keep")

    _cache(tmp_path).write({"w": torch.ones(4)})

    assert _partials(tmp_path) == [".notes.tmp"]
    assert (tmp_path / name).is_file()


def test_a_live_writers_files_are_left_alone(tmp_path: Path) -> None:
    live = tmp_path / ".model.int8-bfloat16.fedcba9876543210.safetensors.1.tmp"
    live.mkdir()
    # another process (in another container, its pid meaning nothing here) holds the folder's lock
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import fcntl, os, sys, time
            fd = os.open({str(live)!r}, os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_EX)
            print("locked", flush=True)
            time.sleep(60)
        """)],
        stdout=subprocess.PIPE, text=True,
    )
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    legacy = tmp_path / f".old.safetensors.{sleeper.pid}.tmp"  # an older version's, still writing
    legacy.write_bytes(b"x")
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        _cache(tmp_path).write({"w": torch.ones(4)})
        assert live.is_dir() and legacy.is_file()
    finally:
        holder.kill()
        sleeper.kill()
        holder.wait()
        sleeper.wait()
    weight_cache.sweep_partial_files(tmp_path)  # both writers gone now
    assert not live.exists()  # its lock is free (though pid 1 in its name lives)
    assert not legacy.exists()  # its pid is gone


# The CLI, loading the real model while the disk under the weight cache is slow: save_file writes
# its file and then takes a minute, so the signal comes while the cache is being written.
SLOW_DISK = textwrap.dedent("""
    import sys, time
    import safetensors.torch
    from cloud_server.__main__ import main

    save_file = safetensors.torch.save_file

    def slow_save_file(tensors, path, metadata=None):
        save_file(tensors, path, metadata=metadata)
        print("WRITING", path, flush=True)
        time.sleep(60)

    safetensors.torch.save_file = slow_save_file
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.real
def test_sigterm_while_the_real_load_writes_the_cache_leaves_no_partial_file(
    smollm2_path: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "HYBRIDLLM_HOME": str(tmp_path), "HYBRIDLLM_ENGINE_WEIGHT_CACHE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_DISK, "serve", "--model", str(smollm2_path), "--port", "0",
         "--device", "cpu", "--quantization", "int8", "--num-threads", "1"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    cache = tmp_path / "engine-weights"
    output = ""
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            output += line
            if line.startswith("WRITING"):
                break
        assert _partials(cache), output  # the partial file is there, being written
        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        code = proc.wait(timeout=20)
        took = time.monotonic() - start
        output += proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0, output
    assert took < 5.0, output
    assert "shut down while the model was loading" in output, output
    assert list(cache.iterdir()) == [], output  # neither a partial file nor a cache file
