"""A preparer killed part way leaves its temporary files (the fp32 and int8 graphs, about 120 MB
for MiniLM) under names no later process used: the next preparer, holding the lock, removes them."""

from __future__ import annotations

import shutil

import pytest

from hybridllm.cache import prepare


def _tiny_graph(_src):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((2, 2), np.float32), "w")
    node = helper.make_node("MatMul", ["x", "w"], ["output"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 2])], [w])
    return helper.make_model(graph)


def test_a_killed_preparers_temporary_files_are_removed(tmp_path, monkeypatch):
    pytest.importorskip("onnx")
    monkeypatch.setattr(prepare, "quantize", lambda src, dst: shutil.copyfile(src, dst))
    src = tmp_path / "src"
    src.mkdir()
    (src / prepare.TOKENIZER_NAME).write_text("{}")
    out = tmp_path / "out"
    out.mkdir()
    stale = [out / f".{name}.999999999.tmp" for name in (prepare.FP32_NAME, prepare.INT8_NAME)]
    for path in stale:
        path.write_bytes(b"\0" * 1000)  # what a preparer killed by the OOM killer or Ctrl-C left
    (out / "notes.txt").write_text("mine")
    prepare._prepare(out, "embedder", _tiny_graph, source_dir=src, notice=lambda _: None)
    assert prepare.is_prepared(out)
    assert not any(p.exists() for p in stale)
    assert not list(out.glob("*.tmp"))
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("stored", ['{"model.int8.onnx": [NaN, NaN]}', '{"model.int8.onnx": [3.0, -3.0]}'])
def test_a_damaged_logit_range_is_read_off_the_graphs_again(tmp_path, monkeypatch, stored):
    # a range of NaN made every pair "unable to reach the threshold": the cache never hit, silently
    from hybridllm.cache import logit_bound

    monkeypatch.setattr(logit_bound, "logit_range", lambda path: (-7.0, 9.0))
    (tmp_path / prepare.INT8_NAME).write_bytes(b"graph")
    (tmp_path / prepare.LOGIT_RANGE_NAME).write_text(stored)
    assert prepare.logit_ranges(tmp_path) == {prepare.INT8_NAME: (-7.0, 9.0)}
