"""GGUF metadata that the engine cannot run as written: a RoPE scaling type it does not implement
(yarn, longrope: run as plain RoPE it gave wrong answers past the original context), partial RoPE,
a value of the wrong type (a string or a per-layer array where one number belongs, a size of 0).
Each is one ModelLoadError naming the file and the field, before any weight is read; never a
ValueError, TypeError or ZeroDivisionError. Tiny files written here."""

from __future__ import annotations

import numpy as np
import pytest

from cloud_server.exceptions import ModelLoadError
from cloud_server.models.loader_gguf import open_gguf

gguf = pytest.importorskip("gguf")
T = gguf.GGUFValueType


def _write(path, arch="llama", **keys):
    """A one-layer model of width 32, two heads; ``keys``: extra metadata, name -> (value, type)."""
    sizes = {"embedding_length": (32, T.UINT32), "attention.head_count": (2, T.UINT32),
             "block_count": (1, T.UINT32), "feed_forward_length": (64, T.UINT32)}
    w = gguf.GGUFWriter(str(path), arch)
    for key, (value, kind) in {**sizes, **keys}.items():
        if kind == T.ARRAY:
            w.add_array(f"{arch}.{key}", value)
        else:
            w.add_key_value(f"{arch}.{key}", value, kind)
    w.add_token_list(["a", "b", "c"])
    w.add_tensor("token_embd.weight", np.ones((3, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("kind", ["yarn", "longrope"])
def test_a_rope_scaling_the_engine_does_not_implement_is_refused_by_name(tmp_path, kind):
    path = _write(tmp_path / "long.gguf", **{"rope.scaling.type": (kind, T.STRING),
                                             "rope.scaling.factor": (4.0, T.FLOAT32),
                                             "rope.scaling.original_context_length": (32768, T.UINT32)})
    # before: loaded with rope_scaling None, plain RoPE: silently wrong past 32k positions
    with pytest.raises(ModelLoadError, match=rf"long\.gguf: .*rope\.scaling\.type '{kind}' is not supported"):
        open_gguf(path)


def test_linear_and_none_scalings_still_load(tmp_path):
    linear = _write(tmp_path / "lin.gguf", **{"rope.scaling.type": ("linear", T.STRING),
                                              "rope.scaling.factor": (4.0, T.FLOAT32)})
    assert open_gguf(linear)[0].rope_scaling == {"rope_type": "linear", "factor": 4.0}
    only_factor = _write(tmp_path / "f.gguf", **{"rope.scaling.factor": (2.0, T.FLOAT32)})
    assert open_gguf(only_factor)[0].rope_scaling == {"rope_type": "linear", "factor": 2.0}
    none = _write(tmp_path / "none.gguf", **{"rope.scaling.type": ("none", T.STRING),
                                             "rope.scaling.factor": (4.0, T.FLOAT32)})
    assert open_gguf(none)[0].rope_scaling is None
    assert open_gguf(_write(tmp_path / "plain.gguf"))[0].rope_scaling is None


def test_the_older_scale_linear_key_is_read(tmp_path):
    # llama.cpp reads {arch}.rope.scale_linear where rope.scaling.factor is absent; it was ignored
    path = _write(tmp_path / "old.gguf", **{"rope.scale_linear": (8.0, T.FLOAT32)})
    assert open_gguf(path)[0].rope_scaling == {"rope_type": "linear", "factor": 8.0}


def test_partial_rope_is_refused(tmp_path):
    path = _write(tmp_path / "partial.gguf", **{"rope.dimension_count": (8, T.UINT32)})
    # before: every dimension of the 16-wide heads rotated where the model rotates 8
    with pytest.raises(ModelLoadError, match=r"partial\.gguf: .*llama\.rope\.dimension_count \(8\)"):
        open_gguf(path)
    full = _write(tmp_path / "full.gguf", **{"rope.dimension_count": (16, T.UINT32)})
    assert open_gguf(full)[0].head_dim == 16


@pytest.mark.parametrize(("key", "value"), [
    ("embedding_length", ("32", T.STRING)),
    ("attention.head_count", (0, T.UINT32)),
    ("attention.head_count", ([2], T.ARRAY)),
    ("attention.head_count_kv", (0, T.UINT32)),
    ("attention.head_count_kv", ([2], T.ARRAY)),
    ("feed_forward_length", ([64], T.ARRAY)),
    ("block_count", (-1, T.INT32)),
    ("context_length", (1.5, T.FLOAT32)),
    ("attention.layer_norm_rms_epsilon", ("1e-5", T.STRING)),
    ("rope.freq_base", ("x", T.STRING)),
    ("rope.scaling.factor", ("4", T.STRING)),
], ids=lambda v: str(v[0]) if isinstance(v, tuple) else v)
def test_a_value_of_the_wrong_type_names_the_file_and_the_field(tmp_path, key, value):
    path = _write(tmp_path / "odd.gguf", **{key: value})
    # before: ValueError, TypeError or ZeroDivisionError out of the loader
    with pytest.raises(ModelLoadError, match=rf"odd\.gguf: .*llama\.{key.replace('.', '[.]')} must be"):
        open_gguf(path)


def test_an_unknown_architecture_lists_every_supported_one(tmp_path):
    with pytest.raises(ModelLoadError, match=r"bert\.gguf: .*'bert' is not supported \(llama, qwen2, gemma3"):
        open_gguf(_write(tmp_path / "bert.gguf", arch="bert"))
