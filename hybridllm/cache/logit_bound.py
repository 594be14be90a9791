"""The range the cache reranker's logit can take, whatever the pair: read off its ONNX graph.

The reranker ends in ``head(mean over real tokens of LayerNorm(x))``. A LayerNorm output is
``gamma * z + beta`` with ``z`` of mean 0 and ``|z|^2 = n * var / (var + eps) <= n`` (``n`` the
hidden size), and a mean over tokens keeps both (a convex combination), so with the head's weight
``w`` and bias ``b``::

    logit = (w * gamma) . z + w . beta + b,   |(w * gamma) . z| <= sqrt(n) * |P(w * gamma)|

where ``P`` removes the mean (``z`` has none; Cauchy-Schwarz on what is left). The int8 graph also
rounds the pooled vector to a uint8 grid before the head: a step of at most ``2 * max_d m_d / 255``
with ``m_d = |gamma_d| * sqrt(n - 1) + |beta_d|`` (no element of ``z`` exceeds ``sqrt(n - 1)``),
each element moved by at most one step, so the logit by at most ``step * sum |w|``.

Nothing before the last LayerNorm matters, int8 rounding included: the range holds for every input.
A graph whose end is not this shape gives None (and the verifier then scores every pair).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

_FLOAT_MARGIN = 1e-3  # relative: float32 rounding in the graph's last ops, far below this


def logit_range(path: str | Path) -> tuple[float, float] | None:
    """(lowest, highest) logit the reranker graph at ``path`` can output; None when unknown."""
    try:
        import onnx

        model = onnx.load(str(path))
    except Exception:  # noqa: BLE001 - no range: every pair is scored, as without it
        return None
    return graph_logit_range(model)


def graph_logit_range(model: Any) -> tuple[float, float] | None:
    """:func:`logit_range` of a loaded ``onnx.ModelProto``."""
    try:
        return _Reader(model).logit_range()
    except (KeyError, ValueError, IndexError):
        return None


class _Reader:
    """Walks back from the graph's output through the head and the pooling to the last LayerNorm."""

    def __init__(self, model: Any) -> None:
        from onnx import numpy_helper

        self._to_array = numpy_helper.to_array
        self._made_by = {out: node for node in model.graph.node for out in node.output}
        self._inits = {t.name: t for t in model.graph.initializer}

    def _node(self, name: str, op_type: str) -> Any:
        node = self._made_by[name]
        if node.op_type != op_type:
            raise ValueError(f"{name} comes from {node.op_type}, not {op_type}")
        return node

    def _const(self, name: str) -> np.ndarray:
        return np.asarray(self._to_array(self._inits[name]), dtype=np.float64)

    def _split(self, node: Any) -> tuple[str, np.ndarray]:
        """(the computed input, the constant one) of a two-input node."""
        a, b = node.input
        return (a, self._const(b)) if b in self._inits else (b, self._const(a))

    def logit_range(self) -> tuple[float, float]:
        output = self._made_by["output"]
        if output.op_type == "Squeeze":
            output = self._made_by[output.input[0]]
        w, b, pooled, quantized = self._head(output)
        gamma, beta = self._pooled_layer_norm(pooled)
        n = len(gamma)
        if w.shape != (n,) or beta.shape != (n,) or np.ndim(b) > 1 or np.size(b) != 1:
            raise ValueError("the head is not one logit over the hidden size")
        scaled = w * gamma
        radius = math.sqrt(n) * float(np.linalg.norm(scaled - scaled.mean()))
        if quantized:
            step = 2.0 * float(np.max(np.abs(gamma) * math.sqrt(n - 1) + np.abs(beta))) / 255.0
            radius += step * float(np.abs(w).sum())
        center = float(w @ beta) + float(np.reshape(b, -1)[0])
        radius += _FLOAT_MARGIN * (1.0 + radius + abs(center))
        if not math.isfinite(center) or not math.isfinite(radius):
            # a NaN or inf weight: a NaN range would skip every pair (no hit ever), so no range
            raise ValueError("the head or the pooled LayerNorm holds a NaN or an infinity")
        return center - radius, center + radius

    def _head(self, node: Any) -> tuple[np.ndarray, np.ndarray, str, bool]:
        """(weight ``[n]``, bias, the pooled input's name, whether the pooled input is int8)."""
        if node.op_type == "Gemm":  # the fp32 graph
            attrs = {a.name: a for a in node.attribute}
            if any(k in attrs and attrs[k].f != 1.0 for k in ("alpha", "beta")) or (
                "transA" in attrs and attrs["transA"].i
            ):
                raise ValueError("a Gemm with alpha, beta or transA")
            w = self._const(node.input[1])
            w = w if "transB" in attrs and attrs["transB"].i else w.T  # -> [1, n]
            if w.shape[0] != 1:
                raise ValueError("the head has more than one output")
            return w[0], self._const(node.input[2]), node.input[0], False
        # the int8 graph: Add(Mul(Cast(MatMulInteger(q(pooled), w_q)), x_scale * w_scale), bias)
        if node.op_type != "Add":
            raise ValueError(f"the head ends in {node.op_type}")
        product, bias = self._split(node)
        scaled = self._node(product, "Mul")
        cast_out, scales = scaled.input
        if self._made_by[cast_out].op_type != "Cast":
            cast_out, scales = scales, cast_out
        matmul = self._node(self._node(cast_out, "Cast").input[0], "MatMulInteger")
        quantize = self._node(matmul.input[0], "DynamicQuantizeLinear")
        x_scale, w_scale = self._split(self._node(scales, "Mul"))
        if x_scale != quantize.output[1]:
            raise ValueError("the head's scale is not the pooled vector's")
        w_q = self._const(matmul.input[1])  # [n, 1]
        w_zero = self._const(matmul.input[3]) if len(matmul.input) > 3 and matmul.input[3] else 0.0
        w = (w_q - w_zero) * w_scale
        if w.ndim != 2 or w.shape[1] != 1:
            raise ValueError("the head has more than one output")
        return w[:, 0], bias, quantize.input[0], True

    def _pooled_layer_norm(self, pooled: str) -> tuple[np.ndarray, np.ndarray]:
        """(gamma, beta) of the LayerNorm that ``pooled`` averages: Div(ReduceSum(Mul(LN, mask)), count)."""
        summed = self._node(self._node(pooled, "Div").input[0], "ReduceSum")
        masked = self._node(summed.input[0], "Mul")
        for name in masked.input:
            node = self._made_by.get(name)
            if node is not None and node.op_type == "LayerNormalization":
                axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
                if axis != -1:
                    raise ValueError("a LayerNorm over another axis than the hidden one")
                return self._const(node.input[1]), self._const(node.input[2])
        raise ValueError("the pooled states are not a LayerNorm's")
