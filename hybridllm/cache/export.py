"""The PyTorch reference of the cache's encoders, for training and for checking the ONNX graphs.

Needs the ``[export]`` extra (torch); nothing at run time imports this module. The device builds its
ONNX models without torch (:mod:`.onnx_graph`, :mod:`.prepare`). Here MiniLM-L6 (a 6-layer BERT) is
our own PyTorch module with the same parameter names as :mod:`.onnx_graph`:

- :func:`build_torch_model`: the sentence encoder (mean pooling, then L2 normalization);
- :func:`build_cross_encoder`: the reranker (mean pooling, one linear layer), trained by
  :mod:`.train_reranker`;
- :func:`export_onnx`: ``torch.onnx.export`` of either, which a test compares with the torch-free graph.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

from .._files import replacing
from .onnx_graph import OPSET, remap
from .reranker_file import cross_encoder_weights


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
    model.load_state_dict(remap(load_file(str(model_dir / "model.safetensors"))), strict=True)
    return model.eval()


def build_cross_encoder(model_dir: Path, weights_file: Path) -> Any:
    """The fp32 PyTorch cross-encoder of a reranker file, on the base model in ``model_dir``.

    The word embeddings, frozen in training, and the base of each layer matrix come from
    ``model_dir``; the file holds the rest (see :func:`.reranker_file.read_weights`).
    """
    import torch

    model = cross_encoder_module(json.loads((model_dir / "config.json").read_text()))
    state = {k: torch.as_tensor(v) for k, v in cross_encoder_weights(weights_file, model_dir).items()}
    model.load_state_dict(state, strict=True)
    return model.eval()


def cross_encoder_module(cfg: dict) -> Any:
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


def export_onnx(model: Any, path: Path) -> None:
    """``torch.onnx.export`` of a sentence or cross encoder, with the device graph's inputs.

    Written whole or not at all: the export goes to a temporary file beside ``path``, which
    replaces it only once written (a failed or interrupted export left a truncated graph there)."""
    import torch

    ids = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]], dtype=torch.long)
    mask = (ids != 0).long()
    types = torch.zeros_like(ids)
    axes = {0: "batch", 1: "seq"}
    with replacing(Path(path)) as tmp:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter: the one checked
            torch.onnx.export(
                model,
                (ids, mask, types),
                str(tmp),
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
