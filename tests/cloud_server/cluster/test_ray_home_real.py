"""The suite's local Ray clusters leave nothing in the user's home (review26).

In a ``_real`` module: a local Ray, run with the suite's other Ray modules, never beside them.

Ray 2.60's local ``ray.init()`` turns token authentication on and, when no token is given, writes
one to ``~/.ray/auth_token``; from then on the user's own ``ray start`` finds it and runs with token
auth as well. The suite's conftest gives its sessions a token in the environment instead. This
starts a real local Ray, with an empty HOME, under the suite's environment, and checks that Ray
took that token and wrote no file.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("ray")

_SCRIPT = """
import os, ray
ray.init(num_cpus=1, include_dashboard=False, configure_logging=False)
ray.shutdown()
print("mode", os.environ.get("RAY_AUTH_MODE"))
"""


@pytest.mark.real
def test_a_local_ray_in_the_suite_writes_no_token_into_home(tmp_path):
    assert len(os.environ.get("RAY_AUTH_TOKEN", "")) >= 32 or os.environ.get("RAY_AUTH_MODE") \
        or os.environ.get("RAY_AUTH_TOKEN_PATH"), "the conftest gives the session a token"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a new local Ray, not one to join
    env.update(HOME=str(tmp_path), RAY_USAGE_STATS_ENABLED="0")
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                         timeout=180, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert not (tmp_path / ".ray" / "auth_token").exists(), out.stderr[-3000:]
