"""``python -m cloud_server`` loads cloud_server/__main__.py once (review 30).

Before: run as ``__main__``, the file handed over to ``hybridllm.cli.cloud_main``, which imported
it again by name as ``cloud_server.__main__``: two copies of the module, each with its own
globals (a setting patched in one was not seen by the other). Now the shared entry
(``cloud_server/_entry.py``) checks the [server] extra and the file runs its own ``main()``;
``hybridllm-cloud`` (``cloud_main``) goes through the same entry and imports the file once, by
name. Counted in a subprocess: every execution of the file's code (an audit hook on ``exec``) and
what ``sys.modules`` holds at exit. The line without the extra is test_cloud_module_extra_review29's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAIN = str(ROOT / "cloud_server" / "__main__.py")

# a sitecustomize that counts how often the file's module code is executed, and says at exit
# which modules hold it
PROBE = f"""
import atexit, json, sys

runs = []

def hook(event, args):
    if event == "exec" and getattr(args[0], "co_filename", None) == {MAIN!r} \\
            and args[0].co_name == "<module>":
        runs.append(1)

sys.addaudithook(hook)

@atexit.register
def report():
    named = [name for name, m in list(sys.modules.items())
             if getattr(m, "__file__", None) == {MAIN!r}]
    print("PROBE " + json.dumps({{"runs": len(runs), "modules": sorted(named)}}), file=sys.stderr)
"""


def _run(tmp_path: Path, *command: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(PROBE, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(site), "HYBRIDLLM_HOME": str(tmp_path / "home")}
    env.pop("HYBRIDLLM_DEBUG", None)
    done = subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.startswith("PROBE ")]
    assert len(lines) == 1, done.stderr
    return done, json.loads(lines[0][len("PROBE "):])


def test_python_m_cloud_server_help_loads_its_file_once(tmp_path) -> None:
    done, probe = _run(tmp_path, "-m", "cloud_server", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: hybridllm-cloud") and "serve" in done.stdout
    assert probe == {"runs": 1, "modules": ["__main__"]}, probe  # before: 2 runs, and cloud_server.__main__


def test_a_usage_error_under_python_m_is_the_commands_own(tmp_path) -> None:
    """The file's own main() runs it: a usage error is exit 2 with the command's one line."""
    done, probe = _run(tmp_path, "-m", "cloud_server", "serve", "--port", "1")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("hybridllm-cloud: error:") and "--model" in done.stderr
    assert "Traceback" not in done.stderr
    assert probe["runs"] == 1, probe


def test_the_hybridllm_cloud_command_loads_it_once_by_name(tmp_path) -> None:
    script = "import sys; from hybridllm.cli import cloud_main; sys.argv[0] = 'hybridllm-cloud'; " \
             "sys.exit(cloud_main())"
    done, probe = _run(tmp_path, "-c", script, "--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: hybridllm-cloud"), done.stderr
    assert probe == {"runs": 1, "modules": ["cloud_server.__main__"]}, probe
