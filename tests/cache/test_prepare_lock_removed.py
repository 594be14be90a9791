"""A cache preparer that waited on the folder's lock while `hybridllm models remove` deleted the
folder builds into a live folder afterwards (it wrote into the deleted one and failed)."""

from __future__ import annotations

import shutil
import threading

from hybridllm.cache.prepare import _prepare_lock
from hybridllm.models.store import same_file


def test_a_waiter_gets_a_live_folder_after_the_folder_was_removed(tmp_path):
    out = tmp_path / "embedders" / "minilm-l6-v2"
    holding, waiting_done = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def waiter() -> None:
        holding.wait(10)
        with _prepare_lock(out):  # blocks until the remover lets go
            lock = out / ".prepare.lock"
            seen["live"] = out.is_dir() and lock.is_file()
            (out / "model.onnx").write_bytes(b"built")  # what a build writes, in place
        waiting_done.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    with _prepare_lock(out):  # the remover holds the lock (as models.remove does) ...
        holding.set()
        waiting_done.wait(0.5)  # ... while the waiter blocks on it
        shutil.rmtree(out)  # ... and deletes the folder
    thread.join(10)
    assert waiting_done.is_set()
    assert seen["live"] is True
    assert (out / "model.onnx").read_bytes() == b"built"


def test_same_file_tells_a_replaced_path(tmp_path):
    path = tmp_path / "f"
    path.write_text("a")
    with open(path) as fh:
        assert same_file(fh.fileno(), path)
        path.unlink()
        assert not same_file(fh.fileno(), path)
        path.write_text("b")  # another file at the same path
        assert not same_file(fh.fileno(), path)
