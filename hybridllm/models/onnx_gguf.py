"""Write the GGUF's own quantized blocks into an ONNX model's MatMulNBits weights (build time).

ONNX Runtime GenAI's builder quantizes fp32 weights itself (round to nearest). Our fp32 weights
are the GGUF's 4- to 8-bit blocks dequantized, so quantizing them again rounds twice; on
SmolLM2-135M (Q4_1) the int4 build then agreed with fp32 on only 64-69% of greedy argmax
positions. Instead, after the builder has written the graph, every MatMulNBits weight (and the
quantized embedding table) is replaced by the GGUF tensor's own blocks, so the ONNX model computes
with exactly the weights llama.cpp uses:

    MatMulNBits:  w = scale * (q - zero_point),  q unsigned, zero_point an integer (uint8)

    Q4_0   w = d (q - 8)                   -> 4 bits, block 32, zero point 8         exact
    Q4_1   w = d q + m                     -> 4 bits, block 32, zero point round(-m/d)
    Q4_K   w = d sc q - dmin mn  (per 32)  -> 4 bits, block 32, zero point round(...)
    Q5_0   w = d (q - 16), q 5-bit         -> 8 bits, block 32, zero point 16        exact
    Q8_0   w = d q, q int8                 -> 8 bits, block 32, zero point 128       exact
    Q6_K   w = d sc (q - 32)  (per 16)     -> 8 bits, block 16, zero point 32        exact

A block with a real-valued minimum (Q4_1, Q4_K) is not on an integer zero point's grid: the
rest, ``r = m + d * zero_point`` per block, is added back exactly by a small side product,

    y = MatMulNBits(x) + blocksum(x) @ R      blocksum(x)[b] = sum of x over block b   # [.., K/32]

(ONNX Runtime's float zero points would express it directly, but its CPU kernel then dequantizes
the whole matrix on every call: 90x slower measured.) Tensors stored wider than 8 bits (F16, F32)
get 8-bit round-to-nearest. The parts of a fused node (q, k, v in one MatMul) share the widest
bit width and the smallest block of their parts, which every format above converts to exactly.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from ._gguf_blocks import Blocks, gguf_blocks, rtn8
from ._gguf_blocks import decode as decode  # re-exported: `from .onnx_gguf import decode` keeps working

# The builder's node names -> the GGUF tensors whose rows they hold, in order
_NODE = re.compile(r"^/model/layers\.(\d+)/(attn|mlp)/(\w+)/MatMul")
_PARTS = {
    "qkv_proj": ("attn_q", "attn_k", "attn_v"),
    "q_proj": ("attn_q",),
    "k_proj": ("attn_k",),
    "v_proj": ("attn_v",),
    "o_proj": ("attn_output",),
    "gate_proj": ("ffn_gate",),
    "up_proj": ("ffn_up",),
    "down_proj": ("ffn_down",),
    "gate_up_proj": ("ffn_gate", "ffn_up"),
}


def gguf_architecture(gguf_path: Path) -> str:
    """The GGUF's ``general.architecture`` (its header only), "unknown" when unreadable."""
    from .gguf_header import read_gguf_metadata

    try:
        return str(read_gguf_metadata(gguf_path)["general.architecture"])
    except Exception:  # only for an error message: never hide the error it explains
        return "unknown"


def _stack(parts: list[Blocks]) -> Blocks:
    bits, block = max(p.bits for p in parts), min(p.block for p in parts)
    parts = [p.widen(bits, block) for p in parts]
    offsets = [p.offset for p in parts]
    offset = None
    if any(o is not None for o in offsets):
        offset = np.concatenate(
            [np.zeros_like(p.scale) if o is None else o for p, o in zip(parts, offsets, strict=True)]
        )
    return Blocks(
        np.concatenate([p.q for p in parts]),
        np.concatenate([p.scale for p in parts]),
        np.concatenate([p.zp for p in parts]),
        offset,
        bits,
        block,
    )


