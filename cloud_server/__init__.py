"""hybridllm-cloud: the OpenAI-compatible PyTorch serving engine (paged KV cache, continuous batching)."""
