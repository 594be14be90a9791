"""The cloud's refusal memory (``backends/refusals.py``, cloud_refused_fields.json) written by
several writers at once: clients on threads of one process (``hybridllm serve``, an app with
several HybridLLM instances) and two processes. Before: each writer read the file, added its entry
and replaced it, with no lock and one temporary name per process, so concurrent writers dropped
each other's entries, and two threads mixed their bytes into one corrupt file (every entry lost).
Also: with HYBRIDLLM_CACHE_DIR unset the file goes under HYBRIDLLM_HOME/cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hybridllm.backends import refusals
from hybridllm.backends.refusals import FILE_NAME, RefusalMemory


def _slow_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read of the file takes a while: writers that are not kept apart all read it before
    any of them writes (what a busy machine does now and then, made certain here)."""
    read = RefusalMemory._read

    def slow(self: RefusalMemory) -> dict:
        entries = read(self)
        time.sleep(0.2)
        return entries

    monkeypatch.setattr(RefusalMemory, "_read", slow)


def test_threads_writing_at_once_keep_every_entry_and_a_readable_file(tmp_path, monkeypatch):
    _slow_reads(monkeypatch)
    path = tmp_path / FILE_NAME
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def learn(i: int) -> None:
        try:
            memory = RefusalMemory(path)  # one per client, as each CloudBackend has its own
            start.wait()
            memory.remember(f"https://api{i}.example/v1", "o-model", frozenset({"stop"}))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=learn, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    entries = json.loads(path.read_text(encoding="utf-8"))["entries"]  # whole JSON, not mixed bytes
    assert sorted(entries) == [f"https://api{i}.example/v1 o-model" for i in range(4)]
    for i in range(4):
        assert RefusalMemory(path).recall(f"https://api{i}.example/v1", "o-model")[0] == {"stop"}
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_two_processes_writing_at_once_keep_both_entries(tmp_path):
    path, go = tmp_path / FILE_NAME, tmp_path / "go"
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from hybridllm.backends.refusals import RefusalMemory\n"
        "read = RefusalMemory._read\n"
        "def slow(self):\n"
        "    entries = read(self)\n"
        "    time.sleep(0.5)\n"
        "    return entries\n"
        "RefusalMemory._read = slow\n"
        "go = Path(sys.argv[2])\n"
        "print('ready', flush=True)\n"
        "while not go.exists():\n"
        "    time.sleep(0.005)\n"
        "RefusalMemory(Path(sys.argv[1])).remember(sys.argv[3], 'o-model', frozenset({'stop', 'top_p'}))\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path), str(go), f"https://p{i}.example/v1"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        go.touch()  # both write from now: each reads the file while the other does
        for p in procs:
            assert p.wait(timeout=60) == 0, p.stderr.read() if p.stderr else ""
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    entries = json.loads(path.read_text(encoding="utf-8"))["entries"]
    assert sorted(entries) == ["https://p0.example/v1 o-model", "https://p1.example/v1 o-model"]


def test_without_a_cache_dir_setting_the_file_is_under_hybridllm_home(tmp_path, monkeypatch):
    monkeypatch.delenv("HYBRIDLLM_CACHE_DIR", raising=False)
    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path / "home"))
    memory = RefusalMemory()
    memory.remember("https://api.example/v1", "o-model", frozenset({"stop"}))
    assert memory.path == tmp_path / "home" / "cache" / FILE_NAME
    assert RefusalMemory().recall("https://api.example/v1", "o-model")[0] == {"stop"}


def test_a_cache_dir_that_cannot_be_made_keeps_nothing_and_raises_nothing(tmp_path):
    (tmp_path / "file").write_text("x")
    memory = RefusalMemory(Path(tmp_path / "file" / "sub" / FILE_NAME))
    memory.remember("https://api.example/v1", "o-model", frozenset({"stop"}))  # no error
    assert memory.recall("https://api.example/v1", "o-model") is None
    assert refusals._LOCK.acquire(blocking=False)  # not left held by the failed write
    refusals._LOCK.release()
    assert os.listdir(tmp_path) == ["file"]
