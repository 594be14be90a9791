"""The benchmarks' documented output, checked without running them: every JSON key a bench's
docstring or its README row names (``key`` / `key`) is a key its code writes, every option they
name is one it takes; and the option checks and null ratios of bench.cpu_kernels,
bench.engine_steps, bench.edge, bench.hybrid, bench.quality, bench.router_cv and bench.cache."""

from __future__ import annotations

import ast
import itertools
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHES = ("cache", "quality", "router_cv", "engine", "edge", "hybrid", "cpu_kernels", "engine_steps",
           "structured", "tools")
# names in the docs that are no key: options' values, words of the prose, parts of a key (a
# leading "_" is a suffix such as ``_p99_ms`` or a private torch function, skipped anyway)
NOT_KEYS = {
    "cache": {"at_least", "hit", "miss", "n", "max_tokens", "features"},
    "engine": {"ignore_eos"},
    "edge": {"create_chat_completion", "generate_next_token"},
    "structured": {"gbnf", "ours", "plain", "create_chat_completion", "response_format"},
    "tools": {"ours", "llama_cpp", "auto", "named", "create_chat_completion", "tool_choice", "tools",
              "get_weather"},
}
# the names the docs give without their prefix (bench.cache's ``verified_{n}_*`` bullet)
PREFIXES = {"cache": ("", "verified_X_")}


def _docs(name: str) -> list[str]:
    """The quoted names of the bench's module docstring and of its README Performance row."""
    doc = ast.get_docstring(ast.parse((ROOT / "bench" / f"{name}.py").read_text())) or ""
    rows = [line for line in (ROOT / "README.md").read_text().splitlines()
            if line.startswith(f"| `bench.{name}` |")]
    assert len(rows) == 1, f"README.md has {len(rows)} Performance rows for bench.{name}"
    return re.findall(r"``([^`]+)``", doc) + re.findall(r"(?<!`)`([^`]+)`(?!`)", rows[0])


def _samples(name: str) -> set[str]:
    """Documented keys, a brace list expanded (``verify{,_features}_ms``: two keys) and a
    placeholder (``{n}``, ``*``) written as X."""
    out = set()
    for tok in _docs(name):
        if not re.fullmatch(r"[a-z*][a-z0-9_{},*]*", tok) or tok in NOT_KEYS.get(name, ()):
            continue
        parts = re.split(r"\{([^{}]*,[^{}]*)\}", tok)  # odd items: the alternatives of a brace list
        for combo in itertools.product(*[p.split(",") if i % 2 else [p] for i, p in enumerate(parts)]):
            out.add(re.sub(r"\{\w+\}|\*", "X", "".join(combo)))
    return out


def _options(name: str) -> set[str]:
    return {tok.split()[0] for tok in _docs(name) if re.fullmatch(r"--[a-z][a-z-]*( .*)?", tok)}


