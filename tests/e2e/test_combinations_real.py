"""Features used together with the real SmolLM2 on the device (llama.cpp): privacy="redact" with a
cloud stream that breaks mid-answer (the device continues from the restored text), a broken stream
whose answer the device cannot hold beside the prompt, and, against the real cloud server process,
a redacted answer through `hybridllm serve`'s stream with usage. The fast versions on fakes are in
tests/test_combinations.py."""

from __future__ import annotations

import json

import pytest

from hybridllm import CloudUnavailableError, ContextWindowExceededError, HybridLLM
from hybridllm.router import RoutingPolicy

from ..test_combinations import BreakingCloud, CloudRouter
from ..test_pii_restore import PROMPT, HardRouter

pytestmark = pytest.mark.real

JANE = "jane.doe@example.com"


def _device(smollm2_path):
    from hybridllm.backends.base import create_backend

    return create_backend("llama_cpp", model=str(smollm2_path), n_ctx=256, n_threads=1)


def test_real_device_finishes_a_redacted_cloud_answer_from_the_restored_text(smollm2_path):
    cloud = BreakingCloud(["Sure. I will write to [EMA", "IL_1] today, and"])
    policy = RoutingPolicy(HardRouter(), privacy="redact")
    # max_tokens bounds the whole answer: the cloud's part (about 11 tokens) leaves the device 13
    with HybridLLM(edge=_device(smollm2_path), cloud=cloud, policy=policy, cache=False, max_tokens=24,
                   temperature=0.0, price_per_1k_tokens=0.002, max_cloud_calls_per_hour=5) as llm:
        stream = llm.stream(PROMPT)
        chunks = [ch.text for ch in stream]
        c = stream.completion
        budget = llm.stats()["budget"]
    assert c is not None and c.route == "cloud->edge"
    assert c.text.startswith(f"Sure. I will write to {JANE} today, and")
    assert len(c.text) > len(f"Sure. I will write to {JANE} today, and")  # the device wrote on
    assert "".join(chunks) == c.text and "EMAIL_1" not in c.text
    assert JANE not in repr(cloud.calls)
    assert c.cost_usd > 0 and budget["calls_in_flight"] == 0 and budget["calls_hour"] == 1


def test_real_device_that_cannot_hold_the_broken_answer_reports_the_cloud_failure(smollm2_path):
    cloud = BreakingCloud(["word " * 300])  # more than the device's 256 tokens of context
    # a max_tokens the cloud's part (about 375 tokens) leaves room in: the device is asked to go on
    with HybridLLM(edge=_device(smollm2_path), cloud=cloud, policy=CloudRouter(), cache=False,
                   max_tokens=400, max_cloud_calls_per_hour=5) as llm:
        n = llm.edge.count_tokens([{"role": "user", "content": "Say hi."}])
        with pytest.raises(CloudUnavailableError, match="cannot finish the answer") as info:
            llm.chat("Say hi.")
        assert not isinstance(info.value, ContextWindowExceededError)
        assert f"({n} tokens)" in str(info.value) and "n_ctx 256" in str(info.value)
        assert llm.stats()["budget"]["calls_in_flight"] == 0


def test_real_cloud_and_device_redacted_stream_through_the_proxy_with_usage(cloud, smollm2_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from hybridllm.proxy import create_app

    prompt = f"Repeat this line exactly: Contact {JANE}."
    policy = RoutingPolicy(HardRouter(), privacy="redact")
    llm = HybridLLM(edge=_device(smollm2_path), cloud_url=cloud.url, policy=policy, cache=False,
                    max_tokens=24, temperature=0.0, max_cloud_calls_per_hour=5)
    body = {"model": "x", "messages": [{"role": "user", "content": prompt}], "stream": True,
            "stream_options": {"include_usage": True}}
    try:
        with TestClient(create_app(llm)) as http:
            r = http.post("/v1/chat/completions", json=body)
            stats = http.get("/stats").json()
    finally:
        llm.close()
    assert r.status_code == 200 and r.headers["x-hybridllm-route"] == "cloud"
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert "EMAIL_1" not in r.text  # no placeholder reaches the client, whole or split
    assert text.strip()
    usage = events[-1]["usage"]
    assert events[-1]["choices"] == [] and usage["total_tokens"] > 0
    assert stats["budget"]["calls_in_flight"] == 0 and stats["budget"]["calls_hour"] == 1
    assert stats["cloud_tokens"] == usage["total_tokens"]  # counted once
