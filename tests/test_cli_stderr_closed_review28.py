"""The `hybridllm` command started with stderr closed (`2>&-`) (review 28): Python then has no
sys.stderr and print(file=None) writes to stdout, so an error line went into the command's result
(`hybridllm models path nope 2>&- > f` wrote "error: Unknown model ..." into f). Now such lines are
dropped, as with `2>/dev/null`, and the exit status still says what happened."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.skipif(sys.platform == "win32", reason="a POSIX shell closes the descriptor")
@pytest.mark.parametrize("argv, status", [
    ("models path no-such-model", 1),  # an error
    ("models verify no-such-model --bad", 2),  # a usage error: argparse's own line
    ("models pull", 2),
])
def test_nothing_meant_for_stderr_reaches_stdout(tmp_path, argv, status):
    done = subprocess.run(
        ["sh", "-c", f'exec 2>&-; exec "$0" -m hybridllm {argv}', sys.executable],
        stdout=subprocess.PIPE, timeout=120, env={"HYBRIDLLM_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert (done.returncode, done.stdout) == (status, b"")
