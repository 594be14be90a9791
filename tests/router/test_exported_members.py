"""The public API of hybridllm.router is pinned: changing it must be a decision."""

from __future__ import annotations

import hybridllm.router as router


def test_all():
    assert sorted(router.__all__) == [
        "Budget", "Decision", "PII_KINDS", "Router", "RoutingPolicy", "detect_pii",
        "load_router", "redact_pii",
    ]
    import types

    # every public name of the package is in __all__ (a stray import or a dropped name fails)
    public = {n for n in dir(router) if not n.startswith("_") and n != "annotations"
              and not isinstance(getattr(router, n), types.ModuleType)}
    assert public == set(router.__all__), public ^ set(router.__all__)
    from hybridllm import Decision

    assert router.Decision is Decision  # one Decision, shared with the client


def test_import_is_light():
    import subprocess
    import sys

    code = ("import sys, hybridllm.router; heavy = [m for m in ('sklearn', 'onnxruntime', "
            "'llama_cpp', 'httpx', 'matplotlib') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
