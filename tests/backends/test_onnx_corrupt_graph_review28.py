"""A model.onnx with a flipped byte in a tensor's name is a ModelCorruptError naming the folder and
the command that prepares it again. ONNX Runtime GenAI's error quoted the damaged name, whose bytes
are not UTF-8, so the message itself failed to decode: a raw UnicodeDecodeError ("'utf-8' codec
can't decode byte 0xe6") reached the caller."""

from __future__ import annotations

import pytest

from hybridllm import ModelCorruptError

pytestmark = pytest.mark.real
MODEL = "smollm2-135m-instruct"


def test_a_flipped_byte_in_a_tensor_name_is_a_damaged_folder(tmp_path):
    pytest.importorskip("onnxruntime_genai")
    from hybridllm.backends.onnx import OnnxBackend
    from hybridllm.models.onnx_prepare import prepare_onnx

    folder = prepare_onnx(MODEL)
    copy = tmp_path / "onnx-int4-cpu"
    copy.mkdir()
    for f in folder.iterdir():
        if f.name == "model.onnx.data":  # 100 MB, read as it is: linked, not copied
            (copy / f.name).symlink_to(f)
        elif f.is_file():
            (copy / f.name).write_bytes(f.read_bytes())
    graph = bytearray((folder / "model.onnx").read_bytes())
    at = graph.index(b"model.layers.0.attn.o_proj.MatMul_Q4")
    graph[at + 2] ^= 0x80  # "mo\\xe4el.layers...": a name that is not UTF-8
    (copy / "model.onnx").write_bytes(bytes(graph))
    with pytest.raises(ModelCorruptError) as err:
        OnnxBackend(str(copy), n_ctx=128, n_threads=1)
    text = str(err.value)
    assert str(copy) in text and "missing, truncated or corrupt" in text, text
    assert f"hybridllm models prepare {MODEL} --backend onnx --force" in text, text
    assert "codec can't decode" not in text, text
