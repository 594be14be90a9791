"""A llama.cpp load leaves the process's stdout and stderr alone: what other threads write while a
model loads (a server's log lines, an app's own output) is all there, in order.

llama-cpp-python's quiet load (``verbose=False``) pointed file descriptors 1 and 2, and
``sys.stdout``/``sys.stderr``, at /dev/null for the whole process while llama.cpp read the model,
and the cloud tokenizer swapped ``sys.stderr`` for a buffer around its vocabulary-only load.
`hybridllm-cloud serve` lost its "shut down while the model was loading" line that way: a SIGTERM
during the tokenizer's load, then ``os._exit`` before the descriptors came back (CI, 2026-12-04).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

import pytest

pytestmark = pytest.mark.real


def _write_around(load: Callable[[], object]) -> int:
    """Run ``load`` while another thread writes numbered lines to stderr every millisecond, from
    before the load starts to after it ends: odd ones to descriptor 2, even ones through
    ``sys.stderr``. The number of lines written."""
    stop, first = threading.Event(), threading.Event()
    count = 0

    def writer() -> None:
        nonlocal count
        while not stop.is_set():
            line = f"line {count}\n"
            if count % 2:
                os.write(2, line.encode())
            else:
                print(line, end="", file=sys.stderr, flush=True)
            count += 1
            first.set()
            time.sleep(0.001)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert first.wait(5)
        load()
        time.sleep(0.01)  # a few lines after the load too
    finally:
        stop.set()
        thread.join(5)
    return count


def _written(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("line ")]


def test_an_edge_model_load_loses_no_line_of_another_thread(smollm2_path, capfd):
    from hybridllm.backends.llama_cpp import LlamaCppBackend

    loaded = []
    count = _write_around(lambda: loaded.append(LlamaCppBackend(str(smollm2_path), n_ctx=256, n_threads=1)))
    assert loaded
    assert _written(capfd.readouterr().err) == [f"line {i}" for i in range(count)]


def test_the_cloud_tokenizer_load_loses_no_line_and_prints_no_warning(smollm2_path, capfd):
    from cloud_server.models.tokenizer import GGUFTokenizer

    count = _write_around(lambda: GGUFTokenizer(smollm2_path))
    err = capfd.readouterr().err
    assert _written(err) == [f"line {i}" for i in range(count)]
    # a vocabulary-only load has no training context: llama.cpp's warning of it stays off stderr
    assert "training context overflow" not in err, err
    assert [line for line in err.splitlines() if not line.startswith("line ")] == [], err


def test_a_vocabulary_llama_cpp_cannot_read_is_a_load_error(tmp_path):
    from cloud_server.exceptions import ModelLoadError
    from cloud_server.models.tokenizer import GGUFTokenizer

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ModelLoadError, match="cannot read the vocabulary of"):
        GGUFTokenizer(bad)
