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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

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


@dataclass
class Blocks:
    """A weight [rows, K] as ``scale * (q - zp) + offset`` per block along K."""

    q: np.ndarray  # uint8 [rows, K], values < 2**bits
    scale: np.ndarray  # float32 [rows, K // block]
    zp: np.ndarray  # uint8 [rows, K // block]
    offset: np.ndarray | None  # float32 [rows, K // block], None when all zero
    bits: int
    block: int

    def dequantize(self) -> np.ndarray:
        rows, k = self.q.shape
        nb = k // self.block
        w = (self.q.reshape(rows, nb, self.block).astype(np.float32) - self.zp[..., None]) * self.scale[
            ..., None
        ]
        if self.offset is not None:
            w += self.offset[..., None]
        return w.reshape(rows, k)

    def widen(self, bits: int, block: int) -> Blocks:
        """The same weights with ``bits`` and a block that divides this one's (exact)."""
        rep = self.block // block
        off = None if self.offset is None else np.repeat(self.offset, rep, axis=1)
        return Blocks(
            self.q, np.repeat(self.scale, rep, axis=1), np.repeat(self.zp, rep, axis=1), off, bits, block
        )


def _f16(raw: np.ndarray, at: int) -> np.ndarray:
    """[rows, blocks] float32 from the fp16 at byte ``at`` of each block."""
    return raw[..., at : at + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _nibbles_32(qs: np.ndarray) -> np.ndarray:
    """ggml's 32-value nibble layout: byte j holds value j (low) and value j + 16 (high)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _affine(q: np.ndarray, scale: np.ndarray, minimum: np.ndarray, bits: int, block: int) -> Blocks:
    """w = scale * q + minimum -> an integer zero point and the exact rest as an offset."""
    safe = np.where(scale == 0, 1.0, scale)
    zp = np.clip(np.round(-minimum / safe), 0, (1 << bits) - 1)
    offset = (minimum + scale * zp).astype(np.float32)
    return Blocks(q, scale, zp.astype(np.uint8), offset if np.any(offset) else None, bits, block)


def _k_scale_min(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes -> 8 six-bit scales and mins ([.., 8] each)."""
    d = sc.astype(np.uint16)
    scales = np.empty(sc.shape[:-1] + (8,), np.uint16)
    mins = np.empty_like(scales)
    scales[..., :4] = d[..., 0:4] & 63
    mins[..., :4] = d[..., 4:8] & 63
    scales[..., 4:] = (d[..., 8:12] & 0x0F) | ((d[..., 0:4] >> 6) << 4)
    mins[..., 4:] = (d[..., 8:12] >> 4) | ((d[..., 4:8] >> 6) << 4)
    return scales.astype(np.float32), mins.astype(np.float32)


def decode(raw: np.ndarray, type_name: str, rows: int, k: int) -> Blocks:
    """A GGUF tensor's raw bytes ([rows, row bytes] uint8) -> :class:`Blocks`, no rounding."""
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(rows, -1)
    if type_name == "Q4_0":  # 18 bytes: d, 16 bytes of nibbles
        b = raw.reshape(rows, k // 32, 18)
        q = _nibbles_32(b[..., 2:]).reshape(rows, k)
        return Blocks(q, _f16(b, 0), np.full((rows, k // 32), 8, np.uint8), None, 4, 32)
    if type_name == "Q4_1":  # 20 bytes: d, m, 16 bytes of nibbles
        b = raw.reshape(rows, k // 32, 20)
        q = _nibbles_32(b[..., 4:]).reshape(rows, k)
        return _affine(q, _f16(b, 0), _f16(b, 2), 4, 32)
    if type_name == "Q5_0":  # 22 bytes: d, 32 high bits, 16 bytes of nibbles
        b = raw.reshape(rows, k // 32, 22)
        high = b[..., 2:6].copy().view(np.uint32)[..., 0]  # [rows, blocks]
        bits5 = ((high[..., None] >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
        q = (_nibbles_32(b[..., 6:]) | (bits5 << 4)).reshape(rows, k)
        return Blocks(q, _f16(b, 0), np.full((rows, k // 32), 16, np.uint8), None, 8, 32)
    if type_name == "Q8_0":  # 34 bytes: d, 32 int8
        b = raw.reshape(rows, k // 32, 34)
        q = (b[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8).reshape(rows, k)
        return Blocks(q, _f16(b, 0), np.full((rows, k // 32), 128, np.uint8), None, 8, 32)
    if type_name == "Q4_K":  # 144 bytes per 256: d, dmin, 12 bytes of 6-bit scales/mins, 128 of nibbles
        b = raw.reshape(rows, k // 256, 144)
        d, dmin = _f16(b, 0)[..., None], _f16(b, 2)[..., None]
        sc, mn = _k_scale_min(b[..., 4:16])
        qs = b[..., 16:].reshape(rows, k // 256, 4, 32)  # 4 chunks of 64 values: low nibbles, then high
        q = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(rows, k)
        return _affine(q, (d * sc).reshape(rows, -1), (-dmin * mn).reshape(rows, -1), 4, 32)
    if type_name == "Q6_K":  # 210 bytes per 256: 128 low nibbles, 64 of 2 high bits, 16 int8 scales, d
        b = raw.reshape(rows, k // 256, 210)
        ql = b[..., :128].reshape(rows, -1, 2, 64)  # two halves of 128 values
        qh = b[..., 128:192].reshape(rows, -1, 2, 32)
        lo = np.stack(
            [ql[..., :32] & 0x0F, ql[..., 32:] & 0x0F, ql[..., :32] >> 4, ql[..., 32:] >> 4], axis=3
        )
        hi = np.stack([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=3)
        q = (lo | (hi << 4)).reshape(rows, k)  # per half: 4 runs of 32 values
        sc = b[..., 192:208].view(np.int8).astype(np.float32)  # one per 16 values, in order
        scale = (_f16(b, 208)[..., None] * sc).reshape(rows, -1)
        return Blocks(q, scale, np.full((rows, k // 16), 32, np.uint8), None, 8, 16)
    raise NotImplementedError(type_name)


def rtn8(w: np.ndarray, block: int = 32) -> Blocks:
    """8-bit round-to-nearest with a zero point, for tensors the GGUF keeps in F16/F32."""
    rows, k = w.shape
    b = w.reshape(rows, k // block, block).astype(np.float32)
    lo, hi = np.minimum(b.min(-1), 0), np.maximum(b.max(-1), 0)
    scale = np.where(hi > lo, (hi - lo) / 255, 1.0).astype(np.float32)
    zp = np.clip(np.round(-lo / scale), 0, 255)
    q = np.clip(np.round(b / scale[..., None]) + zp[..., None], 0, 255).astype(np.uint8).reshape(rows, k)
    return Blocks(q, scale, zp.astype(np.uint8), None, 8, block)


def gguf_architecture(gguf_path: Path) -> str:
    """The GGUF's ``general.architecture`` (its header only), "unknown" when unreadable."""
    try:
        import gguf

        return str(gguf.GGUFReader(str(gguf_path)).fields["general.architecture"].contents())
    except Exception:  # only for an error message: never hide the error it explains
        return "unknown"


def gguf_blocks(gguf_path: Path) -> tuple[dict[str, Any], Any]:
    """GGUF tensors by name, and a function ``name -> Blocks`` (HF row order: q/k unpermuted)."""
    import gguf

    from cloud_server.models.loader_gguf import unpermute_qk

    reader = gguf.GGUFReader(str(gguf_path))
    tensors = {t.name: t for t in reader.tensors}
    arch = str(reader.fields["general.architecture"].contents())
    heads = int(reader.fields[f"{arch}.attention.head_count"].contents())
    kv_field = reader.fields.get(f"{arch}.attention.head_count_kv")
    kv_heads = int(kv_field.contents()) if kv_field is not None else heads

    def load(name: str) -> Blocks:
        t = tensors[name]
        k, rows = (int(x) for x in t.shape[:2])  # GGUF shape: [K (contiguous), rows]
        try:
            blocks = decode(np.asarray(t.data), t.tensor_type.name, rows, k)
        except NotImplementedError:
            from gguf.quants import dequantize

            blocks = rtn8(np.asarray(dequantize(t.data, t.tensor_type), np.float32).reshape(rows, k))
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            # llama.cpp permutes q/k rows; whole rows move, so the blocks along K are untouched
            n = heads if "attn_q" in name else kv_heads
            order = unpermute_qk(np.arange(rows)[:, None], n)[:, 0]
            off = None if blocks.offset is None else blocks.offset[order]
            blocks = Blocks(
                blocks.q[order], blocks.scale[order], blocks.zp[order], off, blocks.bits, blocks.block
            )
        return blocks

    return tensors, load


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
