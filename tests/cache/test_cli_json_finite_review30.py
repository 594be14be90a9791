"""``hybridllm cache stats --json`` and ``cache eval --json`` print strict JSON.

``cache_ttl_s`` accepts inf (no bound): ``cache stats --json`` printed ``"ttl_s": Infinity``, which
strict JSON parsers (``jq``, JavaScript's ``JSON.parse``) refuse. It is null now, as ``config show``
prints it; a non-finite metric from ``cache eval`` likewise.
"""

from __future__ import annotations

import json
import math

from hybridllm import cli


def _strict(text: str):
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_stats_with_an_unbounded_ttl_is_strict_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HYBRIDLLM_CACHE_TTL_S", "inf")
    monkeypatch.setenv("HYBRIDLLM_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HYBRIDLLM_CACHE_DIR", str(tmp_path / "cache"))  # no cache file yet
    assert cli.main(["cache", "stats", "--json"]) == 0
    out = _strict(capsys.readouterr().out)
    assert out["ttl_s"] is None and out["entries"] == 0


def test_eval_with_a_non_finite_metric_is_strict_json(tmp_path, monkeypatch, capsys):
    from hybridllm.cache import evaluate

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("")
    monkeypatch.setattr(evaluate, "load_pairs", lambda path, limit=None: object())
    monkeypatch.setattr(evaluate, "evaluate_pairs",
                        lambda pairs, verifier=None, progress=None: {"precision": math.nan, "n": 1})
    assert cli.main(["cache", "eval", "--pairs", str(pairs), "--json"]) == 0
    assert _strict(capsys.readouterr().out) == {"precision": None, "n": 1}
