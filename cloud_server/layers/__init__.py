"""Building blocks of the PyTorch models: norm, rotary embedding, paged attention, sampler."""
