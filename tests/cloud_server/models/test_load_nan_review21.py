"""A checkpoint whose weights hold a NaN or inf is refused at load, naming the tensor and its file
and saying what to do; before, it loaded and the server answered garbage (or failed on NaN logits
deep in a step). Tiny synthetic checkpoints (safetensors folders, GGUF files, weight cache files)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cloud_server.exceptions import ModelLoadError
from tests.cloud_server.models import test_loader_gguf_review16 as gg
from tests.cloud_server.models import test_loader_safetensors_review17 as st

UP = "model.layers.0.mlp.up_proj.weight"
AGAIN = "download it again"


@pytest.fixture(autouse=True)
def _no_tokenizer(monkeypatch):
    """The weights are what is tested: the tiny files hold no tokenizer the loader could read."""
    monkeypatch.setattr("cloud_server.models.tokenizer.HFTokenizer", lambda path: None)
    monkeypatch.setattr("cloud_server.models.tokenizer.GGUFTokenizer", lambda path: None)


def _load(path, quantization="none", dtype=torch.float32):
    from cloud_server.models.loader import load_model

    return load_model(str(path), device=torch.device("cpu"), dtype=dtype,
                      quantization=quantization, weight_cache=False)


@pytest.mark.parametrize("quantization", ["none", "int8", "int4"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_folder_with_a_bad_weight_is_refused_naming_tensor_and_shard(tmp_path, bad, quantization):
    tensors = st._tensors()
    tensors[UP][3, 5] = bad
    folder = st._folder(tmp_path, tensors, sharded=True)
    shard = next(s for s in sorted(folder.glob("*.safetensors")) if UP in _names(s))
    kind = "NaN" if bad != bad else "inf"
    with pytest.raises(ModelLoadError) as err:
        _load(folder, quantization)
    msg = str(err.value)
    assert str(shard) in msg and f"tensor {UP}" in msg and f"{kind} at [3, 5]" in msg, msg
    assert AGAIN in msg and "quantization='none'" not in msg  # 'none' would load it silently


def _names(path):
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return set(f.keys())


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_a_bad_norm_is_refused_too(tmp_path, quantization):
    tensors = st._tensors()
    tensors["model.norm.weight"][[1, 7]] = float("nan")  # a norm is never quantized
    folder = st._folder(tmp_path, tensors)
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: tensor model\.norm\.weight: "
                                             r"weights not finite \(NaN at \[1\] and 1 more\)"):
        _load(folder, quantization)


def test_weights_float16_cannot_hold_are_told_to_load_in_bfloat16(tmp_path):
    tensors = st._tensors()
    tensors["model.norm.weight"][2] = 1e6  # finite in the file, inf once cast to float16
    folder = st._folder(tmp_path, tensors)
    with pytest.raises(ModelLoadError, match=r"model\.norm\.weight: weights up to 1e\+06 do not fit "
                                             r"float16 .*bfloat16"):
        _load(folder, dtype=torch.float16)
    assert _load(folder, dtype=torch.bfloat16).config.hidden_size == 16  # the file itself is fine


def test_a_clean_folder_loads(tmp_path):
    assert _load(st._folder(tmp_path)).config.hidden_size == 16


@pytest.mark.parametrize("quantization", ["none", "int8", "int4"])
def test_a_gguf_with_an_inf_float_weight_is_refused_naming_the_file(tmp_path, quantization):
    up = np.random.default_rng(0).random((gg.F, gg.H), dtype=np.float32)
    up[2, 3] = np.inf
    path = gg._model(tmp_path / "bad up.gguf", **{"blk.0.ffn_up.weight": up})
    with pytest.raises(ModelLoadError, match=rf"GGUF file .*bad up\.gguf: tensor {UP}: weights not "
                                             rf"finite \(inf at \[2, 3\]\).*{AGAIN}"):
        _load(path, quantization)


def _q8_0_with_a_nan_scale(rows, cols, bad_row):
    """A Q8_0 tensor (34-byte blocks: fp16 d, then 32 int8 codes) whose row ``bad_row`` has a NaN d."""
    import gguf
    from gguf.quants import quantize

    arr = np.random.default_rng(1).standard_normal((rows, cols)).astype(np.float32)
    raw = quantize(arr, gguf.GGMLQuantizationType.Q8_0)  # uint8 [rows, cols / 32 * 34]
    raw[bad_row, 0:2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
    return raw


@pytest.mark.parametrize("quantization", ["none", "int8", "int4"])
def test_a_gguf_block_with_a_nan_scale_is_refused(tmp_path, quantization):
    import gguf

    raw = _q8_0_with_a_nan_scale(gg.F, gg.H, bad_row=9)
    path = tmp_path / "q8.gguf"
    tensors = {n: np.random.default_rng(0).random(s, dtype=np.float32) for n, s in gg.SHAPES.items()}
    tensors["blk.0.ffn_up.weight"] = raw
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("embedding_length", gg.H), ("head_count", 2), ("head_count_kv", 2),
                       ("block_count", 1), ("feed_forward_length", gg.F), ("context_length", 64)):
        getattr(writer, f"add_{key}")(value)
    writer.add_token_list([f"t{i}" for i in range(gg.V)])
    for name, arr in tensors.items():
        q8 = name == "blk.0.ffn_up.weight"
        writer.add_tensor(name, arr, raw_dtype=gguf.GGMLQuantizationType.Q8_0 if q8 else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    # none: dequantized NaN weights; int8 / int4: its own blocks kept, the NaN in their scales
    what = "weights" if quantization == "none" else "block scales"
    with pytest.raises(ModelLoadError, match=rf"q8\.gguf: tensor {UP}: {what} not finite \(NaN at \[9, "):
        _load(path, quantization)


def test_the_position_in_a_matrix_read_in_bands_counts_the_rows_before(tmp_path, monkeypatch):
    import cloud_server.models.loader_gguf as lg

    monkeypatch.setattr(lg, "_CHUNK_ELEMENTS", 64)  # the 8 x 32 embedding comes in bands of 2 rows
    embed = np.random.default_rng(0).random((gg.V, gg.H), dtype=np.float32)
    embed[5, 3] = np.nan
    path = gg._model(tmp_path / "emb.gguf", **{"token_embd.weight": embed})
    with pytest.raises(ModelLoadError, match=r"model\.embed_tokens\.weight: weights not finite "
                                             r"\(NaN at \[5, 3\]\)"):
        _load(path)


def test_a_cached_conversion_with_a_nan_scale_is_converted_again(tmp_path):
    from cloud_server.models.weight_cache import WeightCache

    gguf_file = tmp_path / "m.gguf"
    gguf_file.write_bytes(b"GGUF")
    cache = WeightCache.for_model(gguf_file, device=torch.device("cpu"), dtype=torch.float32,
                                  quantization="int8", enabled=True, root=tmp_path / "cache")
    scale = torch.ones(4, 1, 2, dtype=torch.float16)
    weights = {UP: (torch.ones(4, 32, dtype=torch.int8), scale), "model.norm.weight": torch.ones(16)}
    cache.write(weights)
    assert cache.read() is not None  # a sound file is read back
    scale[2, 0, 0] = float("nan")  # as a damaged file would read
    cache.write(weights)
    assert cache.read() is None and not cache.file.exists()  # then the GGUF is converted (and checked)


@pytest.mark.parametrize("values, finite", [
    ([1.0, 2.0], True),
    ([1.0, float("nan")], False),
    ([float("inf"), 1.0], False),
    ([float("-inf"), float("inf")], False),  # inf - inf: a NaN sum, still not finite
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_all_finite(values, finite, dtype):
    from cloud_server.models.finite import all_finite

    assert all_finite(torch.tensor(values, dtype=dtype).reshape(1, -1)) is finite


def test_all_finite_is_exact_where_a_finite_sum_overflows():
    from cloud_server.models.finite import all_finite

    assert all_finite(torch.full((4,), 60000.0, dtype=torch.float16))  # the float16 sum is inf
    assert all_finite(torch.ones(3, dtype=torch.int8)) and all_finite(torch.empty(0))

