"""The ONNX graph of a BERT encoder, built from numpy weights with ``onnx``'s helpers (no torch).

MiniLM-L6 is a 6-layer BERT. Two graphs are built on it, both taking
``(input_ids, attention_mask, token_type_ids)``, each ``[batch, seq]`` int64:

- the sentence embedder: mean pooling over real tokens, then L2 normalization -> ``[batch, 384]``;
- the cache reranker (a cross-encoder): mean pooling, one linear layer -> ``[batch]`` logits.

Weights use this module's names (``word.weight``, ``layers.0.query.weight``...; the reranker's
carry an ``encoder.`` prefix and add ``head.weight``/``head.bias``); :func:`remap` converts
Hugging Face BERT names. The PyTorch reference in :mod:`.export` uses the same names and math, and a
test checks that the two agree.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

OPSET = 17  # LayerNormalization is a standard op from 17
IR_VERSION = 8  # the IR of opset 17: read by every ONNX Runtime that runs opset 17
ATTENTION_MASK_BIAS = -1e4  # added to the scores of padded keys, as BERT does

_EMBEDDING_NAMES = {
    "embeddings.word_embeddings.weight": "word.weight",
    "embeddings.position_embeddings.weight": "position.weight",
    "embeddings.token_type_embeddings.weight": "token_type.weight",
    "embeddings.LayerNorm.weight": "emb_norm.weight",
    "embeddings.LayerNorm.bias": "emb_norm.bias",
}
_LAYER_NAMES = {
    "attention.self.query": "query",
    "attention.self.key": "key",
    "attention.self.value": "value",
    "attention.output.dense": "attn_out",
    "attention.output.LayerNorm": "attn_norm",
    "intermediate.dense": "up",
    "output.dense": "down",
    "output.LayerNorm": "out_norm",
}


def remap(weights: dict[str, Any]) -> dict[str, Any]:
    """Hugging Face BERT names -> this module's names (the pooler, unused by mean pooling, is dropped)."""
    out: dict[str, Any] = {}
    for key, tensor in weights.items():
        key = key.removeprefix("bert.")
        if key in _EMBEDDING_NAMES:
            out[_EMBEDDING_NAMES[key]] = tensor
        elif key.startswith("encoder.layer."):
            _, _, idx, rest = key.split(".", 3)
            module, param = rest.rsplit(".", 1)
            if module in _LAYER_NAMES:
                out[f"layers.{idx}.{_LAYER_NAMES[module]}.{param}"] = tensor
    return out


def read_config(model_dir: Path) -> dict:
    return json.loads((Path(model_dir) / "config.json").read_text())


def read_base_weights(model_dir: Path) -> dict[str, np.ndarray]:
    """The base model's float32 weights under this module's names (safetensors, read by numpy)."""
    from safetensors.numpy import load_file

    return {
        k: np.asarray(v, dtype=np.float32)
        for k, v in remap(load_file(str(model_dir / "model.safetensors"))).items()
    }


