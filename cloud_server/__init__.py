"""hybridllm-cloud: the OpenAI-compatible PyTorch serving engine (paged KV cache, continuous batching)."""

from .cpu_features import cap_onednn_isa

# before torch runs its first bf16 matmul: oneDNN's AMX kernels compute a row differently with the
# number of rows, which a batched request's bit-for-bit identity with the same request alone rests on
cap_onednn_isa()
