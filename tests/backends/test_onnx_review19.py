"""The ONNX backend (helper-r4, review 19): a model folder whose graph the runtime cannot feed is
refused at load with a message naming the inputs/outputs, and the sampler's ties and non-finite
logits have one defined outcome. Tiny graphs built with ``onnx.helper``; ONNX Runtime GenAI is a
fake (no model is run)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from hybridllm import EdgeError, GenerationParams, ModelCorruptError
from hybridllm.backends.onnx_sampling import _sample

from .test_onnx_review18 import _FakeOg, _tokenizer_json

V, D = 8, 4


def _graph(folder, *, past="past_key_values.%d", extra=None, position=False, logits="logits"):
    """A one-layer decoder: logits = E[input_ids], present = concat(past, K[input_ids])."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.RandomState(0)
    weights = [numpy_helper.from_array(rng.randn(V, V).astype(np.float32), "E"),
               numpy_helper.from_array(rng.randn(V, D).astype(np.float32), "K"),
               numpy_helper.from_array(np.array([1], dtype=np.int64), "axis")]
    key, value = f"{past}.key" % 0, f"{past}.value" % 0
    nodes = [helper.make_node("Gather", ["E", "input_ids"], [logits]),
             helper.make_node("Gather", ["K", "input_ids"], ["k3"]),
             helper.make_node("Unsqueeze", ["k3", "axis"], ["k4"]),
             helper.make_node("Concat", [key, "k4"], ["present.0.key"], axis=2),
             helper.make_node("Concat", [value, "k4"], ["present.0.value"], axis=2)]
    kv = ["b", 1, "p", D]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "t"]),
              helper.make_tensor_value_info(key, TensorProto.FLOAT, kv),
              helper.make_tensor_value_info(value, TensorProto.FLOAT, kv)]
    if position:
        inputs.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["b", "s"]))
    if extra:
        inputs.append(helper.make_tensor_value_info(extra, TensorProto.FLOAT, ["b"]))
        nodes[0].output[0] = "raw"  # logits = raw + extra, so the graph needs it
        nodes.append(helper.make_node("Reshape", [extra, "shape"], ["e3"]))
        nodes.append(helper.make_node("Add", ["raw", "e3"], [logits]))
        weights.append(numpy_helper.from_array(np.array([-1, 1, 1], dtype=np.int64), "shape"))
    outputs = [helper.make_tensor_value_info(logits, TensorProto.FLOAT, ["b", "s", V]),
               helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT, ["b", 1, "t", D]),
               helper.make_tensor_value_info("present.0.value", TensorProto.FLOAT, ["b", 1, "t", D])]
    model = helper.make_model(helper.make_graph(nodes, "tiny", inputs, outputs, weights),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, folder / "model.onnx")


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime_genai", _FakeOg())
    decoder = {"filename": "model.onnx", "head_size": D, "hidden_size": D, "num_attention_heads": 1,
               "num_key_value_heads": 1, "num_hidden_layers": 1,
               "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                          "past_key_names": "past_key_values.%d.key",
                          "past_value_names": "past_key_values.%d.value"},
               "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                           "present_value_names": "present.%d.value"}}
    (tmp_path / "genai_config.json").write_text(json.dumps({"model": {
        "context_length": 64, "bos_token_id": 1, "eos_token_id": [2], "decoder": decoder}}))
    (tmp_path / "tokenizer.json").write_text(_tokenizer_json())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return tmp_path


def _backend(folder):
    from hybridllm.backends.onnx import OnnxBackend

    return OnnxBackend(str(folder), huge_pages=False, chat_format="completion")


@pytest.mark.parametrize("graph", [{}, {"position": True}])
def test_a_graph_the_config_describes_loads(folder, graph):
    """Our builder's names, and position_ids (the runtime feeds it by default)."""
    _graph(folder, **graph)
    _backend(folder).close()


@pytest.mark.parametrize("graph, says", [
    # the real runtime: "Missing Input: past.0.value" on every request
    ({"past": "past.%d"}, "lacks the inputs past_key_values.0.key, past_key_values.0.value; it takes "
                          "inputs nothing feeds: past.0.key, past.0.value"),
    ({"extra": "temperature_scale"}, "takes inputs nothing feeds: temperature_scale"),
    # the real runtime: "Model output was not found: logits" on every request
    ({"logits": "lm_logits"}, "lacks the outputs logits"),
])
def test_a_foreign_graph_is_refused_at_load_naming_what_differs(folder, graph, says):
    """Before: the folder loaded, and every request then failed with the runtime's raw error."""
    _graph(folder, **graph)
    with pytest.raises(ModelCorruptError) as err:
        _backend(folder)
    text = str(err.value)
    assert says in text
    assert "model.onnx" in text and "genai_config.json" in text and "model.decoder.inputs" in text
    assert "hybridllm models prepare" in text


def test_a_graph_input_named_in_the_config_is_fed(folder):
    """An input of the graph's own that genai_config.json names is the runtime's to feed."""
    _graph(folder, extra="past_sequence_length")
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["decoder"]["inputs"]["past_sequence_length"] = "past_sequence_length"
    (folder / "genai_config.json").write_text(json.dumps(config))
    _backend(folder).close()


def test_a_config_naming_the_graphs_own_kv_inputs_loads(folder):
    _graph(folder, past="past.%d")
    config = json.loads((folder / "genai_config.json").read_text())
    names = config["model"]["decoder"]["inputs"]
    names.update(past_key_names="past.%d.key", past_value_names="past.%d.value")
    (folder / "genai_config.json").write_text(json.dumps(config))
    _backend(folder).close()


