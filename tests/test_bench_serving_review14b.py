"""bench.serving / bench.speculative / bench.hybrid on fakes (no server, no model): nearest-rank
p95, an in-band stream error, a server failing mid-run, a side with no decode tokens, and
options that would hang or crash."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from bench import hybrid, serving, speculative


def _sse_client(events: list[dict]) -> httpx.AsyncClient:
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    return httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://test")


def _chunk(text: str) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


CUT = [_chunk("Hello"), _chunk(" wor"), {"error": {"message": "The server had an error while streaming.",
                                                   "type": "server_error", "code": None}}]


def test_serving_in_band_stream_error_is_a_failure_not_a_short_answer():
    async def go():
        async with _sse_client(CUT) as http:
            return await serving.one_request(http, "q", 8, len)

    with pytest.raises(RuntimeError, match="stream error"):
        asyncio.run(go())


def test_speculative_in_band_stream_error_is_a_failure_not_a_short_answer():
    async def go():
        async with _sse_client(CUT) as http:
            return await speculative.stream(http, "q", 8, {})

    with pytest.raises(RuntimeError, match="stream error"):
        asyncio.run(go())


def test_serving_clean_stream_still_counts():
    async def go():
        async with _sse_client([_chunk("Hello"), _chunk(" world")]) as http:
            return await serving.one_request(http, "q", 8, len)

    assert asyncio.run(go()).num_tokens == len("Hello world")


def _fake_requests(monkeypatch, ttfts: list[float], tokens: int = 3) -> None:
    it = iter(ttfts)

    async def fake(http, prompt, max_tokens, count):
        return serving.Result(tokens, next(it))

    monkeypatch.setattr(serving, "one_request", fake)


@pytest.mark.parametrize("n,want", [(20, 19), (100, 95), (30, 29), (64, 61), (1, 1)])
def test_serving_p95_is_nearest_rank(monkeypatch, n, want):
    # TTFTs 1..n seconds: nearest-rank p95 is the ceil(0.95 n)-th, never the maximum of 20
    _fake_requests(monkeypatch, [float(i) for i in range(n, 0, -1)])
    level = asyncio.run(serving.run_level("http://127.0.0.1:9", ["q"] * n, 4, 8, len))
    assert level["ttft_p95_s"] == want


def test_serving_level_with_no_output_tokens_is_an_error(monkeypatch):
    _fake_requests(monkeypatch, [0.1] * 4, tokens=0)
    with pytest.raises(RuntimeError, match="no output tokens"):
        asyncio.run(serving.run_level("http://127.0.0.1:9", ["q"] * 4, 2, 8, len))


@pytest.mark.parametrize("n,want", [(30, 29), (20, 19), (10, 10), (1, 1)])
def test_hybrid_p95_is_nearest_rank(n, want):
    assert hybrid.p95([float(i) for i in range(1, n + 1)]) == want


def _no_servers(monkeypatch) -> None:
    """Past argument parsing nothing may load a model or start a server: fail at once instead."""
    import hybridllm.models

    def refuse(*a, **k):
        raise AssertionError("the arguments were accepted")

    monkeypatch.setattr(hybridllm.models, "pull", refuse)
    monkeypatch.setattr(serving, "token_counter", refuse)
    monkeypatch.setattr(speculative, "token_counter", refuse)


@pytest.mark.parametrize("argv", [["--concurrency", "0"], ["--concurrency", "1", "-2"],
                                  ["--num-requests", "0"], ["--max-tokens", "0"], ["--threads", "0"]])
def test_serving_rejects_counts_below_one(argv, capsys, monkeypatch):
    # --concurrency 0 made asyncio.Semaphore(0): every request waited forever
    _no_servers(monkeypatch)
    with pytest.raises(SystemExit) as e:
        serving.main(argv)
    assert e.value.code == 2 and "expected a positive integer" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--num-prompts", "0"], ["--max-tokens", "0"]])
def test_speculative_rejects_counts_below_one(argv, capsys, monkeypatch):
    _no_servers(monkeypatch)
    with pytest.raises(SystemExit) as e:
        speculative.main(argv)
    assert e.value.code == 2 and "expected a positive integer" in capsys.readouterr().err


def _level(tok_s: float) -> dict:
    return {"output_tok_s": tok_s, "ttft_p50_s": 0.1, "ttft_p95_s": 0.2}


def test_serving_peer_failing_mid_run_is_a_clear_error_keeping_the_other_side(
    monkeypatch, tmp_path: Path, capsys
):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(serving, "token_counter", lambda path: len)

    def fake_bench(kind, args, path, count):
        if kind == "llama_cpp":
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message")
        return {"startup_s": 1.0, "peak_rss_mb": 100.0, "levels": {"1": _level(50.0)}}

    monkeypatch.setattr(serving, "bench_server", fake_bench)
    code = serving.main(["--json", "--model", str(gguf), "--concurrency", "1"])
    out, err = capsys.readouterr()
    assert code == 1 and "llama_cpp failed" in err
    report = json.loads(out)
    assert report["hybridllm"]["levels"]["1"]["output_tok_s"] == 50.0  # what was measured stays
    assert "llama_cpp failed" in report["error"] and "ratios_ours_over_llama_cpp" not in report


def test_speculative_ratio_with_nothing_measured_is_none():
    assert speculative.ratio(10.0, 0.0) is None
    assert speculative.ratio(3.0, 2.0) == 1.5


def test_speculative_server_failing_mid_run_is_a_clear_error_keeping_the_report(
    monkeypatch, tmp_path: Path, capsys
):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    stopped: list = []
    monkeypatch.setattr(speculative, "token_counter", lambda path: len)
    monkeypatch.setattr(speculative, "start", lambda cmd: object())
    monkeypatch.setattr(speculative, "wait_ready", lambda url, proc, timeout: 1.0)
    monkeypatch.setattr(speculative, "stop_server", stopped.append)
    monkeypatch.setattr(httpx, "post", lambda *a, **k: None)

    def cut(*a, **k):
        raise RuntimeError('stream error: {"message": "The server had an error while streaming."}')

    monkeypatch.setattr(speculative, "run_c1", cut)
    code = speculative.main(["--json", "--model", str(gguf), "--skip-llama-cpp"])
    out, err = capsys.readouterr()
    assert code == 1 and "stream error" in err and len(stopped) == 1
    report = json.loads(out)
    assert "stream error" in report["error"] and report["ours_startup_s"] == 1.0
