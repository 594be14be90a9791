"""Router files: a round trip keeps the scores; corrupt or incompatible files fail clearly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hybridllm._exceptions import RouterFileError
from hybridllm.router.router import load_router

from .fakes import length_router

PROMPTS = ["hi", "What is the capital of France?", "Explain " * 40]


@pytest.fixture
def saved(tmp_path):
    router = length_router(0.42)
    router.save(tmp_path / "r")
    return router, tmp_path / "r"


def test_round_trip(saved):
    router, folder = saved
    loaded = load_router(folder)
    assert loaded.threshold == pytest.approx(0.42)
    assert np.allclose(loaded.score_texts(PROMPTS), router.score_texts(PROMPTS))
    assert load_router(folder / "router.json").threshold == pytest.approx(0.42)


def test_corrupt_json(saved):
    _, folder = saved
    (folder / "router.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(RouterFileError, match="corrupt"):
        load_router(folder)


def test_corrupt_weights(saved):
    _, folder = saved
    (folder / "weights.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(RouterFileError, match="corrupt"):
        load_router(folder)


def test_missing_weights(saved):
    _, folder = saved
    (folder / "weights.npz").unlink()
    with pytest.raises(RouterFileError, match="missing"):
        load_router(folder)


_UNPICKLED: list[str] = []


def _record_unpickling() -> float:
    _UNPICKLED.append("ran")
    return 0.0


class _Payload:
    """A pickle whose loading runs code (here: it only records that it ran)."""

    def __reduce__(self):
        return (_record_unpickling, ())


def test_pickled_weights_are_refused(saved):
    _, folder = saved
    with np.load(folder / "weights.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    # a complete file, every array present: only the pickle in one of them can make it fail
    arrays["mean"] = np.asarray([_Payload() for _ in arrays["mean"]], dtype=object)
    np.savez(folder / "weights.npz", **arrays)
    _UNPICKLED.clear()
    with pytest.raises(RouterFileError, match="corrupt.*allow_pickle"):
        load_router(folder)
    assert _UNPICKLED == []  # refused before unpickling, not after running it


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("format_version", 99, "format version 99"),
        ("format", "something-else", "not a hybridllm router"),
        ("text_features", ["log_chars"], "other text features"),
        ("classifier", "xgboost", "unknown classifier"),
        ("threshold", "high", "no valid threshold"),
    ],
)
def test_incompatible(saved, key, value, match):
    _, folder = saved
    cfg = json.loads((folder / "router.json").read_text())
    cfg[key] = value
    (folder / "router.json").write_text(json.dumps(cfg))
    with pytest.raises(RouterFileError, match=match):
        load_router(folder)


def test_wrong_shapes(saved):
    _, folder = saved
    with np.load(folder / "weights.npz") as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["coef"] = arrays["coef"][:, :3]
    np.savez(folder / "weights.npz", **arrays)
    with pytest.raises(RouterFileError, match="Retrain"):
        load_router(folder)


def test_missing_folder(tmp_path):
    with pytest.raises(RouterFileError, match="does not exist"):
        load_router(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RouterFileError, match="No router.json"):
        load_router(tmp_path / "empty")


@pytest.mark.parametrize("fail_at", ["write_text", "replace"])
def test_a_save_cut_short_never_loads_half(saved, monkeypatch, fail_at):
    """A crash while a router is saved over another (`router calibrate` in place, `train --out`
    an existing folder): cut while writing, the old router still loads whole; cut between the two
    renames, the folder is refused, never the new weights under the old threshold."""
    from pathlib import Path

    old, folder = saved
    new = length_router(0.9, pivot_chars=10)  # other weights, other threshold
    calls = []
    real = getattr(Path, fail_at)

    def cut(self, *args, **kwargs):
        calls.append(self)
        if fail_at == "write_text" or len(calls) == 2:  # router.json's write, or its rename
            raise OSError("No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, fail_at, cut)
    with pytest.raises(OSError, match="No space"):
        new.save(folder)
    monkeypatch.undo()
    assert sorted(p.name for p in folder.iterdir()) == ["router.json", "weights.npz"]  # no temp left
    if fail_at == "replace":
        with pytest.raises(RouterFileError, match="two different saves"):
            load_router(folder)
        return
    loaded = load_router(folder)
    assert loaded.threshold == pytest.approx(0.42)
    assert np.allclose(loaded.score_texts(PROMPTS), old.score_texts(PROMPTS))


def test_save_into_a_file_is_refused(tmp_path):
    (tmp_path / "r").write_text("")
    with pytest.raises(RouterFileError, match="is a file"):
        length_router().save(tmp_path / "r")
