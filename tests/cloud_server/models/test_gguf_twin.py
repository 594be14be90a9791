"""``bench.gguf_twin``: a random-weight GGUF that the engine loads like its source (same config,
tokenizer and tensor shapes), for timing where the real weights cannot be copied."""

from __future__ import annotations

import gzip
import json

import pytest

pytestmark = pytest.mark.real


def test_twin_has_the_sources_config_tokenizer_and_shapes(smollm2_path, tmp_path):
    from bench.gguf_twin import extract, write
    from cloud_server.models.loader_gguf import open_gguf
    from cloud_server.models.tokenizer import GGUFTokenizer

    meta = tmp_path / "meta.json.gz"
    extract(str(smollm2_path), str(meta))
    with gzip.open(meta, "rt") as f:
        data = json.load(f)
    # two layers keep the test small; the shapes of what is kept must match the source
    data["tensors"] = [t for t in data["tensors"]
                       if not t[0].startswith("blk.") or int(t[0].split(".")[1]) < 2]
    data["kv"] = [(k, 2 if k.endswith(".block_count") else v, ty) for k, v, ty in data["kv"]]
    with gzip.open(meta, "wt") as f:
        json.dump(data, f)
    twin = tmp_path / "twin.gguf"
    write(str(meta), str(twin))

    src_cfg, src_tensors, _ = open_gguf(smollm2_path)
    cfg, tensors, _ = open_gguf(twin)
    assert cfg.num_layers == 2 and src_cfg.num_layers == 30
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads",
                  "head_dim", "rope_theta", "tie_word_embeddings"):
        assert getattr(cfg, field) == getattr(src_cfg, field), field
    src_sizes = {t.name: t.n_elements for t in src_tensors.tensors}
    assert {t.name: t.n_elements for t in tensors.tensors}.items() <= src_sizes.items()
    assert len(tensors.tensors) == len([n for n in src_sizes
                                        if not n.startswith("blk.") or int(n.split(".")[1]) < 2])
    text = "Fix the bug: def add(a, b): return a - b"
    assert GGUFTokenizer(twin).encode(text) == GGUFTokenizer(smollm2_path).encode(text)
