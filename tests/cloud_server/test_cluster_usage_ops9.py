"""Cluster options that do not fit are usage errors, as every other bad option: exit status 2, one
line ``hybridllm-cloud: error: ... (see hybridllm-cloud serve --help)``, before Ray is imported.

Before, ``--min-replicas`` without ``--replicas``, ``--replace`` without ``--ray-address``,
``--min-replicas`` above ``--max-replicas`` and the like exited 1 as if the cluster had failed, and
a ``--ray-address`` that is no address at all (``http://head:8265``, the dashboard's) went to Ray.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Fails the run if Ray is imported: every check here comes before Ray is.
NO_RAY = ("import sys; sys.modules['ray'] = None; from cloud_server.__main__ import main; "
          "sys.exit(main(sys.argv[1:]))")


@pytest.fixture
def model(tmp_path: Path) -> str:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")  # an existing file: never loaded here
    return str(path)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        (["--min-replicas", "1"], "go with --replicas N"),
        (["--ray-address", "auto"], "go with --replicas N"),
        (["--replicas", "2", "--upscale-delay-s", "3"], "tune autoscaling"),
        (["--replicas", "1", "--replace"], "--replace goes with --ray-address"),
        (["--replicas", "4", "--min-replicas", "3", "--max-replicas", "2"], "above --max-replicas"),
        (["--replicas", "5", "--max-replicas", "4"], "--replicas 5 must lie within"),
        (["--replicas", "1", "--ray-address", "http://head:8265"], "'http://head:8265' is not an address"),
        (["--replicas", "1", "--ray-address", "head"], "HOST:PORT"),
        (["--replicas", "1", "--ray-address", "head:70000"], "HOST:PORT"),
        (["--replicas", "1", "--port", "0"], "explicit --port"),
        (["--replicas", "1", "--shutdown-timeout", "3"], "single-process server"),
    ],
)
def test_cluster_option_combinations_are_usage_errors(model: str, options: list[str], fragment: str) -> None:
    proc = subprocess.run([sys.executable, "-c", NO_RAY, "serve", "--model", model, *options],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("hybridllm-cloud: error:"), proc.stderr
    assert fragment in lines[0] and lines[0].endswith("(see hybridllm-cloud serve --help)"), lines[0]


@pytest.mark.parametrize("address", ["auto", "10.0.0.5:6379", "ray://head.example:10001", "[::1]:6379"])
def test_ray_addresses_pass_the_check(address: str) -> None:
    from cloud_server.cli_settings import _check_ray_address

    _check_ray_address(address)  # no UsageError


def test_an_abbreviated_option_is_refused_with_its_whole_name() -> None:
    """argparse took ``--mod`` for ``--model``; now it is refused, one line, exit 2, naming the
    whole option (the same parser as the hybridllm command's: hybridllm._cli_options)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "cloud_server", "serve", "--mod", "x"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hybridllm-cloud: error: unrecognized arguments: --mod")
    assert "options take their whole name: --model" in lines[0]
