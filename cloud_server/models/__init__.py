"""PyTorch model definitions, loaders (GGUF, safetensors) and tokenizers."""
