"""Ctrl-C while a router is saved over another (`router train --out` an existing folder,
`router calibrate` in place): the folder holds one whole router, never half of each."""

from pathlib import Path

import numpy as np
import pytest

from hybridllm.router.router import load_router

from .fakes import length_router

PROMPTS = ["hi", "What is the capital of France?", "Explain " * 40]


def test_ctrl_c_right_after_the_weights_rename_leaves_the_new_router_whole(tmp_path, monkeypatch):
    folder = tmp_path / "r"
    length_router(0.42).save(folder)
    new = length_router(0.9, pivot_chars=10)
    real = Path.replace

    def interrupted(self, target):
        result = real(self, target)
        if Path(target).name == "weights.npz":  # the signal lands as the first rename returns
            raise KeyboardInterrupt
        return result

    monkeypatch.setattr(Path, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        new.save(folder)
    monkeypatch.undo()
    assert sorted(p.name for p in folder.iterdir()) == ["router.json", "weights.npz"]  # no temp left
    loaded = load_router(folder)  # was refused: "from two different saves"
    assert loaded.threshold == pytest.approx(0.9)
    assert np.allclose(loaded.score_texts(PROMPTS), new.score_texts(PROMPTS))


def test_ctrl_c_before_the_renames_leaves_the_old_router(tmp_path, monkeypatch):
    folder = tmp_path / "r"
    length_router(0.42).save(folder)

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        length_router(0.9, pivot_chars=10).save(folder)
    monkeypatch.undo()
    assert sorted(p.name for p in folder.iterdir()) == ["router.json", "weights.npz"]
    assert load_router(folder).threshold == pytest.approx(0.42)


def test_both_files_reach_the_disk_before_either_is_renamed(tmp_path, monkeypatch):
    """A power cut after the renames must not leave the names on data the disk never got: each
    temporary file is fsynced before the first rename, and the folder after the last."""
    import hybridllm.router.router as router_module

    events: list[str] = []
    real_replace = Path.replace
    monkeypatch.setattr(router_module, "fsync_file", lambda p: events.append(f"fsync {Path(p).name}"))
    monkeypatch.setattr(router_module, "fsync_folder", lambda p: events.append("fsync folder"))

    def replace(self, target):
        events.append(f"rename {Path(target).name}")
        return real_replace(self, target)

    monkeypatch.setattr(Path, "replace", replace)
    length_router(0.42).save(tmp_path / "r")
    renames = [i for i, e in enumerate(events) if e.startswith("rename")]
    synced = [e for e in events[: renames[0]] if e.startswith("fsync .")]
    assert len(synced) == 2, events  # the weights' and the config's temporary files
    assert events[-1] == "fsync folder", events
