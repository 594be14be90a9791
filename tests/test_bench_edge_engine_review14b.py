"""bench.edge's summary of empty answers and the options of bench.edge / bench.engine that used to
crash after loading models (or divide by zero), checked without loading anything."""

from __future__ import annotations

import json
import math
import sys

import pytest

from bench import edge as bench_edge
from bench import engine as bench_engine


def test_edge_summary_skips_empty_answers_for_ttft():
    # an empty answer has no first token (NaN TTFT): it no longer turns the median into NaN
    summary = bench_edge._summary([(float("nan"), 0.0, 0)] * 3 + [(0.1, 0.5, 11)])
    assert summary["ttft_ms_p50"] == 100.0 and summary["empty_answers"] == 3
    assert summary["tokens"] == 10 and summary["decode_tokens_per_s"] == 20.0


def test_edge_summary_of_only_empty_answers_is_valid_json():
    summary = bench_edge._summary([(float("nan"), 0.0, 0)] * 2)
    assert summary["ttft_ms_p50"] is None
    json.dumps(summary, allow_nan=False)  # NaN is no JSON number
    assert not any(isinstance(v, float) and math.isnan(v) for v in summary.values())


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--max-tokens", "0"], ["--threads", "-1"],
                                  ["--backends", "onnxx"], ["--backends", ","]])
def test_edge_rejects_bad_options_before_loading_models(argv, monkeypatch, capsys):
    def refuse(*a, **k):
        raise AssertionError("the options were accepted")

    monkeypatch.setattr(bench_edge, "run_model", refuse)
    monkeypatch.setattr(sys, "argv", ["bench.edge", *argv])
    with pytest.raises(SystemExit) as e:
        bench_edge.main()
    assert e.value.code == 2 and "error:" in capsys.readouterr().err


@pytest.mark.parametrize("opt", ["--requests", "--max-tokens", "--concurrency", "--sequential",
                                 "--ttft-rounds"])
def test_engine_rejects_counts_below_one_before_loading_the_model(opt, monkeypatch, capsys):
    # --sequential 0 divided by zero and --ttft-rounds 0 took the median of nothing, after the load
    import cloud_server.engine.llm_engine as llm_engine

    def refuse(*a, **k):
        raise AssertionError("the options were accepted")

    monkeypatch.setattr(llm_engine, "LLMEngine", refuse)
    with pytest.raises(SystemExit) as e:
        bench_engine.main([opt, "0"])
    assert e.value.code == 2 and "expected a positive integer" in capsys.readouterr().err