def _pattern(node: ast.AST) -> tuple[str, str] | None:
    """(a regex for the strings a key expression can be, the key with X for each value): a
    literal, or an f-string with any value."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.escape(node.value), node.value
    if isinstance(node, ast.JoinedStr):
        parts = [v.value if isinstance(v, ast.Constant) else None for v in node.values]
        return ("".join(".*" if v is None else re.escape(v) for v in parts),
                "".join("X" if v is None else v for v in parts))
    return None


def code_keys(source: str) -> list[tuple[str, str]]:
    """Regexes of the keys the code writes: dict literals' keys, ``d[key] = ...`` targets, and the
    names a ``{k: ... for k in ("a", "b")}`` takes."""
    found: list[ast.AST] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            found += [k for k in node.keys if k is not None]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            found.append(node.slice)
        elif isinstance(node, ast.DictComp) and isinstance(node.key, ast.Name):
            for gen in node.generators:
                if isinstance(gen.iter, (ast.Tuple, ast.List)):
                    found += gen.iter.elts
    return [p for p in map(_pattern, found) if p is not None]


def missing_keys(name: str, source: str) -> list[str]:
    keys = code_keys(source)

    def written(doc: str) -> bool:  # a placeholder on either side stands for any text
        pattern = re.escape(doc).replace("X", ".+")
        return any(re.fullmatch(k, doc) or re.fullmatch(pattern, text) for k, text in keys)

    return sorted(s for s in _samples(name) if not any(written(p + s) for p in PREFIXES.get(name, ("",))))


@pytest.mark.parametrize("name", BENCHES)
def test_every_documented_key_is_written_by_the_bench(name):
    source = (ROOT / "bench" / f"{name}.py").read_text()
    assert missing_keys(name, source) == []


@pytest.mark.parametrize("name", BENCHES)
def test_every_documented_option_is_taken_by_the_bench(name):
    source = (ROOT / "bench" / f"{name}.py").read_text()
    taken = {n.args[0].value for n in ast.walk(ast.parse(source))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "add_argument" and n.args and isinstance(n.args[0], ast.Constant)}
    assert _options(name) - taken == set()


def test_the_check_notices_a_key_that_disappears():
    # the docs name keys the check finds (not an empty set), and a renamed key is reported
    source = (ROOT / "bench" / "engine.py").read_text()
    assert {"throughput_ratio", "weight_bytes"} <= _samples("engine")
    assert missing_keys("engine", source.replace('"throughput_ratio":', '"throughput_x":')) == [
        "throughput_ratio"]
    assert {"verify_ms", "verify_features_share", "lookup_X_p50_ms", "verified_X_X"} <= _samples("cache")
    cache = (ROOT / "bench" / "cache.py").read_text()
    renamed = cache.replace("_decisions_changed", "_decisions_differ")
    assert missing_keys("cache", renamed) == ["decisions_changed"]
    assert missing_keys("cache", cache.replace('out[f"verify{suffix}_share"]', 'out["x"]')) == [
        "verify_features_share", "verify_share"]


# -- options: refused in one line before anything loads -------------------------------------------
def _refuse(*a, **k):
    raise AssertionError("the options were accepted")


@pytest.mark.parametrize("argv", [["--threads", "0"], ["--repeats", "0"], ["--repeats", "-2"],
                                  ["--threads", "x"]])
def test_cpu_kernels_refuses_counts_below_one(argv, monkeypatch, capsys):
    # --repeats 0 took the median of no pass (after loading the model twice); --threads 0 reached torch
    import torch

    from bench import cpu_kernels

    monkeypatch.setattr(torch, "set_num_threads", _refuse)
    with pytest.raises(SystemExit) as e:
        cpu_kernels.main(argv)
    assert e.value.code == 2 and "expected a positive integer" in capsys.readouterr().err


@pytest.mark.parametrize("context", ["0", "-5", "2041"])
def test_engine_steps_refuses_a_context_outside_the_window(context, monkeypatch, capsys):
    import cloud_server.engine.llm_engine as llm_engine
    from bench import engine_steps

    monkeypatch.setattr(llm_engine, "LLMEngine", _refuse)
    with pytest.raises(SystemExit) as e:
        engine_steps.main(["--context", context])
    assert e.value.code == 2 and "--context" in capsys.readouterr().err


def test_quality_refuses_qqp_n_below_one(monkeypatch, tmp_path, capsys):
    # --qqp-n 0 read every QQP question (the loop stopped only at len == n)
    from bench import quality

    monkeypatch.setattr(quality, "MMLU", tmp_path / "missing.csv")  # the old code: no data, no run
    with pytest.raises(SystemExit) as e:
        quality.main(["--qqp-n", "0"])
    assert e.value.code == 2 and "expected a positive integer" in capsys.readouterr().err


def test_router_cv_refuses_negative_salts(monkeypatch, tmp_path, capsys):
    # --salts -1 ran the shipped assignment alone and reported num_assignments 0
    from bench import router_cv

    monkeypatch.setattr(router_cv, "DATA", tmp_path / "missing.csv")
    with pytest.raises(SystemExit) as e:
        router_cv.main(["--salts", "-1"])
    assert e.value.code == 2 and "expected an integer >= 0" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--max-tokens", "0"], ["--verified-size", "0"],
                                  ["--verified-queries", "-1"], ["--sizes", "10k"], ["--sizes", "0"],
                                  ["--sizes", ","]])
def test_cache_refuses_bad_numbers_before_the_embedder_loads(argv, monkeypatch, capsys):
    # --rounds 0 took percentiles of nothing (IndexError), --sizes 10k a ValueError traceback
    from bench import cache

    monkeypatch.setattr(cache, "run", _refuse)
    with pytest.raises(SystemExit) as e:
        cache.main(argv)
    assert e.value.code == 2 and "error:" in capsys.readouterr().err


# -- null, not a misleading number, when nothing was measured --------------------------------------
def test_edge_ratios_are_null_when_a_side_decoded_nothing(monkeypatch):
    from bench import edge

    sides = {
        "raw_llama_cpp": lambda p: iter(["a", "b", "c"]),
        "sdk_llama_cpp": lambda p: iter(["abc"]),  # one piece: no decode time, no rate
        "raw_onnx": lambda p: iter(["a", "b"]),
        "sdk_onnx": lambda p: iter([]),  # empty answers: no TTFT either
    }
    monkeypatch.setattr(edge, "_sides", lambda *a: (sides, []))
    out = edge.run_model("m", ["llama_cpp", "onnx"], rounds=1, max_tokens=4, threads=1)
    assert out["sdk_llama_cpp"]["decode_tokens_per_s"] is None  # was 0.0
    assert out["sdk_overhead_llama_cpp"] is None  # was 1.0: "the SDK costs all of the speed"
    assert out["sdk_overhead_onnx"] is None
    assert out["onnx_over_llama_cpp"] == {"decode_tps_ratio": None, "ttft_ratio": None}  # was a TypeError
    assert out["raw_llama_cpp"]["decode_tokens_per_s"] > 0
    json.dumps(out, allow_nan=False)


def test_hybrid_token_ratio_is_null_when_cloud_only_used_no_tokens(monkeypatch, tmp_path, capsys):
    # a cloud that reports no usage: max(0, 1) made the hybrid use "0%" of cloud-only's tokens
    import hybridllm
    import hybridllm.demo
    import hybridllm.router
    import hybridllm.router.calibrate
    from bench import hybrid

    class LLM:
        def __init__(self, cache_path, **kw):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def chat(self, prompt, route="cloud", **options):
            return SimpleNamespace(latency_ms=10.0, route=route, usage=SimpleNamespace(total_tokens=0))

    work = tmp_path / "work"
    monkeypatch.setattr(hybrid, "DATA", tmp_path)
    monkeypatch.setattr(hybrid, "workload", lambda n: ["q1", "q2"])
    monkeypatch.setattr(hybrid.tempfile, "mkdtemp", lambda prefix="": (work.mkdir(), str(work))[1])
    monkeypatch.setattr(hybridllm.demo, "_free_port", lambda: 1)
    monkeypatch.setattr(hybridllm.demo, "_start_cloud",
                        lambda port, log: SimpleNamespace(kill=lambda: None, wait=lambda timeout: 0))
    monkeypatch.setattr(hybridllm.router, "load_router", lambda: SimpleNamespace(score=len))
    monkeypatch.setattr(hybridllm.router.calibrate, "calibrate_threshold", lambda scores, f: 0.5)
    monkeypatch.setattr(hybridllm, "HybridLLM", LLM)
    hybrid.main(["--json", "--n", "2"])
    out = json.loads(capsys.readouterr().out)
    assert out["cloud_only"]["cloud_tokens"] == 0
    assert out["cloud_tokens_ratio_hybrid_over_cloud_only"] is None
    assert out["mean_latency_ratio_hybrid_over_cloud_only"] == 1.0


def test_hybrid_ratio():
    from bench import hybrid

    assert hybrid._ratio(5300, 18496) == 0.287 and hybrid._ratio(0, 0) is None
