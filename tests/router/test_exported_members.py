"""The public API of hybridllm.router is pinned: changing it must be a decision."""

from __future__ import annotations

import hybridllm.router as router


def test_all():
    assert sorted(router.__all__) == [
        "Budget", "Decision", "PII_KINDS", "Router", "RoutingPolicy", "detect_pii",
        "load_router", "redact_pii",
    ]
    for name in router.__all__:
        assert getattr(router, name) is not None


def test_import_is_light():
    import subprocess
    import sys

    code = ("import sys, hybridllm.router; heavy = [m for m in ('sklearn', 'onnxruntime', "
            "'llama_cpp', 'httpx', 'matplotlib') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
