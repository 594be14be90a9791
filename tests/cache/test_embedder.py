"""The ONNX embedder against our fp32 PyTorch encoder, on real QQP questions."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from hybridllm.cache import Embedder, get_embedder

pytestmark = pytest.mark.real

TEXTS = [
    "How do I learn Python?",
    "How can I learn Python fast?",
    "What is the capital of France?",
    "Why is the sky blue during the day but red at sunset?",
    "",
    "a " * 400,  # longer than the 256-token limit: truncated, not an error
]


INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _questions(shared_data: Path, n: int) -> list[str]:
    out = []
    with open(shared_data / "paraphrase" / "qqp_pairs.jsonl") as fh:
        for line in fh:
            row = json.loads(line)
            out += [row["text_a"], row["text_b"]]
            if len(out) >= n:
                break
    return out[:n]


def test_shape_norm_and_order() -> None:
    emb = get_embedder()
    vecs = emb.embed(TEXTS, batch_size=2)
    assert vecs.shape == (len(TEXTS), 384) and vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
    # batching sorts by length internally: the caller's order must come back. int8 dynamic
    # quantization scales activations per batch, so batched and single vectors differ slightly.
    singles = np.stack([emb.embed_one(t) for t in TEXTS])
    cross = vecs @ singles.T
    assert (cross.argmax(1) == np.arange(len(TEXTS))).all()
    assert np.delete(cross.diagonal(), TEXTS.index("")).min() > 0.99
    sims = vecs[:3] @ vecs[:3].T
    assert sims[0, 1] > 0.8 > 0.3 > sims[0, 2]
    assert emb.embed([]).shape == (0, 384)


def test_default_embedding_is_the_run_time_one() -> None:
    """Training and calibration embed lists with ``embed``; the router and the cache embed one
    prompt with ``embed_one`` at run time. The int8 model's vectors depend on the batch, so the
    default must embed each text alone: the same vector, to the bit."""
    emb = get_embedder()
    texts = [t for t in TEXTS if t] + ["a much longer question " * 20]
    singles = np.stack([emb.embed_one(t) for t in texts])
    np.testing.assert_array_equal(emb.embed(texts), singles)


def test_shared_instance_is_one_object_across_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    from hybridllm.cache import embedder as embedder_module

    # no shared instance yet: the four threads race to create the first one (an instance made by
    # an earlier test would be handed out whatever the locking does)
    monkeypatch.setattr(embedder_module, "_shared", {})
    monkeypatch.setattr(embedder_module, "_failed", {})
    start = threading.Barrier(4)
    seen: list[Embedder] = []

    def first_call() -> None:
        start.wait()
        seen.append(get_embedder())

    threads = [threading.Thread(target=first_call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 4 and len({id(e) for e in seen}) == 1


def test_int8_onnx_matches_fp32_pytorch(shared_data: Path, minilm_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    from hybridllm.cache.export import build_torch_model

    texts = _questions(shared_data, 200)
    int8 = get_embedder().embed(texts)
    fp32 = Embedder(quantized=False)
    model = build_torch_model(minilm_dir)
    ref = np.empty_like(int8)
    for start in range(0, len(texts), 50):
        encs = fp32._tokenizer.encode_batch(texts[start : start + 50])
        width = max(len(e.ids) for e in encs)
        ids = torch.zeros((len(encs), width), dtype=torch.long)  # [batch, seq]
        mask = torch.zeros_like(ids)
        for row, e in enumerate(encs):
            ids[row, : len(e.ids)] = torch.tensor(e.ids)
            mask[row, : len(e.ids)] = 1
        with torch.no_grad():
            ref[start : start + 50] = model(ids, mask, torch.zeros_like(ids)).numpy()
    np.testing.assert_allclose((fp32.embed(texts) * ref).sum(1), 1.0, atol=1e-4)
    cos = (int8 * ref).sum(1)
    assert cos.min() >= 0.99, f"int8 vs fp32 PyTorch: min cosine {cos.min():.4f}"


def test_long_prompts_are_matched_only_exactly_by_the_real_models(tmp_path: Path) -> None:
    """Before: a document followed by two different questions, past the embedder's 256 tokens,
    embedded to cosine 1.0; the feature verifier and plain cosine then served one question's
    answer for the other."""
    from hybridllm.cache import SemanticCache
    from hybridllm.cache.reranker import get_rerank_verifier

    embedder = get_embedder()
    doc = ("The quarterly report covers revenue, costs, hiring, the new office in Lyon, supplier "
           "contracts, the product roadmap and customer feedback from the spring survey. ") * 12
    first, second = doc + "Question: who wrote this report?", doc + "Question: how much did revenue grow?"
    assert float(embedder.embed_one(first) @ embedder.embed_one(second)) > 0.999  # the head only
    assert embedder.fits("How do I learn Python?") and not embedder.fits("short", first)
    reranker = get_rerank_verifier().reranker
    assert reranker.fits_pairs([("How do I learn Python?", "How can I learn Python?"),
                                (doc[:400], doc[:400])]).tolist() == [True, False]
    for verifier in ("features", "cosine"):
        with SemanticCache(tmp_path / f"{verifier}.sqlite3", verifier=verifier) as cache:
            cache.put([{"role": "user", "content": first}], "the author", model="m", params_key={})
            assert cache.get([{"role": "user", "content": second}], model="m", params_key={}) is None
            hit = cache.get([{"role": "user", "content": first}], model="m", params_key={})
            assert hit is not None and hit.text == "the author"
