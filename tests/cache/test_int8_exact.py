"""The cache's int8 graphs compute the same numbers on every CPU: uint8 weights (U8U8 kernels).

With int8 weights, a CPU without VNNI (AVX2 only) sums each pair of uint8 x int8 products in int16
and saturates, so the same prepared model gave other embeddings there (router scores up to 0.064
apart from a VNNI machine's). A folder prepared with that recipe is prepared again on first use.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.real


def _matmul_model(path: Path, weights: np.ndarray) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    k, n = weights.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="/layer/query/MatMul")],
        "one_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
        [numpy_helper.from_array(weights.astype(np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def test_quantized_matmul_does_not_saturate(tmp_path: Path) -> None:
    """Positive activations near their batch maximum times weights near their column maximum: the
    worst case for int16 pair sums (2 * 255 * 127 = 64,770 > 32,767). Exact integer sums leave only
    the rounding of 8-bit codes (well under 1%); a saturating kernel returned about half the sum on
    an AVX2-only CPU (relative error 0.44 with int8 weights)."""
    import onnxruntime as ort

    from hybridllm.cache.prepare import quantize

    rng = np.random.default_rng(0)
    weights = rng.uniform(0.9, 1.0, size=(384, 8))
    fp32, int8 = tmp_path / "model.onnx", tmp_path / "model.int8.onnx"
    _matmul_model(fp32, weights)
    quantize(fp32, int8)
    x = rng.uniform(0.9, 1.0, size=(4, 384)).astype(np.float32)
    want = x.astype(np.float64) @ weights
    (got,) = ort.InferenceSession(str(int8), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.max(np.abs(got - want) / want) < 0.01


def test_prepared_int8_graphs_hold_uint8_weights(tmp_path: Path, minilm_dir: Path) -> None:
    import onnx

    from hybridllm.cache.prepare import INT8_NAME, prepare_embedder

    out = prepare_embedder(source_dir=minilm_dir, out_dir=tmp_path / "embedder", notice=lambda _: None)
    graph = onnx.load(str(out / INT8_NAME)).graph
    types = {init.name: init.data_type for init in graph.initializer}
    weight_inputs = [node.input[1] for node in graph.node if node.op_type == "MatMulInteger"]
    assert len(weight_inputs) >= 6 * 5  # q, k, v, attention out, FFN up in each of 6 layers
    assert {types[name] for name in weight_inputs} == {onnx.TensorProto.UINT8}


def test_a_folder_of_the_old_recipe_is_prepared_again(tmp_path: Path, minilm_dir: Path) -> None:
    """A folder prepared before the recipe file (int8 weights) is rebuilt once, in place, and a
    reranker's logit ranges of the replaced graphs go with it; a current folder is left alone."""
    from hybridllm.cache.prepare import (
        INT8_NAME,
        LOGIT_RANGE_NAME,
        RECIPE,
        RECIPE_NAME,
        is_prepared,
        prepare_embedder,
    )

    said: list[str] = []
    out = prepare_embedder(source_dir=minilm_dir, out_dir=tmp_path / "embedder", notice=said.append)
    assert (out / RECIPE_NAME).read_text(encoding="utf-8") == RECIPE and is_prepared(out)
    built = (out / INT8_NAME).stat().st_mtime_ns
    assert prepare_embedder(source_dir=minilm_dir, out_dir=out, notice=said.append) == out
    assert len(said) == 2 and (out / INT8_NAME).stat().st_mtime_ns == built  # nothing done again

    (out / RECIPE_NAME).unlink()  # as a folder prepared before 2026-12-02 is
    (out / LOGIT_RANGE_NAME).write_text('{"model.int8.onnx": [-1, 1]}', encoding="utf-8")
    assert not is_prepared(out)
    prepare_embedder(source_dir=minilm_dir, out_dir=out, notice=said.append)
    assert said[2] == "Preparing the semantic cache embedder (once) ..." and len(said) == 4
    assert is_prepared(out) and not (out / LOGIT_RANGE_NAME).exists()
    assert not list(out.glob(".*.tmp"))

    (out / RECIPE_NAME).write_text("int8 v1\n", encoding="utf-8")  # another recipe
    assert not is_prepared(out)


def test_training_embeddings_on_disk_are_reused_only_with_their_embedder(tmp_path: Path) -> None:
    """Before, ``cache.train`` kept the QQP questions' vectors under a name of the texts alone, so
    after the embedder changed (a new quantization recipe) the verifier trained on the old vectors."""
    from hybridllm.cache import get_embedder
    from hybridllm.cache.train import embed_texts

    texts = ["How do I learn Python?", "What is the capital of France?"]
    embedder = get_embedder()
    right = embedder.embed(texts)
    stale = tmp_path / "qqp.npz"
    np.savez(stale, texts=np.array(texts), vecs=np.zeros((2, 384), np.float32))  # no fingerprint
    said: list[str] = []
    got = embed_texts(texts, cache_file=stale, say=said.append)
    np.testing.assert_array_equal(np.stack([got[t] for t in texts]), right)
    assert not said  # embedded again, not read
    with np.load(stale) as data:  # and kept with the embedder's fingerprint
        assert str(data["embedder"]) == embedder.fingerprint
        np.testing.assert_array_equal(data["vecs"], right)
    np.savez(stale, texts=np.array(texts), vecs=np.ones((2, 384), np.float32), embedder="0" * 12)
    np.testing.assert_array_equal(embed_texts(texts, cache_file=stale, say=said.append)[texts[0]], right[0])
    np.savez(stale, texts=np.array(texts), vecs=np.ones((2, 384), np.float32), embedder=embedder.fingerprint)
    assert embed_texts(texts, cache_file=stale, say=said.append)[texts[0]].sum() == 384  # this one is read
    assert said == [f"embeddings from {stale}"]