def _pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Values along the last axis, ``8 // bits`` per byte, the first in the low bits."""
    if bits == 8:
        return q.astype(np.uint8)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def rewrite(model_path: Path, gguf_path: Path) -> dict[str, int]:
    """Replace ``model_path``'s quantized weights by ``gguf_path``'s blocks, in place.

    Returns counts for the build record: MatMulNBits nodes at 4 and 8 bits, offset side products.
    """
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(model_path))
    graph = model.graph
    tensors, load = gguf_blocks(gguf_path)
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    new_inits: list[Any] = []
    new_nodes: list[tuple[int, list[Any]]] = []  # (insert after node index, nodes)
    sums: dict[tuple[str, int], str] = {}
    counts = {"matmul_4bit": 0, "matmul_8bit": 0, "offset_products": 0}
    head_blocks: Blocks | None = None
    head_names: tuple[str, str, str] | None = None
    for idx, node in enumerate(graph.node):
        if node.op_type != "MatMulNBits":
            continue
        match = _NODE.match(node.name)
        if match:
            layer, _, kind = match.groups()
            if kind not in _PARTS:
                raise NotImplementedError(f"no GGUF tensors known for {node.name}")
            blocks = _stack([load(f"blk.{layer}.{p}.weight") for p in _PARTS[kind]])
        elif node.name.startswith("/lm_head/"):
            blocks = head_blocks = load(head)
        else:
            raise NotImplementedError(f"no GGUF tensor known for {node.name}")
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        n, k = blocks.q.shape
        if (n, k) != (attrs["N"], attrs["K"]):
            raise ValueError(f"{node.name}: GGUF gives [{n}, {k}], the graph [{attrs['N']}, {attrs['K']}]")
        nb = k // blocks.block
        base = node.name.strip("/").replace("/", ".")
        b_name, s_name, z_name = f"{base}.gguf_q", f"{base}.gguf_scales", f"{base}.gguf_zp"
        q3 = blocks.q.reshape(n, nb, blocks.block)
        if blocks is head_blocks:
            head_names = (b_name, s_name, z_name)
        new_inits += [
            numpy_helper.from_array(_pack(q3, blocks.bits), b_name),
            numpy_helper.from_array(blocks.scale.astype(np.float32), s_name),
            numpy_helper.from_array(
                _pack(blocks.zp if blocks.bits == 8 else _pad_even(blocks.zp), blocks.bits), z_name
            ),
        ]
        x = node.input[0]
        del node.input[:]
        node.input.extend([x, b_name, s_name, z_name])
        for a in node.attribute:
            if a.name == "bits":
                a.i = blocks.bits
            elif a.name == "block_size":
                a.i = blocks.block
        counts[f"matmul_{blocks.bits}bit"] += 1
        if blocks.offset is not None:  # y += blocksum(x) @ R, R: [K / block, N]
            counts["offset_products"] += 1
            key = (x, blocks.block)
            extra = []
            if key not in sums:
                shape, sums[key] = f"{base}.gguf_sum_shape", f"{base}.gguf_blocksum"
                new_inits += [
                    numpy_helper.from_array(np.array([0, 0, nb, blocks.block], np.int64), shape),
                    numpy_helper.from_array(np.array([-1], np.int64), f"{base}.gguf_axes"),
                ]
                extra += [
                    helper.make_node(
                        "Reshape", [x, shape], [f"{base}.gguf_blocks"], name=f"{node.name}/GgufBlocks"
                    ),
                    helper.make_node(
                        "ReduceSum",
                        [f"{base}.gguf_blocks", f"{base}.gguf_axes"],
                        [sums[key]],
                        name=f"{node.name}/GgufBlockSum",
                        keepdims=0,
                    ),
                ]
            r_name, out = f"{base}.gguf_offsets", node.output[0]
            new_inits.append(numpy_helper.from_array(np.ascontiguousarray(blocks.offset.T), r_name))
            node.output[0] = f"{out}.gguf_main"
            extra += [
                helper.make_node(
                    "MatMul", [sums[key], r_name], [f"{out}.gguf_rest"], name=f"{node.name}/GgufRest"
                ),
                helper.make_node(
                    "Add", [f"{out}.gguf_main", f"{out}.gguf_rest"], [out], name=f"{node.name}/GgufAdd"
                ),
            ]
            new_nodes.append((idx, extra))
    _rewrite_embedding(graph, load, tensors, head_blocks, head_names, new_inits)
    for idx, extra in reversed(new_nodes):
        for j, extra_node in enumerate(extra):
            graph.node.insert(idx + 1 + j, extra_node)
    graph.initializer.extend(new_inits)
    _drop_unused(graph)
    data = model_path.with_name(model_path.name + ".data")
    data.unlink(missing_ok=True)
    onnx.save_model(
        model,
        str(model_path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data.name,
        size_threshold=1024,
    )
    return counts


def _pad_even(zp: np.ndarray) -> np.ndarray:
    """4-bit zero points pack two per byte per row: an odd count gets one unused zero."""
    return zp if zp.shape[1] % 2 == 0 else np.pad(zp, ((0, 0), (0, 1)))


def _rewrite_embedding(
    graph: Any,
    load: Any,
    tensors: dict[str, Any],
    head: Blocks | None,
    head_names: tuple[str, str, str] | None,
    inits: list[Any],
) -> None:
    """The quantized embedding table (GatherBlockQuantized) from the GGUF's token_embd blocks;
    a table tied to the output head reads the head's weights (one copy, reshaped)."""
    from onnx import helper, numpy_helper

    for pos, node in enumerate(graph.node):
        if node.op_type != "GatherBlockQuantized":
            continue
        tied = "output.weight" not in tensors and head is not None
        blocks = head if tied else load("token_embd.weight")
        assert blocks is not None
        if tied and blocks.offset is None and head_names is not None:
            names = ("model.embed_tokens.gguf_table", head_names[1], head_names[2])
            inits.append(
                numpy_helper.from_array(np.array([blocks.q.shape[0], -1], np.int64), "gguf_table_shape")
            )
            graph.node.insert(
                pos,
                helper.make_node(
                    "Reshape",
                    [head_names[0], "gguf_table_shape"],
                    [names[0]],
                    name="/model/embed_tokens/GgufTable",
                ),
            )
        else:
            if blocks.offset is not None:  # a gather cannot add the rest: 8-bit RTN of the exact values
                blocks = rtn8(blocks.dequantize())
            data = _pack(blocks.q, blocks.bits)  # [V, K * bits / 8]
            zp = _pack(blocks.zp if blocks.bits == 8 else _pad_even(blocks.zp), blocks.bits)
            names = (
                "model.embed_tokens.gguf_q",
                "model.embed_tokens.gguf_scales",
                "model.embed_tokens.gguf_zp",
            )
            inits += [
                numpy_helper.from_array(data, names[0]),
                numpy_helper.from_array(blocks.scale.astype(np.float32), names[1]),
                numpy_helper.from_array(zp, names[2]),
            ]
        indices = node.input[1]
        del node.input[:]
        node.input.extend([names[0], indices, names[1], names[2]])
        kept = [a for a in node.attribute if a.name not in ("bits", "block_size")]
        del node.attribute[:]
        node.attribute.extend(kept)
        node.attribute.extend(
            [helper.make_attribute("bits", blocks.bits), helper.make_attribute("block_size", blocks.block)]
        )
        return


def _drop_unused(graph: Any) -> None:
    """Remove nodes whose outputs nobody reads (the old table's Reshape) and unread weights."""
    outputs = {o.name for o in graph.output}
    while True:
        used = {i for n in graph.node for i in n.input} | outputs
        dead = [n for n in graph.node if n.output and not any(o in used for o in n.output)]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)
    used = {i for n in graph.node for i in n.input}
    keep = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)
