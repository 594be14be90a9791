"""Benchmarks as a user runs them, without a model: bench.cache_floor's options are checked before
the edge model loads, and a run whose answers are all right (or all wrong) reports a null floor
and why, not a DataError traceback; bench.cache's verified figures are null, not a made-up 1 or 0,
where nothing was there to count."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest


class _Edge:
    """The edge model as bench.cache_floor calls it: every answer says ``text``."""

    loaded = 0
    text = "Paris, of course."

    def __init__(self, model, n_ctx=0):
        type(self).loaded += 1

    def generate(self, messages, params):
        return SimpleNamespace(text=self.text, mean_logprob=-0.1)

    def close(self):
        pass


@pytest.fixture
def floor_bench(monkeypatch):
    import hybridllm.backends.llama_cpp as llama_cpp
    from bench import cache_floor

    _Edge.loaded = 0
    monkeypatch.setattr(llama_cpp, "LlamaCppBackend", _Edge)
    monkeypatch.setattr(cache_floor, "forced_mean_logprob", lambda edge, q, a: -3.0)

    def run(*argv):
        monkeypatch.setattr(sys, "argv", ["python -m bench.cache_floor", *argv])
        return cache_floor.main()

    return run


@pytest.mark.parametrize("argv", [["--samples", "0"], ["--samples", "-2"], ["--max-tokens", "0"],
                                  ["--temperature", "nan"], ["--temperature", "-1"], ["--temperature", "3"]])
def test_cache_floor_refuses_bad_options_before_the_model_loads(floor_bench, argv, capsys):
    # before: --samples 0 loaded the model, sampled nothing and died in the calibration (DataError
    # traceback); a temperature of NaN or 3 failed in GenerationParams after the model loaded
    with pytest.raises(SystemExit) as e:
        floor_bench(*argv)
    assert e.value.code == 2 and argv[0] in capsys.readouterr().err
    assert _Edge.loaded == 0


def test_cache_floor_with_every_answer_right_reports_a_null_floor(floor_bench, monkeypatch, capsys):
    # an edge always right (every expected word in its answer) leaves nothing to separate; before,
    # the whole run ended in calibrate_logprob_threshold's DataError traceback
    from bench.cache_floor import QUESTIONS

    monkeypatch.setattr(_Edge, "text", " ".join(want for _, want in QUESTIONS))
    assert floor_bench("--json", "--samples", "1") == 1
    captured = capsys.readouterr()
    out = json.loads(captured.out)  # one JSON object on stdout, the reason on stderr
    assert out["floor"] is None and out["n"] == out["right"] == 30 and "right and wrong" in out["error"]
    assert "no floor" in captured.err


# -- bench.cache: verified figures over nothing to count -------------------------------------------
class _Verifier:
    def __init__(self):
        self.batch_size = 1
        self.reranker = SimpleNamespace(run_batches=lambda items: [])

    def predict(self, *args):
        return []


class _MissingCache:
    """A cache that never serves a hit (and never asks the verifier): every lookup a miss."""

    def __init__(self, path, **kw):
        self.verifier = _Verifier()

    def put(self, *a, **kw):
        pass

    def get(self, *a, **kw):
        return None

    def close(self):
        pass


def test_cache_verified_figures_are_null_with_no_hit_no_duplicate_and_no_candidate(monkeypatch, tmp_path):
    import hybridllm.cache
    import hybridllm.cache.train
    from bench import cache

    monkeypatch.setenv("HYBRIDLLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "_verified_set",
                        lambda n, q: (["a?", "b?"], [("c?", "a?", 0), ("d?", "b?", 0)]))
    monkeypatch.setattr(hybridllm.cache.train, "embed_texts", lambda texts, **kw: dict.fromkeys(texts))
    monkeypatch.setattr(hybridllm.cache, "SemanticCache", _MissingCache)
    monkeypatch.setattr(hybridllm.cache, "RerankVerifier", _Verifier)
    out = cache.bench_verified(None, 2, 2, rounds=1)
    for mode in ("", "_batched"):
        assert out[f"verified_2_hits{mode}"] == "0/2"
        assert out[f"verified_2_precision{mode}"] is None  # was 1.0: "every hit right" with no hit
        assert out[f"verified_2_recall{mode}"] is None  # was 0.0 with no duplicate pair to find
        assert out[f"verified_2_pairs_scored{mode}"] is None  # was 0.0 with no candidate
    assert out["verified_2_graph_skipped"] is None  # was 0.0 with no lookup that had candidates
    json.dumps(out, allow_nan=False)


def test_cache_says_where_it_looked_when_the_verified_pairs_are_missing(monkeypatch, tmp_path, capsys):
    import hybridllm.cache
    from bench import cache

    monkeypatch.setattr(cache, "PAIRS", tmp_path / "qqp_pairs.jsonl")
    monkeypatch.setattr(hybridllm.cache, "get_embedder", lambda: None)
    out = cache.run(sizes=[1], max_tokens=1, rounds=1, parts=("verified",))
    assert not any(k.startswith("verified_") for k in out)
    err = capsys.readouterr().err  # before: nothing said, the asked-for part just absent
    assert str(tmp_path / "qqp_pairs.jsonl") in err and "verified" in err


# -- the documented keys and options of the benches test_bench_docs_review16d.py leaves out --------
@pytest.mark.parametrize("name", ["serving", "router"])
def test_serving_and_router_write_their_documented_keys_and_take_their_options(name):
    from tests.test_bench_docs_review16d import ROOT, missing_keys
    from tests.test_bench_docs_review16d import test_every_documented_option_is_taken_by_the_bench as options

    assert missing_keys(name, (ROOT / "bench" / f"{name}.py").read_text()) == []
    options(name)
