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
