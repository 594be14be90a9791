"""A client used in a forked child process says so at once, and a child's exit is not held up (review 40).

A fork copies only the thread that forked: the sync client's loop thread and the device worker are
not in the child. There a ``chat()`` waited for ever for the loop thread (an app with a module-level
client and a fork-based multiprocessing Pool or a preloading gunicorn hung in every worker), and a
child that exited normally waited 50 s in the atexit close for the threads that were not there
(20 s draining the loop, 30 s for its pool). Now the call raises ``HybridLLMError`` naming the fork
and what to do, and a child's close() (at exit too) returns at once, leaving the parent's parts
(model, cache database, connections) to the parent.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only"),
    # Python 3.12+ warns that a fork of a process with threads may deadlock: forking one is the point
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


# Each test forks inside a fresh interpreter, never the pytest process: forked, that one would carry
# whatever threads earlier tests left running, and a lock one of them held would hang the child.
FORK_HARNESS = textwrap.dedent("""
    import asyncio, os, signal, sys, time
    from hybridllm import AsyncHybridLLM, HybridLLM, HybridLLMError
    from hybridllm.backends.fake import FakeBackend

    def in_child(body):
        start = time.monotonic()
        pid = os.fork()
        if pid == 0:
            signal.alarm(20)  # a child that hangs (the defect) ends, not left behind as an orphan
            code = 3
            try:
                code = body()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(f"CHILD {os.waitstatus_to_exitcode(status)} {time.monotonic() - start:.2f}", flush=True)
""")


def _child_result(script: str) -> tuple[int, float, str]:
    """Run ``script`` (after the harness) in a fresh interpreter; the child's exit status, how long
    it took, and the parent's output."""
    run = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", FORK_HARNESS + textwrap.dedent(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    code, took = run.stdout.split("CHILD ")[1].split()[:2]
    return int(code), float(took), run.stdout


def test_sync_chat_in_a_forked_child_raises_at_once() -> None:
    code, took, out = _child_result("""
        llm = HybridLLM(edge=FakeBackend(), cache=False)
        assert llm.chat("hi").text == "echo: hi"  # the loop thread and the device worker run

        def body():
            try:
                llm.chat("hi")
            except HybridLLMError as exc:
                said = str(exc)
                ok = "fork" in said and "'spawn'" in said
                llm.close()  # returns at once in the child
                return 0 if ok else 4
            return 5

        in_child(body)
        print("PARENT", llm.chat("again").text)  # the parent's client is untouched
        llm.close()
    """)
    assert code == 0, f"child exit status {code}"
    assert took < 10
    assert "PARENT echo: again" in out


def test_sync_stream_in_a_forked_child_raises_at_once() -> None:
    code, _, _ = _child_result("""
        llm = HybridLLM(edge=FakeBackend(), cache=False)
        llm.chat("warm")

        def body():
            try:
                list(llm.stream("hi"))
            except HybridLLMError as exc:
                return 0 if "fork" in str(exc) else 4
            return 5

        in_child(body)
        llm.close()
    """)
    assert code == 0, f"child exit status {code}"


def test_async_chat_in_a_forked_child_raises_at_once() -> None:
    # before: it waited out edge_wait_timeout_s for a worker thread that is not in the child, then
    # said the device was busy
    code, took, _ = _child_result("""
        llm = AsyncHybridLLM(edge=FakeBackend(), cache=False, edge_wait_timeout_s=30)
        assert asyncio.run(llm.chat("hi")).text == "echo: hi"  # the device worker runs

        def body():
            try:
                asyncio.run(llm.chat("hi"))
            except HybridLLMError as exc:
                asyncio.run(llm.aclose())  # returns at once in the child
                return 0 if "fork" in str(exc) else 4
            return 5

        in_child(body)
        asyncio.run(llm.aclose())
    """)
    assert code == 0, f"child exit status {code}"
    assert took < 10


CHILD_EXIT = textwrap.dedent("""
    import os, sys, time
    from hybridllm import HybridLLM
    from hybridllm.backends.fake import FakeBackend

    llm = HybridLLM(edge=FakeBackend(), cache=False)
    llm.chat("hi")
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # a normal exit: the atexit handlers close the client still open
    os.waitpid(pid, 0)
    print(f"CHILD_EXIT_S {time.monotonic() - start:.2f}")
    llm.close()
""")


def test_a_forked_child_exits_without_waiting_for_the_parents_threads() -> None:
    run = subprocess.run(
        [sys.executable, "-c", CHILD_EXIT], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    took = float(run.stdout.split("CHILD_EXIT_S")[1].split()[0])
    assert took < 5, f"the forked child took {took} s to exit"


CHILD_OF_A_THREAD = textwrap.dedent("""
    import asyncio, os, threading, time
    from hybridllm import AsyncHybridLLM, HybridLLM
    from hybridllm.backends.fake import FakeBackend

    llm = HybridLLM(edge=FakeBackend(reply=lambda m: " ".join(["w"] * 400), delay_s=0.01), cache=False)
    view = AsyncHybridLLM.wrap(llm)

    def fork_and_close():
        pid = os.fork()
        if pid == 0:  # the child: only this thread; the main thread's loop is a copy that runs nowhere
            start = time.monotonic()
            llm.close()
            os._exit(0 if time.monotonic() - start < 5 else 1)
        _, status = os.waitpid(pid, 0)
        print(f"CHILD_STATUS {os.waitstatus_to_exitcode(status)}")

    async def main():
        async with view.stream("hi") as s:  # a view's answer being read on this loop
            await anext(s)
            forker = threading.Thread(target=fork_and_close)
            forker.start()
            while forker.is_alive():
                await asyncio.sleep(0.05)

    asyncio.run(main())
    llm.close()
""")


def test_close_in_a_child_forked_beside_a_running_view_does_not_wait_for_it() -> None:
    # the view's loop ran in the parent's main thread: its copy in the child looks running, and
    # close() waited VIEW_STOP_WAIT_S (10 s) for a stop that no thread there could run
    run = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", CHILD_OF_A_THREAD],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "CHILD_STATUS 0" in run.stdout, run.stdout + run.stderr[-2000:]


REAL_CHILD = textwrap.dedent("""
    import os, sys, time
    from hybridllm import HybridLLM, HybridLLMError

    llm = HybridLLM(cache=False)  # the default device model, SmolLM2-135M on llama.cpp
    llm.chat("hi", max_tokens=2)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            llm.chat("hi", max_tokens=2)
        except HybridLLMError as exc:
            sys.exit(0 if "fork" in str(exc) else 4)  # a normal exit: atexit closes the client
        sys.exit(5)
    _, status = os.waitpid(pid, 0)
    print(f"CHILD {os.waitstatus_to_exitcode(status)} {time.monotonic() - start:.2f}")
    print("PARENT", llm.chat("hi", max_tokens=2).route)
    llm.close()
""")


@pytest.mark.real
def test_a_forked_child_of_a_real_device_client_is_refused_and_exits_at_once(smollm2_path) -> None:
    run = subprocess.run(
        [sys.executable, "-c", REAL_CHILD], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert run.returncode == 0, run.stderr[-2000:]
    _, code, took = run.stdout.split("CHILD")[1].split("\n")[0].split(" ")
    assert code == "0" and float(took) < 5, run.stdout
    assert "PARENT edge" in run.stdout  # the parent's model still answers
