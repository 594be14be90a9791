"""A pulled model's cloud-engine conversions belong to it (review 39): `hybridllm models list` counts
``engine-weights/*.safetensors`` converted from its GGUF and `hybridllm models remove` deletes them.
Before, removing the 1.5B to free space left its int8 conversion (about 1.6 GB) behind, and the
list never showed it. The files are found by the source their header records, read without torch;
the one written here by the engine's own cache keeps the writer and the reader in step."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from hybridllm.cli import main
from hybridllm.models import engine_weights
from hybridllm.models.remove import disk_usage, plan, remove

SMOL, GEMMA = "smollm2-135m-instruct", "gemma3-270m"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _gguf(home: Path, model: str) -> Path:
    path = home / "models" / model / f"{model}.gguf"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"GGUF" + bytes(60))
    return path


def _converted(
    home: Path, name: str, source: object, fmt: str = engine_weights.FORMAT, pad: int = 1000
) -> Path:
    """A safetensors file as the engine's cache writes one: its header's metadata names the GGUF."""
    header = json.dumps({"__metadata__": {"format": fmt, "key": "k", "source": source}}).encode()
    path = home / engine_weights.FOLDER / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(pad))
    return path


def test_a_models_conversions_are_counted_and_removed_with_it(home: Path, tmp_path: Path) -> None:
    gguf = _gguf(home, SMOL)
    mine = _converted(home, "smol.int8-bfloat16.k.safetensors", os.path.realpath(gguf))
    others = [
        _converted(home, "gemma.int8-bfloat16.k.safetensors", os.path.realpath(_gguf(home, GEMMA))),
        _converted(
            home, "own.int8-bfloat16.k.safetensors", str(tmp_path / "mine" / "own.gguf")
        ),  # a user's GGUF
        _converted(home, "other-format.safetensors", os.path.realpath(gguf), fmt="something-else"),
        _converted(home, "prefix.safetensors", os.path.realpath(gguf.parent) + "-other/x.gguf"),
    ]
    (home / engine_weights.FOLDER / "damaged.safetensors").write_bytes(b"\xff" * 20)  # no header: not claimed
    assert engine_weights.converted_from(gguf.parent) == [mine]
    assert mine in [e.path for e in plan(SMOL)]
    assert disk_usage(SMOL) == gguf.stat().st_size + mine.stat().st_size
    assert mine in remove(SMOL)
    assert not mine.exists() and all(p.exists() for p in others)
    assert (home / engine_weights.FOLDER / "damaged.safetensors").exists()
    assert disk_usage(SMOL) == 0


def test_the_list_and_the_remove_command_show_them(
    home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    gguf = _gguf(home, SMOL)
    mine = _converted(home, "smol.int4-bfloat16.k.safetensors", os.path.realpath(gguf), pad=5_000_000)
    assert main(["models", "list", "--json"]) == 0
    [row] = [r for r in json.loads(capsys.readouterr().out) if r["id"] == SMOL]
    assert row["disk_bytes"] == gguf.stat().st_size + mine.stat().st_size
    assert main(["models", "remove", SMOL, "--yes"]) == 0
    assert capsys.readouterr().out.startswith(f"removed {SMOL}: 2 paths, 5.0 MB")
    assert not mine.exists()


def test_the_engines_own_cache_file_is_found(home: Path) -> None:
    """Written by ``cloud_server.models.weight_cache`` for a GGUF in the model's folder: a change to
    what it records (the format, the source) fails here, not silently in `models remove`."""
    torch = pytest.importorskip("torch")
    from cloud_server.models.weight_cache import WeightCache

    gguf = _gguf(home, SMOL)
    cache = WeightCache.for_model(
        gguf, device=torch.device("cpu"), dtype=torch.bfloat16, quantization="int8", enabled=True
    )
    assert cache is not None
    cache.write({"w": (torch.zeros(4, 32, dtype=torch.int8), torch.ones(4, 1)), "norm": torch.ones(4)})
    assert cache.file.is_file()
    assert engine_weights.converted_from(gguf.parent) == [cache.file]
    assert cache.read() is not None  # the shared header reader still serves the engine
    remove(SMOL)
    assert not cache.file.exists()


def test_a_damaged_header_length_is_refused_not_read(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A length past the cap is refused before any byte of it is read (a 1.6 GB file whose first
    8 bytes were damaged was read whole, as its header, by every `models list`)."""
    monkeypatch.setattr(engine_weights, "MAX_HEADER_BYTES", 64)
    gguf = _gguf(home, SMOL)
    big = _converted(home, "big.safetensors", os.path.realpath(gguf), pad=0)
    with pytest.raises(ValueError, match="header of"):
        engine_weights.read_metadata(big)
    assert engine_weights.converted_from(gguf.parent) == []
