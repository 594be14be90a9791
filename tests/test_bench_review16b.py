"""The benchmarks' command lines and arithmetic on fakes (no server, no model, no Ray): a bad option
or an unknown model is one line and exit 2 before anything starts, a ratio over a figure that
rounded to 0 is null, a single-chunk answer has no decode rate, a good run leaves no temp files."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

import hybridllm.models
from bench import cluster, hybrid, serving, speculative
from bench import edge as bench_edge
from bench import router as bench_router


def _refuse(*a, **k):
    raise AssertionError("got past the options: something would load or start")


@pytest.fixture
def nothing_loads(monkeypatch):
    """Old code that accepted a bad option fails fast here instead of copying a model."""
    monkeypatch.setattr(hybridllm.models, "pull", _refuse)
    monkeypatch.setattr(serving, "token_counter", _refuse)
    monkeypatch.setattr(speculative, "token_counter", _refuse)


def _usage_error(capsys, call, *words: str) -> None:
    with pytest.raises(SystemExit) as e:
        call()
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert "Traceback" not in err and "error:" in err
    for w in words:
        assert w in err


# -- unknown models ------------------------------------------------------------------------------
def test_serving_unknown_model_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setattr(serving, "token_counter", _refuse)
    # was hybridllm._exceptions.ModelNotFoundError as a traceback
    _usage_error(capsys, lambda: serving.main(["--model", "no-such-model"]), "--model", "no-such-model")


def test_speculative_unknown_model_or_draft_model_is_a_usage_error(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(speculative, "token_counter", _refuse)
    _usage_error(capsys, lambda: speculative.main(["--model", "no-such-model"]), "--model")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    _usage_error(capsys, lambda: speculative.main(["--model", str(gguf), "--draft-model", "nope"]),
                 "--draft-model", "nope")


def test_edge_unknown_model_is_refused_before_any_model_loads(capsys, monkeypatch):
    monkeypatch.setattr(bench_edge, "run_model", _refuse)
    # the first model measured for minutes, then the unknown one was a traceback
    _usage_error(capsys, lambda: bench_edge.main(["--models", "smollm2-135m-instruct,nope"]),
                 "--models", "nope")
    _usage_error(capsys, lambda: bench_edge.main(["--models", ","]), "--models")


# -- options -------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["--k", "0"], ["--k", "-1"], ["--draft-vocab-size", "-5"]])
def test_speculative_refuses_a_bad_k_or_draft_vocab(argv, capsys, nothing_loads):
    # --k 0 reached the server (which refused it: exit 1 after the model was copied), and the
    # report said k = 8
    _usage_error(capsys, lambda: speculative.main(argv), "expected")


@pytest.mark.parametrize(
    "lines, words",
    [([], ["no prompts"]), (['{"prompt": "fix it"}', '{"text": "x"}'], [":2:"]), (["not json"], [":1:"]),
     (['{"prompt": ""}'], [":1:"]), (["[1, 2]"], [":1:"])],
)
def test_speculative_bad_prompt_file_is_a_usage_error_before_any_server(
    lines, words, capsys, tmp_path, nothing_loads
):
    # an empty file was a ZeroDivisionError, a line without "prompt" a KeyError: tracebacks after
    # the servers had started
    f = tmp_path / "p.jsonl"
    f.write_text("".join(line + "\n" for line in lines))
    _usage_error(capsys, lambda: speculative.main(["--prompts", str(f)]), "--prompts", *words)


@pytest.mark.parametrize("argv", [["--requests", "0"], ["--rate", "0"], ["--rate", "-1"],
                                  ["--rate", "nan"], ["--long-share", "1.5"], ["--kv-cache-mb", "0"],
                                  ["--long-tokens", "-3"], ["--warm-rounds", "-1"],
                                  ["--phase-timeout", "0"]])
def test_cluster_refuses_bad_numbers_before_any_phase(argv, capsys, monkeypatch):
    # --requests 0 was a StatisticsError, --rate 0 a ZeroDivisionError; --rate -1 or
    # --long-share 1.5 started both Ray phases on a nonsense workload
    monkeypatch.setattr(cluster, "_prefix_tokens", _refuse)
    monkeypatch.setattr(cluster, "_phase_in_child", _refuse)
    monkeypatch.setattr(cluster, "run_phase", _refuse)
    _usage_error(capsys, lambda: cluster.main(argv), argv[0])


@pytest.mark.parametrize("argv", [["--n", "0"], ["--n", "-4"], ["--max-tokens", "0"],
                                  ["--cloud-fraction", "1.5"]])
def test_hybrid_refuses_bad_numbers(argv, capsys, monkeypatch):
    monkeypatch.setattr(hybrid, "workload", _refuse)
    _usage_error(capsys, lambda: hybrid.main(argv), argv[0])


def test_router_refuses_no_prompts(capsys, monkeypatch):
    # --n 0: a percentile of no latencies (an IndexError after the router and embedder loaded)
    monkeypatch.setattr(bench_router, "run", _refuse)
    _usage_error(capsys, lambda: bench_router.main(["--n", "0"]), "--n")


# -- arithmetic ----------------------------------------------------------------------------------
def test_serving_ratio_over_a_figure_rounded_to_zero_is_null(monkeypatch, tmp_path, capsys):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(serving, "token_counter", lambda path: len)

    def fake_bench(kind, args, path, count):
        p50 = 0.0 if kind == "llama_cpp" else 0.1  # a TTFT under 50 us rounds to 0.0
        level = {"output_tok_s": 50.0, "ttft_p50_s": p50, "ttft_p95_s": 0.2}
        return {"startup_s": 1.0, "peak_rss_mb": 100.0, "levels": {"1": level}}

    monkeypatch.setattr(serving, "bench_server", fake_bench)
    # was ZeroDivisionError: a traceback after both servers had been measured
    assert serving.main(["--json", "--model", str(gguf), "--concurrency", "1"]) == 0
    ratios = json.loads(capsys.readouterr().out)["ratios_ours_over_llama_cpp"]
    assert ratios == {"throughput_c1": 1.0, "ttft_p50_c1": None, "ttft_p95_c1": 1.0}


def test_speculative_single_chunk_answers_have_no_decode_rate(monkeypatch):
    # the whole answer in one streamed chunk: no time from the first to the last token; the rate
    # was tokens / 1e-9, billions of tokens/s, and the ratios over it were nonsense
    async def one_chunk(http, prompt, max_tokens, extra):
        return "one two three four", 0.0, 0.01

    closed: list[bool] = []

    class Client(httpx.Client):
        def close(self) -> None:
            closed.append(True)
            super().close()

    monkeypatch.setattr(speculative, "stream", one_chunk)
    monkeypatch.setattr(speculative, "spec_counters", lambda http: dict.fromkeys(speculative._SPEC, 0.0))
    monkeypatch.setattr(httpx, "Client", Client)
    url = "http://127.0.0.1:9"
    args = SimpleNamespace(max_tokens=8)
    out = speculative.run_c1({"off": (url, {}), "ngram": (url, {})}, ["p1", "p2"], args,
                             lambda t: len(t.split()), url)
    assert out["off"]["decode_tokens"] == 6 and out["off"]["decode_tok_s"] is None
    assert speculative.ratio(out["ngram"]["decode_tok_s"], out["off"]["decode_tok_s"]) is None
    json.dumps(out, allow_nan=False)
    assert closed  # the /metrics client is closed, not left to the garbage collector


# -- temp files ----------------------------------------------------------------------------------
def _fake_hybrid(monkeypatch, tmp_path: Path, fail: bool) -> Path:
    import hybridllm
    import hybridllm.demo
    import hybridllm.router
    import hybridllm.router.calibrate

    work = tmp_path / "work"

    def mkdtemp(prefix=""):
        work.mkdir()
        return str(work)

    class LLM:
        def __init__(self, cache_path, **kw):
            Path(cache_path).write_text("db")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def chat(self, prompt, **options):
            if fail:
                raise RuntimeError("cloud went away")
            route = options.get("route", "edge")
            return SimpleNamespace(latency_ms=10.0, route=route, usage=SimpleNamespace(total_tokens=5))

    def start_cloud(port, log):
        log.write_text("server log")
        return SimpleNamespace(kill=lambda: None, wait=lambda timeout: 0)

    monkeypatch.setattr(hybrid, "DATA", tmp_path)
    monkeypatch.setattr(hybrid, "workload", lambda n: ["q1", "q2"])
    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(hybridllm.demo, "_free_port", lambda: 1)
    monkeypatch.setattr(hybridllm.demo, "_start_cloud", start_cloud)
    monkeypatch.setattr(hybridllm.router, "load_router", lambda: SimpleNamespace(score=len))
    monkeypatch.setattr(hybridllm.router.calibrate, "calibrate_threshold", lambda scores, f: 0.5)
    monkeypatch.setattr(hybridllm, "HybridLLM", LLM)
    return work


def test_hybrid_good_run_leaves_no_temp_files(monkeypatch, tmp_path, capsys):
    # the cache database and the server log stayed in /tmp/bench-hybrid-* after every run
    work = _fake_hybrid(monkeypatch, tmp_path, fail=False)
    hybrid.main(["--json", "--n", "2"])
    assert json.loads(capsys.readouterr().out)["bench"] == "hybrid"
    assert not work.exists()


def test_hybrid_failed_run_keeps_and_names_its_log(monkeypatch, tmp_path, capsys):
    work = _fake_hybrid(monkeypatch, tmp_path, fail=True)
    with pytest.raises(RuntimeError):
        hybrid.main(["--n", "2"])
    assert (work / "cloud.log").is_file() and str(work) in capsys.readouterr().err
