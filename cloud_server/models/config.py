"""The architecture settings a model file describes, in one shape for every loader."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..exceptions import ModelLoadError

ARCHITECTURES = ("llama", "gemma3")
LAYER_TYPES = ("sliding_attention", "full_attention")
# RoPE scalings layers.rope implements -> the keys each needs ("freq_factors": GGUF's rope_freqs)
ROPE_SCALINGS = {"default": (), "linear": ("factor",),
                 "llama3": ("factor", "original_max_position_embeddings"), "freq_factors": ("factors",)}


@dataclass
class ModelConfig:
    """Transformer hyperparameters (Hugging Face names where there is one).

    Norm weights follow one convention inside the engine: ``y = x_normed * w`` (Gemma's HF
    checkpoints store ``w - 1``; the safetensors loader adds the 1 back, GGUF already has it).
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    # Gemma 3
    rope_local_theta: float = 10000.0
    sliding_window: int | None = None
    layer_types: list[str] = field(default_factory=list)  # "sliding_attention"/"full_attention"
    query_pre_attn_scalar: float | None = None

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ModelLoadError(
                f"unsupported architecture {self.architecture!r}; supported: {ARCHITECTURES}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2:  # RoPE rotates the two halves of each head
            raise ModelLoadError(f"head_dim must be even, got {self.head_dim}")
        self._check_rope_scaling()
        if not self.layer_types:
            self.layer_types = ["full_attention"] * self.num_layers
        if len(self.layer_types) != self.num_layers:
            raise ModelLoadError("layer_types must name one type per layer")
        # any other name ran as a global layer: a typo'd sliding layer silently lost its window
        unknown = [t for t in self.layer_types if t not in LAYER_TYPES]
        if unknown:
            raise ModelLoadError(f"layer_types may only name {LAYER_TYPES}, got {unknown[:3]}")

    def _check_rope_scaling(self) -> None:
        """An unsupported or incomplete ``rope_scaling`` fails here, before any weight is read
        (it failed after the whole load, a missing key as a bare KeyError)."""
        scaling = self.rope_scaling
        if scaling is None:
            return
        if not isinstance(scaling, dict):
            raise ModelLoadError(f"rope_scaling must be an object or null, got {scaling!r}")
        kind = scaling.get("rope_type", scaling.get("type")) or "default"
        if kind not in ROPE_SCALINGS:
            raise ModelLoadError(f"RoPE scaling {kind!r} is not supported (linear, llama3)")
        missing = [k for k in ROPE_SCALINGS[kind] if scaling.get(k) is None]
        if missing:
            raise ModelLoadError(f"rope_scaling {kind!r} needs {missing}, got {scaling!r}")

    @property
    def attn_scale(self) -> float:
        scalar = self.query_pre_attn_scalar or self.head_dim
        return float(scalar) ** -0.5

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def gemma3_layer_types(num_layers: int, pattern: int = 6) -> list[str]:
    """Gemma 3: five sliding-window layers, then one global layer, repeated."""
    return [
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
        for i in range(num_layers)
    ]
