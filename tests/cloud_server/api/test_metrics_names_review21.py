"""/metrics as a Prometheus user scrapes it: a valid exposition, and every series it can export
named in README.md, with the vLLM names mapped where both measure the same thing."""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from cloud_server.api import metrics as metrics_module
from cloud_server.api.metrics import ServerMetrics
from cloud_server.energy import EnergyAccounting, EnergyMeter
from cloud_server.energy_sources import EstimateSource

README = Path(__file__).resolve().parents[3] / "README.md"
WEIRD_MODEL = 'org/m"odel\\v1\nx'  # --served-model-name may carry a quote, a backslash, a newline


def _every_series_text() -> str:
    """An exposition with every engine series, one finished request and its energy."""
    stats: dict = {key: 3 for key in metrics_module._ENGINE_SERIES}
    stats["kv_cache_usage"] = 0.25
    for key in metrics_module._ENGINE_LIST_SERIES:
        stats[key] = [2, 1]
    m = ServerMetrics(lambda: stats, lambda: WEIRD_MODEL)
    m.energy = EnergyAccounting(EnergyMeter(EstimateSource(10.0)), m.registry, lambda: WEIRD_MODEL)
    key = m.energy.start()
    timer = m.request_timer()
    timer.on_tokens(1, 5)
    timer.on_tokens(2, 5)
    timer.on_finish("stop")
    m.energy.finish(key, SimpleNamespace(num_output_tokens=3))
    m.record_rejection(429)
    return m.render().decode()


def _exported_names() -> set[str]:
    """The names a user queries: a counter's with ``_total``, the others' as their family's."""
    names = set()
    for family in text_string_to_metric_families(_every_series_text()):
        if family.name.endswith("_created"):
            continue
        names.add(family.name + "_total" if family.type == "counter" else family.name)
    return names


def test_every_exported_series_is_named_in_the_readme():
    """Before: README named none of kv_cache_usage_ratio, engine_steps, batch_num_*, ... and gave
    no mapping to vLLM's names (model vs model_name, request_success vs requests_finished)."""
    readme = README.read_text(encoding="utf-8")
    missing = sorted(name for name in _exported_names() if f"`{name}" not in readme)
    assert not missing, f"series exported by /metrics but not named in README.md: {missing}"


def test_the_readmes_vllm_mapping_names_only_series_that_exist():
    readme = README.read_text(encoding="utf-8")
    rows = [line for line in readme.splitlines()
            if line.startswith("| `hybridllm_") and "`vllm:" in line]
    assert len(rows) >= 8, "README.md's table of hybridllm and vLLM metric names is missing"
    exported = _exported_names()
    for row in rows:
        ours = row.split("|")[1]
        for name in re.findall(r"`(hybridllm_\w+)", ours):
            assert name in exported, f"README maps {name}, which /metrics does not export"


def test_the_exposition_is_valid_with_a_model_name_that_needs_escaping():
    """A guard for the scrape format: each family's HELP and TYPE once, counters ending in _total,
    cumulative buckets ending at +Inf with _sum and _count, no NaN, the label value intact."""
    text = _every_series_text()
    helps = re.findall(r"^# HELP (\S+)", text, flags=re.M)
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)", text, flags=re.M))
    assert len(helps) == len(set(helps)) == len(types)
    assert all(name.endswith("_total") for name, kind in types.items() if kind == "counter")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert sample.labels.get("model") == WEIRD_MODEL
            assert math.isfinite(sample.value)
        if family.type != "histogram":
            continue
        buckets = [s for s in family.samples if s.name.endswith("_bucket")]
        assert buckets[-1].labels["le"] == "+Inf"
        counts = [s.value for s in buckets]
        assert counts == sorted(counts)
        (count,) = [s.value for s in family.samples if s.name.endswith("_count")]
        assert count == counts[-1]
        assert any(s.name.endswith("_sum") for s in family.samples)
