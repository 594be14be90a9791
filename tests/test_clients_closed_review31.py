"""The test modules that left ``HybridLLM`` clients open now close them (review 31).

Their tests made clients and left them open. A client sits in a reference cycle, so it was
collected by some later test's garbage collection in the same xdist worker, and its
"garbage-collected without close()" ResourceWarning surfaced there (under warnings as errors:
``test_embedding_app.py::test_a_closed_client_does_not_warn_when_collected``). Found by collecting
garbage after each test of the fast suite; the modules now use ``tests._open_clients``' autouse
fixture. Here they run in a child pytest that collects garbage after each test and names a test
whose clients were left open.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = ["tests/router/test_budget_concurrency.py", "tests/test_context_window.py",
           "tests/test_pii_restore.py", "tests/test_pipeline.py", "tests/test_pipeline_review14b.py"]

PLUGIN = textwrap.dedent('''
    import gc
    import warnings

    import pytest

    @pytest.hookimpl(hookwrapper=True, trylast=True)
    def pytest_runtest_teardown(item, nextitem):
        yield
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gc.collect()
        left = [w for w in caught if "garbage-collected without" in str(w.message)]
        if left:
            print(f"LEFT OPEN: {item.nodeid} ({len(left)})")
''')


def test_these_modules_leave_no_client_open(tmp_path: Path) -> None:
    (tmp_path / "leftopen_plugin.py").write_text(PLUGIN, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-m", "not real", "-n", "0", "-p", "no:randomly",
         "-p", "no:cacheprovider", "-p", "leftopen_plugin", *MODULES],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout
    left = [line.strip(".") for line in run.stdout.splitlines() if "LEFT OPEN" in line]
    assert left == [], "\n".join(left)
