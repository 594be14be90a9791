"""llama.cpp in a forked child of a process that decoded on several threads (review 40).

llama.cpp's CPU backend runs a decode's threads in an OpenMP pool made at the first multi-threaded
decode; a fork copies the pool's bookkeeping but not its threads, so the child's first decode on
more than one thread waited for ever (a new backend's, or one the child inherited). Now the child's
model runs on one thread and says why. Each case forks inside a fresh interpreter, never the pytest
process, and the child ends itself (SIGALRM) if it hangs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="os.fork is POSIX-only"),
]

SCRIPT = textwrap.dedent("""
    import logging, os, signal, sys
    from hybridllm import GenerationParams
    from hybridllm.backends.llama_cpp import LlamaCppBackend

    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="LOG %(message)s")
    path, inherit = sys.argv[1], sys.argv[2] == "inherit"
    params = GenerationParams(max_tokens=4, temperature=0.0)
    msgs = [{"role": "user", "content": "hi"}]
    parent = LlamaCppBackend(path, n_threads=2)
    print("PARENT", len(list(parent._run(parent.tokenize(msgs), params, ()))), flush=True)
    pid = os.fork()
    if pid == 0:
        signal.alarm(30)  # the defect: the child's decode never returned
        b = parent if inherit else LlamaCppBackend(path, n_threads=2)
        out = list(b._run(b.tokenize(msgs), params, ()))
        print("CHILD", len(out), b.n_threads, flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("STATUS", os.waitstatus_to_exitcode(status), flush=True)
    print("PARENT AGAIN", len(list(parent._run(parent.tokenize(msgs), params, ()))), parent.n_threads)
    parent.close()
""")


@pytest.mark.parametrize("which", ["new", "inherit"])
def test_a_child_of_a_process_that_decoded_on_threads_answers_on_one(smollm2_path, which: str) -> None:
    run = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", SCRIPT, str(smollm2_path), which],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = run.stdout
    assert run.returncode == 0, out + run.stderr[-2000:]
    assert "STATUS 0" in out, out  # -14: the child hung until its alarm
    child = next(line for line in out.splitlines() if line.startswith("CHILD"))
    assert child.split()[2] == "1", child  # one thread in the child
    assert out.count("is a fork") == 1, out  # said once, naming the fork
    assert "'spawn'" in out
    assert out.rstrip().endswith(" 2"), out  # the parent keeps its threads