class _Graph:
    """Collects nodes and initializers; every node output gets a unique name."""

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.weights = weights
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._count = 0

    def const(self, name: str, value: Any, dtype: Any = np.float32) -> str:
        self.initializers.append(self.numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def weight(self, name: str, *, transpose: bool = False) -> str:
        w = np.asarray(self.weights[name], dtype=np.float32)
        return self.const(name, np.ascontiguousarray(w.T) if transpose else w)

    def op(
        self, op_type: str, inputs: list[str], scope: str, *, output: str | None = None, **attrs: Any
    ) -> str:
        self._count += 1
        out = output or f"{scope}/{op_type}_{self._count}_output"
        self.nodes.append(
            self.helper.make_node(op_type, inputs, [out], name=f"{scope}/{op_type}_{self._count}", **attrs)
        )
        return out

    def linear(self, x: str, prefix: str, scope: str) -> str:
        """``x @ W.T + b`` for a PyTorch-style ``[out, in]`` weight; the MatMul's scope names it."""
        y = self.op("MatMul", [x, self.weight(f"{prefix}.weight", transpose=True)], scope)
        return self.op("Add", [y, self.weight(f"{prefix}.bias")], scope)

    def layer_norm(self, x: str, prefix: str, scope: str, eps: float) -> str:
        scale, bias = self.weight(f"{prefix}.weight"), self.weight(f"{prefix}.bias")
        return self.op("LayerNormalization", [x, scale, bias], scope, axis=-1, epsilon=eps)


def _encoder_layer(g: _Graph, x: str, bias: str, p: str, i: int, cfg: dict, consts: dict[str, str]) -> str:
    """One BERT layer on ``x`` ``[b, t, hidden]``; ``bias`` ``[b, 1, 1, t]`` masks padded keys."""
    eps = cfg.get("layer_norm_eps", 1e-12)
    scope = f"/layers.{i}"
    split = consts["split_heads"]  # [0, 0, heads, head_dim]: 0 keeps the input's dimension

    def heads(name: str, perm: list[int]) -> str:  # [b, t, h*d] -> [b, h, t, d] or [b, h, d, t]
        y = g.linear(x, f"{p}layers.{i}.{name}", f"{scope}/{name}")
        return g.op("Transpose", [g.op("Reshape", [y, split], scope)], scope, perm=perm)

    q, k, v = heads("query", [0, 2, 1, 3]), heads("key", [0, 2, 3, 1]), heads("value", [0, 2, 1, 3])
    # scores = q k^T / sqrt(head_dim) + mask bias; probs = softmax over keys; ctx = probs v
    scores = g.op("Mul", [g.op("MatMul", [q, k], f"{scope}/scores"), consts["inv_sqrt_d"]], scope)
    probs = g.op("Softmax", [g.op("Add", [scores, bias], scope)], scope, axis=-1)  # [b, h, t, t]
    ctx = g.op("Transpose", [g.op("MatMul", [probs, v], f"{scope}/context")], scope, perm=[0, 2, 1, 3])
    ctx = g.op("Reshape", [ctx, consts["merge_heads"]], scope)  # [b, t, hidden]
    attn = g.linear(ctx, f"{p}layers.{i}.attn_out", f"{scope}/attn_out")
    x = g.layer_norm(g.op("Add", [x, attn], scope), f"{p}layers.{i}.attn_norm", f"{scope}/attn_norm", eps)
    # exact (erf) GELU, BERT's "gelu": 0.5 * u * (1 + erf(u / sqrt(2)))
    u = g.linear(x, f"{p}layers.{i}.up", f"{scope}/up")
    erf = g.op("Erf", [g.op("Div", [u, consts["sqrt2"]], scope)], scope)
    act = g.op(
        "Mul", [g.op("Mul", [u, g.op("Add", [erf, consts["one"]], scope)], scope), consts["half"]], scope
    )
    down = g.linear(act, f"{p}layers.{i}.down", f"{scope}/down")
    return g.layer_norm(g.op("Add", [x, down], scope), f"{p}layers.{i}.out_norm", f"{scope}/out_norm", eps)


def _mean_pooled(g: _Graph, cfg: dict, p: str) -> tuple[str, dict[str, str]]:
    """``[b, hidden]``: the last layer's states averaged over real (unpadded) tokens."""
    hidden, num_heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = hidden // num_heads
    consts = {
        "split_heads": g.const("split_heads", [0, 0, num_heads, head_dim], np.int64),
        "merge_heads": g.const("merge_heads", [0, 0, hidden], np.int64),
        "inv_sqrt_d": g.const("inv_sqrt_d", 1.0 / math.sqrt(head_dim)),
        "sqrt2": g.const("sqrt2", math.sqrt(2.0)),
        "one": g.const("one", 1.0),
        "half": g.const("half", 0.5),
    }
    s = "/embeddings"
    # x = LayerNorm(word[ids] + position[0..t) + token_type[types])  [b, t, hidden]
    seq_len = g.op("Gather", [g.op("Shape", ["input_ids"], s), g.const("one_i", 1, np.int64)], s, axis=0)
    positions = g.op("Range", [g.const("zero_i", 0, np.int64), seq_len, "one_i"], s)  # [t]
    x = g.op("Gather", [g.weight(f"{p}word.weight"), "input_ids"], s)
    x = g.op("Add", [x, g.op("Gather", [g.weight(f"{p}position.weight"), positions], s)], s)
    x = g.op("Add", [x, g.op("Gather", [g.weight(f"{p}token_type.weight"), "token_type_ids"], s)], s)
    x = g.layer_norm(x, f"{p}emb_norm", f"{s}/norm", cfg.get("layer_norm_eps", 1e-12))
    mask = g.op("Cast", ["attention_mask"], "/mask", to=1)  # [b, t] float
    keep = g.op("Sub", ["one", mask], "/mask")
    bias = g.op("Mul", [keep, g.const("mask_bias", ATTENTION_MASK_BIAS)], "/mask")
    bias = g.op("Unsqueeze", [bias, g.const("axes_1_2", [1, 2], np.int64)], "/mask")  # [b, 1, 1, t]
    for i in range(cfg["num_hidden_layers"]):
        x = _encoder_layer(g, x, bias, p, i, cfg, consts)
    # pooled = sum_t(x * mask) / max(sum_t(mask), 1e-9)
    mask3 = g.op("Unsqueeze", [mask, g.const("axes_2", [2], np.int64)], "/pool")  # [b, t, 1]
    axis1 = g.const("axes_1", [1], np.int64)
    summed = g.op("ReduceSum", [g.op("Mul", [x, mask3], "/pool"), axis1], "/pool", keepdims=0)
    count = g.op("ReduceSum", [mask, axis1], "/pool", keepdims=1)  # [b, 1]
    count = g.op("Max", [count, g.const("tiny_count", 1e-9)], "/pool")
    return g.op("Div", [summed, count], "/pool"), consts


def _model(g: _Graph, output_shape: list[str | int], name: str) -> Any:
    from onnx import TensorProto, checker

    h = g.helper
    inputs = [
        h.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
        for n in ("input_ids", "attention_mask", "token_type_ids")
    ]
    outputs = [h.make_tensor_value_info("output", TensorProto.FLOAT, output_shape)]
    graph = h.make_graph(g.nodes, name, inputs, outputs, initializer=g.initializers)
    model = h.make_model(
        graph, opset_imports=[h.make_opsetid("", OPSET)], producer_name="hybridllm", ir_version=IR_VERSION
    )
    checker.check_model(model)
    return model


def sentence_encoder(cfg: dict, weights: dict[str, np.ndarray]) -> Any:
    """The embedder's ``onnx.ModelProto``: ``[batch, hidden]`` L2-normalized mean-pooled states."""
    g = _Graph(weights)
    pooled, _ = _mean_pooled(g, cfg, "")
    # output = pooled / max(||pooled||_2, 1e-12)
    norm = g.op("ReduceL2", [pooled], "/normalize", axes=[-1], keepdims=1)
    norm = g.op("Max", [norm, g.const("tiny_norm", 1e-12)], "/normalize")
    g.op("Div", [pooled, norm], "/normalize", output="output")
    return _model(g, ["batch", cfg["hidden_size"]], "sentence_encoder")


def cross_encoder(cfg: dict, weights: dict[str, np.ndarray]) -> Any:
    """The reranker's ``onnx.ModelProto``: ``[batch]`` logits, ``head(mean_pooled(...))``."""
    g = _Graph(weights)
    pooled, _ = _mean_pooled(g, cfg, "encoder.")
    logit = g.op(
        "Gemm", [pooled, g.weight("head.weight"), g.weight("head.bias")], "/head", transB=1
    )  # [b, 1]
    g.op("Squeeze", [logit, g.const("axes_1_sq", [1], np.int64)], "/head", output="output")
    return _model(g, ["batch"], "cross_encoder")
