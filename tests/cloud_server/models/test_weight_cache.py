"""The engine's int8 weight cache: written on the first load, read (not converted) on the next,
identical weights either way; a corrupt or stale file is replaced; turned off, nothing is written."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.real


def _load(path, **kw):
    import torch

    from cloud_server.models.loader import load_model

    return load_model(
        str(path),
        device=torch.device("cpu"),
        dtype=torch.bfloat16,
        max_position=256,
        quantization="int8",
        **kw,
    )


def _state(loaded):
    layer = loaded.model.model.layers[3]
    return (
        layer.mlp.gate_up_proj.weight.clone(),
        layer.mlp.gate_up_proj.scale.clone(),
        layer.input_layernorm.weight.clone(),
        loaded.model.lm_head.weight.clone(),
    )


def _files(home):
    return sorted((home / "engine-weights").glob("*.safetensors"))


def test_second_load_reads_the_cache(smollm2_path, tmp_path, monkeypatch):
    import torch

    from cloud_server.models import loader

    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path))
    monkeypatch.delenv("HYBRIDLLM_ENGINE_WEIGHT_CACHE", raising=False)
    first = _state(_load(smollm2_path))
    (written,) = _files(tmp_path)
    assert written.name.startswith(smollm2_path.stem + ".int8-bfloat16.")

    def no_conversion(*a, **k):
        raise AssertionError("converted again although the cache holds the weights")

    monkeypatch.setattr(loader, "convert_weights", no_conversion)
    loaded = _load(smollm2_path)
    second = _state(loaded)
    for a, b in zip(first, second, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    # int8 codes (the bytes q + 128 in the engine kernel's format)
    assert first[0].dtype in (torch.int8, torch.uint8)
    # torch's int8 kernel needs aligned rows: read-back weights are not views into the mapped file
    layers = [m for m in loaded.model.modules() if getattr(m, "weight", None) is not None]
    assert all(m.weight.data_ptr() % 64 == 0 for m in layers)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    ids = torch.tensor([1, 2, 3])
    assert torch.isfinite(loaded.model.lm_head(loaded.model.model.embed_tokens(ids).to(x.dtype))).all()


def test_corrupt_cache_is_rebuilt_and_stale_removed(smollm2_path, tmp_path, monkeypatch):
    from cloud_server.models.weight_cache import WeightCache

    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path))
    _load(smollm2_path)
    (good,) = _files(tmp_path)
    size = good.stat().st_size
    good.write_bytes(b"not a safetensors file")  # damaged on disk
    stale = good.with_name(good.name.replace(good.name.split(".")[-2], "0" * 16))
    stale.write_bytes(b"an older conversion")
    loaded = _load(smollm2_path)  # logs, converts, rewrites
    assert loaded.model.lm_head.weight is not None
    assert _files(tmp_path) == [good] and good.stat().st_size == size
    import torch

    cache = WeightCache.for_model(
        smollm2_path,
        device=torch.device("cpu"),
        dtype=torch.bfloat16,
        quantization="int8",
        root=tmp_path / "engine-weights",
    )
    assert cache is not None and cache.read() is not None


def test_off_by_env_and_for_float_weights(smollm2_path, tmp_path, monkeypatch):
    import torch

    from cloud_server.models.weight_cache import WeightCache

    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path))
    monkeypatch.setenv("HYBRIDLLM_ENGINE_WEIGHT_CACHE", "0")
    _load(smollm2_path)
    assert _files(tmp_path) == []
    cpu = torch.device("cpu")
    assert (
        WeightCache.for_model(
            smollm2_path, device=cpu, dtype=torch.float32, quantization="none", enabled=True
        )
        is None
    )


def test_assembling_frees_each_tensor_only_when_asked(smollm2_path):
    """``load_model`` hands its converted weights over (``consume=True``): each tensor leaves the
    dict as it is placed, so none outlives its repacked copy; other callers keep theirs."""
    import torch

    from cloud_server.models.loader import assemble_model, convert_weights
    from cloud_server.models.loader_gguf import iter_gguf_tensors, open_gguf

    config, gguf_file, _ = open_gguf(smollm2_path)
    cpu = torch.device("cpu")
    weights = convert_weights(iter_gguf_tensors(gguf_file, config, quantization="int4"), device=cpu,
                              dtype=torch.bfloat16, quantization="int4")
    names = set(weights)
    kept = assemble_model(config, weights, device=cpu, dtype=torch.bfloat16, max_position=64)
    assert set(weights) == names
    given = assemble_model(config, weights, device=cpu, dtype=torch.bfloat16, max_position=64, consume=True)
    assert weights == {}
    ids = torch.tensor([1, 2, 3])
    assert torch.equal(kept.model.embed_tokens(ids), given.model.embed_tokens(ids))


def test_the_reader_round_trips_and_refuses_a_lying_header(tmp_path):
    """The cache is read without mapping the file; its header is checked before any allocation."""
    import json
    import struct

    import torch
    from safetensors.torch import save_file

    from cloud_server.models.weight_cache import _read_safetensors

    path = tmp_path / "w.safetensors"
    tensors = {"a": torch.randn(3, 5).to(torch.bfloat16), "b": torch.arange(7, dtype=torch.int8),
               "c": torch.tensor(2.5), "d": torch.empty(0, 4)}
    save_file(tensors, str(path), metadata={"format": "x"})
    meta, got = _read_safetensors(path)
    assert meta == {"format": "x"} and set(got) == set(tensors)
    assert all(got[k].dtype == t.dtype and torch.equal(got[k], t) for k, t in tensors.items())
    header = json.dumps({"w": {"dtype": "F32", "shape": [1 << 40, 1 << 20], "data_offsets": [0, 16]}})
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + bytes(16))
    with pytest.raises(ValueError, match="16 bytes at 0"):
        _read_safetensors(path)
    path.write_bytes(path.read_bytes()[:-8])  # and a file cut short
    with pytest.raises(ValueError):
        _read_safetensors(path)