def test_an_unparsable_graph_is_left_to_the_runtime(folder):
    """A truncated model.onnx is the runtime's load error (a ModelCorruptError naming the folder)."""
    _graph(folder)
    data = (folder / "model.onnx").read_bytes()
    (folder / "model.onnx").write_bytes(data[: len(data) // 2])
    from hybridllm.backends.onnx_folder import _check_graph_io, _graph_io

    assert _graph_io(folder / "model.onnx") is None
    _check_graph_io(folder)  # nothing to say: ONNX Runtime's own load reports it


# --- sampling --------------------------------------------------------------------------------


def _p(**kw):
    return GenerationParams(**{"temperature": 1.0, "top_p": 1.0, "top_k": 0, **kw})


@pytest.mark.parametrize("top_k, kept", [(1, {3}), (2, {3, 7})])
def test_top_k_keeps_the_lowest_ids_of_equal_logits(top_k, kept):
    """Before: which of the tied tokens survived top-k was argpartition's pick (the highest id)."""
    row = np.zeros(16, dtype=np.float32)
    row[[3, 7, 11]] = 5.0
    picks = {_sample(row, _p(top_k=top_k), seed, 0, []) for seed in range(200)}
    assert picks == kept


def test_greedy_ties_pick_the_lowest_id():
    row = np.zeros(16, dtype=np.float32)
    row[[9, 4]] = 2.0
    assert _sample(row, _p(temperature=0.0), 0, 0, []) == 4


def test_top_p_on_ties_is_cut_in_id_order():
    """Four equal tokens, top_p 0.5: the two lowest ids (the cumulative sum in id order)."""
    row = np.full(8, -1e9, dtype=np.float32)
    row[[6, 1, 5, 2]] = 1.0
    picks = {_sample(row, _p(top_p=0.5), seed, 0, []) for seed in range(200)}
    assert picks == {1, 2}


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_nan_logits_are_an_edge_error(temperature):
    """Before: a traceback (argmax of an empty sequence), or at temperature 0 the NaN's token."""
    row = np.zeros(8, dtype=np.float32)
    row[5] = np.nan
    with pytest.raises(EdgeError, match="NaN logits"):
        _sample(row, _p(temperature=temperature), 0, 0, [])


def test_all_minus_inf_is_an_edge_error():
    with pytest.raises(EdgeError, match="-inf"):
        _sample(np.full(8, -np.inf, dtype=np.float32), _p(), 0, 0, [])


@pytest.mark.parametrize("temperature, top_p", [(0.0, 1.0), (0.8, 1.0), (0.8, 0.5)])
def test_plus_inf_tokens_are_certain(temperature, top_p):
    row = np.zeros(8, dtype=np.float32)
    row[[2, 6]] = np.inf
    row[0] = -np.inf
    picks = {_sample(row, _p(temperature=temperature, top_p=top_p), s, 0, []) for s in range(100)}
    assert picks <= {2, 6} and (temperature == 0.0 or top_p < 1.0 or picks == {2, 6})


def test_the_backend_reports_nan_logits_as_an_edge_error(folder, monkeypatch):
    """Through the backend: not a raw ValueError from numpy mid-stream; and +inf gives a log
    probability, not NaN."""
    _graph(folder)

    class Gen:
        row = np.zeros(8, dtype=np.float32)

        def append_tokens(self, tokens):
            pass

        def get_logits(self):
            return Gen.row[None, None, :]

    og = sys.modules["onnxruntime_genai"]
    monkeypatch.setattr(og, "Generator", lambda model, params: Gen(), raising=False)
    edge = _backend(folder)
    Gen.row = np.array([0, 0, 0, 0, np.inf, 0, 0, 0], dtype=np.float32)
    out = list(edge.stream([{"role": "user", "content": "hi"}],
                           GenerationParams(max_tokens=1, temperature=0.5, logprobs=True)))
    assert [d.logprob for d in out if d.logprob is not None] == [0.0]
    Gen.row = np.array([np.nan] * 8, dtype=np.float32)
    with pytest.raises(EdgeError, match="NaN logits"):
        list(edge.stream([{"role": "user", "content": "hi there"}],
                         GenerationParams(max_tokens=3, temperature=0.0)))



# --- load order and what a failed load keeps -----------------------------------------------------


class _Weights:
    """Stands for the loaded model (a weakref tells whether anything still holds it)."""


def test_a_damaged_prompt_file_is_reported_before_the_weights_load(folder, monkeypatch):
    """Before: the model loaded first (seconds, gigabytes), then tokenizer.json was read."""
    _graph(folder)
    loads = []
    monkeypatch.setattr(sys.modules["onnxruntime_genai"], "Model", lambda config: loads.append(1))
    (folder / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelCorruptError, match="tokenizer.json"):
        _backend(folder)
    (folder / "tokenizer.json").write_text(_tokenizer_json())
    (folder / "genai_config.json").write_text('{"model": [1]}')
    with pytest.raises(ModelCorruptError, match="genai_config.json"):
        _backend(folder)
    assert loads == []


def test_a_failed_load_does_not_keep_the_weights_alive(folder, monkeypatch):
    """The error's traceback holds the half-made backend; before, a caller that kept the error
    (logged, or stored to report later) kept the loaded model with it."""
    import gc
    import weakref

    _graph(folder)
    og = sys.modules["onnxruntime_genai"]
    made = []

    def model(config):
        made.append(weakref.ref(weights := _Weights()))
        return weights

    def tokenizer(model):
        del model  # the runtime's C++ frame holds nothing past the raise; this one must not either
        raise RuntimeError("tokenizer: unsupported model type")

    monkeypatch.setattr(og, "Model", model)
    monkeypatch.setattr(og, "Tokenizer", tokenizer)
    with pytest.raises(ModelCorruptError, match="could not load") as err:
        _backend(folder)
    gc.collect()
    assert err.value.__traceback__ is not None and made[0]() is None
